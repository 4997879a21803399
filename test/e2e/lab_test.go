// Package e2e runs shunt end to end: real binaries, a real lab of pods
// (network namespaces + cgroups), real traffic. It needs root and a BPF
// capable kernel; without root every test skips with the reason.
package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/kubetest"
	"github.com/shuntnet/shunt/internal/procstat"
)

var binDir string // where TestMain built shunt and shuntd

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("e2e: skipping: needs root (network namespaces, BPF, cgroups)")
		os.Exit(m.Run())
	}
	// SHUNT_E2E_BIN: binaries built already (make build's bin/), for a
	// machine where building is slow or impossible: an emulated older
	// kernel (scripts/kernel-vm.sh), where the Go toolchain runs ten
	// times slower.
	if dir := os.Getenv("SHUNT_E2E_BIN"); dir != "" {
		binDir = dir
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "shunt-e2e-bin-")
	if err != nil {
		panic(err)
	}
	build := exec.Command("go", "build", "-o", dir+"/", "../../cmd/shunt", "../../cmd/shuntd", "../../cmd/shunt-proxy", "../../cmd/shunt-cni")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Println("e2e: building binaries:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// lab is one shunt instance created by a test and removed after it.
type lab struct {
	t           *testing.T
	instance    string
	cidr        string
	serviceCIDR string
	// kube: the objects come from this API server (newKubeLab); nil: from
	// the lab's own control plane.
	kube *kubetest.Cluster
	// netns: the node's host side is this network namespace (the agent
	// and every CLI call run in it); "": the machine's.
	netns string
	// bin: the directory of the shunt binaries the CLI calls (and `lab
	// up` starts the agent from); "": binDir, this tree's.
	bin string
}

// labOctet: the second octet of a lab's pod CIDR, 10.200-249 without
// 10.211-225, the benchmarks' fixed ranges: make test runs every benchmark in
// smoke mode (bench/smoke_test.go) while this package runs, and two labs
// whose pod CIDRs overlap fight over the host's routes.
func labOctet() int {
	o := 200 + rand.IntN(35)
	if o >= 211 {
		o += 15
	}
	return o
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// newLab starts an instance with a unique name and pod CIDR; cleanup removes
// it and checks that nothing of it is left, also when the test failed.
func newLab(t *testing.T, mode string, manifests ...string) *lab {
	t.Helper()
	return newLabWith(t, []string{"--mode", mode}, manifests...)
}

// newLabWith starts a lab with extra `lab up` flags.
func newLabWith(t *testing.T, flags []string, manifests ...string) *lab {
	t.Helper()
	return newLabIn(t, "", flags, manifests...)
}

// newLabIn starts a lab whose node is the network namespace netns ("":
// the machine's), as each node of a multi-node lab is.
func newLabIn(t *testing.T, netns string, flags []string, manifests ...string) *lab {
	t.Helper()
	return newLabOf(t, binDir, netns, flags, manifests...)
}

// newLabOf starts a lab with the shunt binaries in bin (another build's:
// the upgrade tests).
func newLabOf(t *testing.T, bin, netns string, flags []string, manifests ...string) *lab {
	t.Helper()
	requireRoot(t)
	l := &lab{
		t:        t,
		instance: fmt.Sprintf("e2e%06d", rand.IntN(1000000)),
		cidr:     fmt.Sprintf("10.%d.%d.0/24", labOctet(), rand.IntN(250)),
		netns:    netns,
		bin:      bin,
	}
	l.serviceCIDR = fmt.Sprintf("10.%d.%d.0/24", 100+rand.IntN(50), rand.IntN(250))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", readFile("/var/lib/shunt/"+l.instance+"/shuntd.log"))
		}
		l.shunt("lab", "down")
		l.assertGone()
	})
	args := append([]string{"lab", "up", "--pod-cidr", l.cidr, "--service-cidr", l.serviceCIDR}, flags...)
	for _, m := range manifests {
		args = append(args, "-f", m)
	}
	l.mustShunt(args...)
	return l
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// shunt runs the CLI against this lab and returns output and exit code.
func (l *lab) shunt(args ...string) (string, int) {
	bin := l.bin
	if bin == "" {
		bin = binDir
	}
	argv := append([]string{filepath.Join(bin, "shunt"), "--instance", l.instance}, args...)
	if l.netns != "" {
		// nsenter, not `ip netns exec`: that also remounts /sys, hiding
		// bpffs and the cgroup tree the agent shares with the machine.
		argv = append([]string{"nsenter", "--net=/run/netns/" + l.netns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		l.t.Fatalf("running shunt %v: %v", args, err)
	}
	return out.String(), code
}

func (l *lab) mustShunt(args ...string) string {
	l.t.Helper()
	out, code := l.shunt(args...)
	if code != 0 {
		l.t.Fatalf("shunt %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

type podList struct {
	Items []struct {
		Metadata struct{ Name, Namespace string }
		Status   struct {
			Phase string
			PodIP string `json:"podIP"`
		}
	}
}

func (l *lab) podIP(name string) string {
	l.t.Helper()
	var list podList
	if err := json.Unmarshal([]byte(l.mustShunt("get", "pods", "-A", "-o", "json")), &list); err != nil {
		l.t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.Metadata.Name == name {
			return p.Status.PodIP
		}
	}
	l.t.Fatalf("pod %s not listed", name)
	return ""
}

type status struct {
	PID        int            `json:"pid"`
	NodeIP     string         `json:"nodeIP"`
	PodCIDR    string         `json:"podCIDR"`
	Source     string         `json:"source"`
	Health     []string       `json:"health"`
	Hooks      map[string]int `json:"hooks"`
	Masquerade *struct {
		Uplink, Address, Ports string
	} `json:"masquerade"`
	Routing *struct {
		Mode, Device, Underlay string
		PodMTU                 int
	} `json:"routing"`
	Counters []struct {
		Reason, Direction string
		Packets           uint64
	}
	Accel struct {
		Enabled bool
		Sockets int
		Refused string
	} `json:"socketAcceleration"`
	FlowSampling string `json:"flowSampling"`
	Kernel       struct {
		Release   string   `json:"release"`
		Fallbacks []string `json:"fallbacks"` // the older kernel paths the agent takes
	} `json:"kernel"`
}

func (l *lab) status() status {
	l.t.Helper()
	out := l.mustShunt("status", "-o", "json")
	var st status
	if strings.HasPrefix(out, "[") {
		// A lab of several nodes: the first node's status, with every
		// node's counters.
		var all []status
		if err := json.Unmarshal([]byte(out), &all); err != nil {
			l.t.Fatal(err)
		}
		st = all[0]
		for _, o := range all[1:] {
			st.Counters = append(st.Counters, o.Counters...)
		}
		return st
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		l.t.Fatal(err)
	}
	return st
}

func (st status) forwarded() uint64 {
	var n uint64
	for _, c := range st.Counters {
		if c.Reason == "forwarded" {
			n += c.Packets
		}
	}
	return n
}

// probe runs `shunt lab probe` inside pod (or on the node when pod is "")
// and fails the test unless every attempt gives want. "connected" is
// retried for up to 3s: a container runs before its server listens.
func (l *lab) probe(pod, want string, targets ...string) {
	l.t.Helper()
	args := append([]string{"lab", "probe", "--timeout", "2s", "--expect", want}, targets...)
	if pod != "" {
		args = append([]string{"lab", "exec", pod, "--", filepath.Join(binDir, "shunt")}, args...)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		out, code := l.shunt(args...)
		if code == 0 {
			return
		}
		if want != "connected" || time.Now().After(deadline) {
			l.t.Errorf("probe from %q %v: want %s, exit %d:\n%s", pod, targets, want, code, out)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (l *lab) ping(pod, ip string) {
	l.t.Helper()
	if out, code := l.shunt("lab", "exec", pod, "--", "ping", "-c", "1", "-W", "2", ip); code != 0 {
		l.t.Errorf("ping %s from %s: exit %d:\n%s", ip, pod, code, out)
	}
}

// assertGone checks that the instance left nothing on the machine.
func (l *lab) assertGone() {
	t := l.t
	for _, p := range []string{"/sys/fs/bpf/" + l.instance, "/var/lib/shunt/" + l.instance, "/run/shunt/" + l.instance,
		"/sys/fs/cgroup/unified/" + l.instance} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("left behind: %s", p)
		}
	}
	if ns, _ := filepath.Glob("/run/netns/" + l.instance + "-*"); len(ns) > 0 {
		t.Errorf("network namespaces left behind: %v", ns)
	}
	out, _ := exec.Command("ip", "-d", "link", "show").CombinedOutput()
	if strings.Contains(string(out), "shunt:"+l.instance+":") || strings.Contains(string(out), l.instance+"_host") {
		t.Errorf("interfaces left behind:\n%s", out)
	}
	if l.cidr != "" {
		// Routes to the pods (their /32s, the node's pod CIDR) go with the
		// interfaces they point at; one that outlived them would
		// black-hole the CIDR for the next lab.
		prefix, _ := netip.ParsePrefix(l.cidr)
		out, _ := exec.Command("ip", "-4", "route", "show", "table", "all").CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) > 1 && !strings.ContainsAny(f[0], "0123456789") {
				f = f[1:] // the route's type: local, broadcast, ...
			}
			if len(f) == 0 {
				continue
			}
			dst := f[0]
			if !strings.Contains(dst, "/") {
				dst += "/32"
			}
			if p, err := netip.ParsePrefix(dst); err == nil && p.Overlaps(prefix) {
				t.Errorf("route into the pod CIDR %s left behind: %s", l.cidr, line)
			}
		}
	}
}

const twoPods = "testdata/two-pods.yaml"

func TestPodToPodAllModes(t *testing.T) {
	for _, mode := range []string{"redirect-peer", "redirect", "bridge", "routed"} {
		t.Run(mode, func(t *testing.T) {
			l := newLab(t, mode, twoPods)
			a, b := l.podIP("client"), l.podIP("server")
			before := l.status().forwarded()

			l.probe("client", "connected", "--tcp", b+":7000", "--udp", b+":7000", "--http", "http://"+b+":8080/")
			l.probe("server", "connected", "--tcp", a+":7000")
			l.probe("client", "refused", "--tcp", b+":7999")
			l.ping("client", b)

			st := l.status()
			l.ping("client", st.NodeIP)                        // pod -> node
			l.probe("", "connected", "--tcp", b+":7000")       // node -> pod
			l.probe("", "connected", "--udp", a+":7000")       // node -> pod, UDP
			l.probe("client", "connected", "--tcp", a+":7000") // pod -> itself
			forwarded := l.status().forwarded() - before
			if mode == "redirect-peer" || mode == "redirect" {
				if forwarded == 0 {
					t.Errorf("mode %s: pod-to-pod traffic did not go through the BPF datapath (forwarded counter did not move)", mode)
				}
			} else if forwarded != 0 {
				t.Errorf("mode %s: BPF forwarded %d packets, but this mode must not attach programs", mode, forwarded)
			}
		})
	}
}

func TestAgentRestartKeepsPodsReachable(t *testing.T) {
	l := newLab(t, "redirect-peer", twoPods)
	b := l.podIP("server")
	l.probe("client", "connected", "--tcp", b+":7000")

	// Stop the agent: pods and the pinned datapath keep forwarding.
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	l.probe("client", "connected", "--tcp", b+":7000", "--udp", b+":7000")

	// Start it again: it adopts pods, pins and links, and new pods work.
	l.mustShunt("lab", "up")
	if got := l.podIP("server"); got != b {
		t.Errorf("server IP changed across restart: %s -> %s", b, got)
	}
	l.probe("client", "connected", "--tcp", b+":7000")
	l.mustShunt("apply", "-f", "testdata/third-pod.yaml")
	waitRunning(t, l, "third")
	c := l.podIP("third")
	l.probe("client", "connected", "--tcp", c+":7000")
	l.probe("third", "connected", "--tcp", b+":7000")
	if l.status().forwarded() == 0 {
		t.Error("forwarded counter is zero after restart: counters or links were not adopted")
	}
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for i := 0; i < 200; i++ {
		// Exited, reaped or not: init reaps an orphaned agent only every
		// few seconds on some machines.
		if !procstat.Running(pid) {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("agent %d did not exit", pid)
}

func waitRunning(t *testing.T, l *lab, pod string) {
	t.Helper()
	for i := 0; i < 200; i++ {
		var list podList
		json.Unmarshal([]byte(l.mustShunt("get", "pods", "-A", "-o", "json")), &list)
		for _, p := range list.Items {
			if p.Metadata.Name == pod && p.Status.Phase == "Running" {
				return
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("pod %s not running", pod)
}
