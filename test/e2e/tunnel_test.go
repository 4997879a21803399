package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// newNodeNetns makes a network namespace to be a node's host side, with an
// underlay interface holding addr/24 at the given MTU (a veth whose peer
// stays inside too: the namespace is the whole world of the node). It is
// removed when the test ends.
func newNodeNetns(t *testing.T, addr string, mtu int) string {
	t.Helper()
	requireRoot(t)
	ns := fmt.Sprintf("e2enode%06d", rand.IntN(1000000))
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "ul0", "mtu", fmt.Sprint(mtu), "type", "veth", "peer", "name", "ul1", "mtu", fmt.Sprint(mtu)},
		{"-n", ns, "addr", "add", addr + "/24", "dev", "ul0"},
		{"-n", ns, "link", "set", "ul0", "up"},
		{"-n", ns, "link", "set", "ul1", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return ns
}

// TestTunnelNode: a node started with --tunnel vxlan (its host side a
// network namespace of its own, as every node of a multi-node lab is)
// makes its collect-metadata VXLAN device with the overlay program on it,
// gives pods the underlay's MTU less the encapsulation, keeps the tunnel
// across a restart without the flags, and removes the device with the lab.
func TestTunnelNode(t *testing.T) {
	ns := newNodeNetns(t, "192.168.77.1", 9000)
	l := newLabIn(t, ns, []string{"--tunnel", "vxlan", "--underlay-addr", "192.168.77.1"}, twoPods)
	dev := l.instance + "_vxl"
	checkTunnel := func(when string) {
		t.Helper()
		out, err := exec.Command("ip", "-n", ns, "-d", "link", "show", dev).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "vxlan external") || !strings.Contains(string(out), "dstport 4789") {
			t.Fatalf("%s: the overlay device %s: %v\n%s", when, dev, err, out)
		}
		var st struct {
			Hooks  map[string]int
			Tunnel *struct {
				Kind, Device, Underlay string
				PodMTU                 int
			}
		}
		if err := json.Unmarshal([]byte(l.mustShunt("status", "-o", "json")), &st); err != nil {
			t.Fatal(err)
		}
		if st.Hooks["from-overlay"] != 1 {
			t.Errorf("%s: hooks %v: want the overlay program attached once", when, st.Hooks)
		}
		if tu := st.Tunnel; tu == nil || tu.Kind != "vxlan" || tu.Device != dev || tu.Underlay != "192.168.77.1" || tu.PodMTU != 8950 {
			t.Errorf("%s: status tunnel %+v: want vxlan on %s from 192.168.77.1, pod MTU 8950", when, st.Tunnel, dev)
		}
	}
	checkTunnel("after lab up")
	// The lab has no Node objects: the node lists itself.
	if out := l.mustShunt("get", "nodes"); !strings.Contains(out, l.instance) || !strings.Contains(out, "Ready") || !strings.Contains(out, "192.168.77.1") {
		t.Errorf("get nodes:\n%s\nwant this node, Ready, at 192.168.77.1", out)
	}
	// (ip, not /sys/class/net: sysfs shows the namespace it was mounted in.)
	if out := l.mustShunt("lab", "exec", "client", "--", "ip", "-o", "link", "show", "eth0"); !strings.Contains(out, " mtu 8950 ") {
		t.Errorf("pod interface %q: want mtu 8950 (the underlay's 9000 less 50 of encapsulation)", out)
	}
	b := l.podIP("server")
	l.probe("client", "connected", "--tcp", b+":7000")

	// The tunnel is the node's: a restart without the flags keeps it.
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	l.mustShunt("lab", "up")
	checkTunnel("after a restart")
	l.probe("client", "connected", "--tcp", b+":7000")

	l.mustShunt("lab", "down")
	if out, err := exec.Command("ip", "-n", ns, "link", "show", dev).CombinedOutput(); err == nil {
		t.Errorf("lab down left the overlay device:\n%s", out)
	}
}

// TestNativeNode: a node started with --routing native attaches the uplink
// programs to its underlay interface (no VXLAN device), gives pods the
// underlay's full MTU, says so in status, keeps its routing across a
// restart without the flags, and refuses the overlay until `lab down`.
func TestNativeNode(t *testing.T) {
	ns := newNodeNetns(t, "192.168.77.1", 9000)
	l := newLabIn(t, ns, []string{"--routing", "native", "--underlay-addr", "192.168.77.1"}, twoPods)
	checkNative := func(when string) {
		t.Helper()
		st := l.status()
		if st.Hooks["from-uplink"] != 1 || st.Hooks["from-overlay"] != 0 {
			t.Errorf("%s: hooks %v: want the uplink programs attached, no overlay program", when, st.Hooks)
		}
		if r := st.Routing; r == nil || r.Mode != "native" || r.Device != "ul0" || r.Underlay != "192.168.77.1" || r.PodMTU != 9000 {
			t.Errorf("%s: status routing %+v: want native out of ul0 from 192.168.77.1, pod MTU 9000", when, st.Routing)
		}
		if out := l.mustShunt("status"); !strings.Contains(out, "routing:   native out of ul0 from 192.168.77.1 (pod MTU 9000)") {
			t.Errorf("%s: shunt status:\n%s\nwant the routing line", when, out)
		}
	}
	checkNative("after lab up")
	if out, err := exec.Command("ip", "-n", ns, "link", "show", l.instance+"_vxl").CombinedOutput(); err == nil {
		t.Errorf("native routing made a VXLAN device:\n%s", out)
	}
	if out := l.mustShunt("lab", "exec", "client", "--", "ip", "-o", "link", "show", "eth0"); !strings.Contains(out, " mtu 9000 ") {
		t.Errorf("pod interface %q: want mtu 9000 (the underlay's, no encapsulation)", out)
	}
	l.probe("client", "connected", "--tcp", l.podIP("server")+":7000")

	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	if out, code := l.shunt("lab", "up", "--tunnel", "vxlan"); code == 0 || !strings.Contains(out, "already runs with routing native") {
		t.Errorf("lab up --tunnel vxlan on a native node: exit %d:\n%s\nwant a refusal naming the routing", code, out)
	}
	l.mustShunt("lab", "up")
	checkNative("after a restart")
}
