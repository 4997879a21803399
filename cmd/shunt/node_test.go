package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/kubeproxy"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podnet"
)

// TestNodeCheck: in a network namespace of its own, `shunt node check`
// says kube-proxy translates Services while kube-proxy's iptables entry
// chain is there (written with iptables, as kube-proxy writes it), and that
// nothing does once they are removed (exit 1); it names the node's first
// CNI configuration and its plugins.
func TestNodeCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and netfilter")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("iptables is not installed: run scripts/setup.sh")
	}
	ns := fmt.Sprintf("nodechk%05x", rand.IntN(1<<20))
	if err := podnet.CreateNetns(ns, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { podnet.DeleteNetns(ns) })
	for _, args := range [][]string{{"-t", "nat", "-N", "KUBE-SERVICES"}, {"-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"}} {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "iptables"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v\n%s", args, err, out)
		}
	}
	confDir := t.TempDir()
	os.WriteFile(filepath.Join(confDir, "10-flannel.conflist"), []byte(`{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"flannel"},{"type":"portmap"}]}`), 0o644)
	os.WriteFile(filepath.Join(confDir, "20-shunt.conflist"), []byte(`{"cniVersion":"1.1.0","name":"shunt","plugins":[{"type":"shunt-cni"}]}`), 0o644)

	check := func() (nodeCheck, error) {
		var out bytes.Buffer
		var runErr error
		err := netnsrun.Do(podnet.NetnsPath(ns), func() error {
			root := newRootCmd()
			// An instance no agent runs as.
			root.SetArgs([]string{"--instance", "nochk" + fmt.Sprint(rand.IntN(1000)), "node", "check", "--cni-conf-dir", confDir, "-o", "json"})
			root.SetOut(&out)
			runErr = root.Execute()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var c nodeCheck
		if err := json.Unmarshal(out.Bytes(), &c); err != nil {
			t.Fatalf("node check -o json printed %q: %v", out.String(), err)
		}
		return c, runErr
	}
	c, err := check()
	if err != nil || !c.KubeProxyLive || c.Agent || !strings.HasPrefix(c.Verdict, "kube-proxy translates") || !strings.Contains(c.KubeProxy, "ip nat KUBE-SERVICES") {
		t.Errorf("with kube-proxy's chain: %+v (%v), want kube-proxy translating, exit 0", c, err)
	}
	if c.CNI != filepath.Join(confDir, "10-flannel.conflist") || c.CNIPlugins != "flannel, portmap" {
		t.Errorf("CNI %q (%s): want the first configuration, flannel's", c.CNI, c.CNIPlugins)
	}
	if err := netnsrun.Do(podnet.NetnsPath(ns), kubeproxy.Remove); err != nil {
		t.Fatal(err)
	}
	c, err = check()
	if ee, ok := err.(exitError); !ok || ee.code != 1 || c.KubeProxyLive || !strings.HasPrefix(c.Verdict, "nothing translates") {
		t.Errorf("after removal: %+v (%v), want nothing translating, exit 1", c, err)
	}
}
