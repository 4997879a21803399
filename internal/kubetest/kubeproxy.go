package kubetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/kubecluster"
)

// StartKubeProxy runs the real kube-proxy (the control plane's release,
// in mode iptables or nftables) in the network namespace netns as the Node
// node, with pods in clusterCIDR; the returned function stops it (by PID)
// and waits for it. The namespace must reach the API server (RelayInto).
func (c *Cluster) StartKubeProxy(t testing.TB, netns, node, mode, clusterCIDR string) func() {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kube-proxy.kubeconfig")
	if err := kubecluster.IssueKubeconfig(c.Dir, kc, "system:kube-proxy"); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(t.TempDir(), "kube-proxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	// The conntrack flags at 0: kube-proxy leaves the machine-wide
	// conntrack sysctls alone.
	cmd := exec.Command("ip", "netns", "exec", netns, filepath.Join(c.BinDir, "kube-proxy"),
		"--kubeconfig", kc, "--hostname-override", node, "--proxy-mode", mode, "--cluster-cidr", clusterCIDR,
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256",
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	stop := func() {
		select {
		case <-done:
			return
		default:
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
			t.Logf("kube-proxy's log:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
		}
		log.Close()
	})
	return stop
}
