package e2e

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/netnsrun"
)

// outsideHost moves the node namespace's underlay peer (ul1, see
// newNodeNetns) into a namespace of its own at addr/24: a host outside
// the cluster on the node's underlay, which knows the node's address and
// no route to any pod. It serves as serveOutside says and is removed when
// the test ends.
func outsideHost(t *testing.T, nodeNetns, addr string, port uint16) (peers chan netip.Addr) {
	t.Helper()
	ns := outsideNetns(t)
	mustIP(t, [][]string{
		{"-n", nodeNetns, "link", "set", "ul1", "netns", ns},
		{"-n", ns, "addr", "add", addr + "/24", "dev", "ul1"},
		{"-n", ns, "link", "set", "ul1", "up"},
	})
	return serveOutside(t, ns, addr, port)
}

// outsideOnBridge puts a host outside the cluster at addr/24 on the
// underlay bridge of newUnderlay (in namespace underlay), beside the
// nodes. It serves as serveOutside says and is removed when the test ends.
func outsideOnBridge(t *testing.T, underlay, addr string, port uint16) (peers chan netip.Addr) {
	t.Helper()
	ns := outsideNetns(t)
	mustIP(t, [][]string{
		{"-n", ns, "link", "add", "ul0", "type", "veth", "peer", "name", "out", "netns", underlay},
		{"-n", ns, "addr", "add", addr + "/24", "dev", "ul0"},
		{"-n", ns, "link", "set", "ul0", "up"},
		{"-n", underlay, "link", "set", "out", "master", "br0", "up"},
	})
	return serveOutside(t, ns, addr, port)
}

// outsideNetns makes the namespace of a host outside the cluster, removed
// when the test ends.
func outsideNetns(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("e2eout%06d", rand.IntN(1000000))
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	mustIP(t, [][]string{{"netns", "add", ns}, {"-n", ns, "link", "set", "lo", "up"}})
	return ns
}

func mustIP(t *testing.T, commands [][]string) {
	t.Helper()
	for _, args := range commands {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// serveOutside runs TCP and UDP echo servers at addr:port in namespace ns
// until the test ends; every peer address they see goes to peers.
func serveOutside(t *testing.T, ns, addr string, port uint16) (peers chan netip.Addr) {
	t.Helper()
	at := netip.AddrPortFrom(netip.MustParseAddr(addr), port)
	var l net.Listener
	var u *net.UDPConn
	if err := netnsrun.Do("/run/netns/"+ns, func() (err error) {
		if l, err = net.Listen("tcp4", at.String()); err != nil {
			return err
		}
		u, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(at))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); u.Close() })
	peers = make(chan netip.Addr, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			peers <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := u.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			peers <- from.Addr().Unmap()
			u.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return peers
}

// onlyFrom checks that every peer the outside host saw so far (at least
// one) is want.
func onlyFrom(t *testing.T, peers chan netip.Addr, want string) {
	t.Helper()
	n := 0
	for {
		select {
		case a := <-peers:
			n++
			if a.String() != want {
				t.Errorf("the outside host saw a peer %s, want only the node's address %s", a, want)
			}
			continue
		case <-time.After(200 * time.Millisecond):
		}
		break
	}
	if n == 0 {
		t.Errorf("the outside host saw nobody")
	}
}

// TestMasqueradeNode: a node started with --masquerade (its host side a
// network namespace, its uplink shared with a host outside the cluster
// that knows only the node's address): a pod reaches that host over TCP,
// UDP and ping, which sees only the node's address; a closed UDP port of
// it is refused in the pod (the ICMP error translated back); the NAT table
// and the counters show the flows; a restart without the flags keeps
// masquerading; an overlapping port range is refused before anything
// starts.
func TestMasqueradeNode(t *testing.T) {
	const node, outside = "192.168.77.1", "192.168.77.100"
	ns := newNodeNetns(t, node, 1500)
	peers := outsideHost(t, ns, outside, 7000)
	l := newLabIn(t, ns, []string{"--masquerade", "--underlay-addr", node}, twoPods)
	target := outside + ":7000"

	check := func(when string) {
		t.Helper()
		l.probe("client", "connected", "--tcp", target, "--udp", target)
		onlyFrom(t, peers, node)
		l.ping("client", outside)
		l.probe("client", "refused", "--udp-connected", "--udp", outside+":7001")
		st := l.status()
		if st.Hooks["to-uplink"] != 1 || st.Hooks["from-uplink"] != 1 {
			t.Errorf("%s: hooks %v, want to-uplink and from-uplink once", when, st.Hooks)
		}
		if m := st.Masquerade; m == nil || m.Uplink != "ul0" || m.Address != node || m.Ports != "61000-65535" {
			t.Errorf("%s: status masquerade %+v, want ul0 from %s, ports 61000-65535", when, st.Masquerade, node)
		}
	}
	check("after lab up")
	client := l.podIP("client")
	nat := l.mustShunt("map", "dump", "shunt_masq_nat")
	for _, want := range []string{client, node + ":", outside + ":7000", "TCP", "UDP", "ICMP"} {
		if !strings.Contains(nat, want) {
			t.Errorf("shunt_masq_nat:\n%s\nwant %q", nat, want)
		}
	}
	counters := fmt.Sprint(l.status().Counters)
	for _, want := range []string{"masqueraded", "unmasqueraded"} {
		if !strings.Contains(counters, want) {
			t.Errorf("counters %s: want %s", counters, want)
		}
	}

	// The masquerade is the node's: a restart without the flags keeps it.
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	l.mustShunt("lab", "up")
	check("after a restart")

	// Ports the node's own connections take are refused, naming why.
	other := &lab{t: t, instance: fmt.Sprintf("e2e%06d", rand.IntN(1000000)), netns: ns}
	out, code := other.shunt("lab", "up", "--pod-cidr", "10.251.7.0/24", "--masquerade", "--underlay-addr", node, "--masquerade-ports", "40000-41000")
	other.shunt("lab", "down")
	if code == 0 || !strings.Contains(out, "ip_local_port_range") {
		t.Errorf("masquerade ports inside the ephemeral range: exit %d:\n%s\nwant a refusal naming ip_local_port_range", code, out)
	}
}
