package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLabLifecycle: a refused `lab up --nodes 2` leaves nothing; a
// process started on the external host does not outlive `lab down`; a
// second `lab down` says there was nothing to remove.
func TestLabLifecycle(t *testing.T) {
	requireRoot(t)
	l := &lab{t: t, instance: fmt.Sprintf("e2l%05d", rand.IntN(100000))}
	t.Cleanup(func() {
		l.shunt("lab", "down")
		l.assertGone()
		l.node(2).assertGone()
	})
	if out, code := l.shunt("lab", "up", "--nodes", "2", "--masquerade-ports", "bad"); code == 0 || !strings.Contains(out, "masquerade-ports") {
		t.Errorf("lab up with a bad --masquerade-ports: exit %d:\n%s", code, out)
	}
	l.assertGone()
	l.node(2).assertGone()

	l.mustShunt("lab", "up", "--nodes", "2")
	// `lab up` makes it so: a node deleted while its agent runs comes back.
	l.netns = l.instance + "-node1"
	l.mustShunt("delete", "node", "node-2")
	if out := l.mustShunt("get", "nodes"); strings.Contains(out, "node-2") {
		t.Fatalf("node-2 still listed after delete node:\n%s", out)
	}
	up := *l
	up.netns = ""
	if out := up.mustShunt("lab", "up", "--nodes", "2"); !strings.Contains(out, "node-2") {
		t.Errorf("lab up bringing node-2 back says nothing of it:\n%s", out)
	}
	if st := nodeStatus(t, l)["node-2"]; st != "True" {
		t.Errorf("node-2 after lab up: Ready=%q, want True", st)
	}
	l.netns = ""
	ext := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", "--external", "--", "sleep", "300")
	if err := ext.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ext.Wait() }()
	time.Sleep(500 * time.Millisecond)
	if out := l.mustShunt("lab", "down"); !strings.Contains(out, "removed") {
		t.Errorf("lab down: %s", out)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		syscall.Kill(ext.Process.Pid, syscall.SIGKILL)
		t.Errorf("lab exec --external's command outlived lab down")
	}
	l.assertGone()
	l.node(2).assertGone()
	if out := l.mustShunt("lab", "down"); !strings.Contains(out, "nothing to remove") {
		t.Errorf("second lab down: %q, want it to say there was nothing to remove", out)
	}
}

// TestLabUpRunning: `lab up` on a running lab of one node makes it so or
// refuses: the same flags (or none) change nothing; settings the agent
// takes only at start are refused, each named with the way to apply it;
// flow sampling and socket acceleration are switched live. Then `lab down`
// stops what runs in a pod's network namespace outside its cgroup (`lab
// exec` in the background, `ip netns exec`), and no namespace is left.
func TestLabUpRunning(t *testing.T) {
	l := newLabWith(t, []string{"--metrics-addr", "127.0.0.1:0"}, twoPods)
	l.mustShunt("lab", "up")
	l.mustShunt("lab", "up", "--pod-cidr", l.cidr, "--service-cidr", l.serviceCIDR, "--metrics-addr", "127.0.0.1:0", "--flow-sampling", "default", "--drift-check-period", "120s")

	out, code := l.shunt("lab", "up", "--metrics-addr", "127.0.0.1:9", "--flow-history", "10", "--conntrack-single-table", "--mode", "bridge")
	for _, want := range []string{"--metrics-addr 127.0.0.1:9 (it runs with 127.0.0.1:0)", "--flow-history 10 (it runs with 8192)",
		"--conntrack-single-table true (it runs with false)", "--mode bridge (it runs with redirect-peer)", "lab down` first"} {
		if code == 0 || !strings.Contains(out, want) {
			t.Errorf("lab up with other start-time settings: exit %d, want a refusal naming %q:\n%s", code, want, out)
		}
	}

	if st := l.status(); st.FlowSampling != "default" || st.Accel.Enabled {
		t.Fatalf("before: flow sampling %s, acceleration %v", st.FlowSampling, st.Accel.Enabled)
	}
	out = l.mustShunt("lab", "up", "--flow-sampling", "all", "--socket-acceleration")
	if !strings.Contains(out, "shunt flow-sampling all") || !strings.Contains(out, "shunt accel on") {
		t.Errorf("lab up switching live settings should say what it switched:\n%s", out)
	}
	if st := l.status(); st.FlowSampling != "all" || !st.Accel.Enabled {
		t.Errorf("after lab up --flow-sampling all --socket-acceleration: flow sampling %s, acceleration %v", st.FlowSampling, st.Accel.Enabled)
	}
	if out := l.mustShunt("lab", "up", "--socket-acceleration"); strings.Contains(out, "accel") {
		t.Errorf("lab up asking what runs already switched something:\n%s", out)
	}

	// Processes in the client pod's namespace outside its cgroup.
	netns := "/run/netns/" + l.instance + "-default-client"
	// Held open: a namespace freed could pass its inode number on to
	// another test's new one.
	held, err := os.Open(netns)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(held.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	bg := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", "client", "--", "sleep", "1000")
	ipExec := exec.Command("ip", "netns", "exec", filepath.Base(netns), "sleep", "1000")
	for _, c := range []*exec.Cmd{bg, ipExec} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
		go c.Wait()
	}
	waitFor(t, 5*time.Second, "both sleeps in the pod's namespace", func() bool { return len(pidsInNetns(st, "sleep")) == 2 })
	l.mustShunt("lab", "down")
	if pids := pidsInNetns(st, ""); len(pids) > 0 {
		t.Errorf("processes in the client pod's namespace outlived lab down: %v", pids)
	}
	l.assertGone()
}

// pidsInNetns are the processes (whose command is comm, "": any) in the
// network namespace ns (its device and inode).
func pidsInNetns(ns syscall.Stat_t, comm string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns/net"), &st) != nil || st.Dev != ns.Dev || st.Ino != ns.Ino {
			continue
		}
		if c, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); comm == "" || strings.TrimSpace(string(c)) == comm {
			pids = append(pids, pid)
		}
	}
	return pids
}
