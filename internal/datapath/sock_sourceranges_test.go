package datapath

import (
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// TestSocketSourceRanges: a load balancer frontend's source ranges hold
// for node-local clients at the socket layer, as kube-proxy's do: the
// node's unbound socket is judged by the node's address (NODE_SOURCE_IP4),
// a bound one by the address it is bound to, a pod's by its pod address
// (its network namespace). A client outside the ranges is refused at once
// (ECONNREFUSED, EPERM without bpf_set_retval; TCP connect and UDP
// sendmsg), counted and reported as lb-source-denied; one inside is
// translated. A NodePort of the same Service (no ranges) admits everyone.
func TestSocketSourceRanges(t *testing.T) {
	forEachRefusalMode(t, testSocketSourceRanges)
}

func testSocketSourceRanges(t *testing.T, m refusalMode) {
	nodeAddr := netip.MustParseAddr("10.97.0.1")
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, NodeIP: nodeAddr, Fallbacks: m.fallbacks}, nil)
	cg := testCgroup(t)
	if err := d.AttachSocketLB(cg); err != nil {
		t.Fatal(err)
	}
	read := flowReader(t, d)
	node := startSockClient(t, cg, "")
	tcp := listenTCP(node, "127.0.0.3:0")
	udp := node.listen("u", "127.0.0.2:0")

	lb := func(vip string, proto uint8, backend netip.AddrPort, ranges ...string) services.Port {
		p := services.Port{Frontend: services.Frontend{VIP: netip.MustParseAddr(vip), Port: 80, Proto: proto}, Kind: services.KindLoadBalancer,
			Name: "default/" + vip, Backends: []services.Backend{{IP: backend.Addr(), Port: backend.Port()}}}
		for _, r := range ranges {
			p.SourceRanges = append(p.SourceRanges, netip.MustParsePrefix(r))
		}
		return p
	}
	nodes, others, loopback := "192.0.2.100", "192.0.2.101", "192.0.2.102"
	nodePort := lb(nodeAddr.String(), 6, tcp)
	nodePort.Kind, nodePort.Frontend.Port = services.KindNodePort, 30080
	if _, err := d.SyncServices([]services.Port{
		lb(nodes, 6, tcp, "10.97.0.0/24"),
		lb(others, 6, tcp, "198.51.100.0/24"),
		lb(others, protoUDP, udp, "198.51.100.0/24"),
		lb(loopback, 6, tcp, "127.0.0.0/8"),
		nodePort,
	}); err != nil {
		t.Fatal(err)
	}
	at := func(vip string, port int) string {
		return netip.AddrPortFrom(netip.MustParseAddr(vip), uint16(port)).String()
	}
	refused := "err " + unix.ErrnoName(m.noBackends)

	for _, tc := range []struct {
		what, cmd, want string
		counts          map[string]uint64
	}{
		{"the node, in the ranges", "tcp " + at(nodes, 80), "ok " + at(nodes, 80), map[string]uint64{"sock-translated/connect": 1, "lb-source-denied/connect": 0}},
		{"the node, outside them", "tcp " + at(others, 80), refused, map[string]uint64{"sock-translated/connect": 0, "lb-source-denied/connect": 1}},
		{"the node, outside them, UDP", "sendto s " + at(others, 80), refused, map[string]uint64{"sock-translated/sendmsg": 0, "lb-source-denied/sendmsg": 1}},
		{"the node's unbound socket at a loopback range", "tcp " + at(loopback, 80), refused, map[string]uint64{"lb-source-denied/connect": 1}},
		{"a socket bound to 127.0.0.5 there", "tcpfrom 127.0.0.5 " + at(loopback, 80), "ok " + at(loopback, 80), map[string]uint64{"sock-translated/connect": 1, "lb-source-denied/connect": 0}},
		{"a socket bound to 127.0.0.5 at the node's range", "tcpfrom 127.0.0.5 " + at(nodes, 80), refused, map[string]uint64{"lb-source-denied/connect": 1}},
		{"the NodePort: no ranges", "tcp " + at(nodeAddr.String(), 30080), "ok " + at(nodeAddr.String(), 30080), map[string]uint64{"sock-translated/connect": 1, "lb-source-denied/connect": 0}},
	} {
		before := counts(t, d)
		if ans := node.do("%s", tc.cmd); ans != tc.want {
			t.Errorf("%s: %s: %q, want %q", tc.what, tc.cmd, ans, tc.want)
		}
		counterDelta(t, d, before, tc.counts)
	}
	expectFlow(t, read(), "DROPPED", "lb-source-denied")

	// A pod (its network namespace known by its cookie) is judged by its
	// own address. Its loopback has no backend: the counters tell a
	// translated connect from a refused one.
	podAddr := netip.MustParseAddr("10.97.5.5")
	ns := testNetns(t)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	if err := d.SyncPolicy(policy.State{}, []Endpoint{{IP: podAddr, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300, Netns: ns}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.UpdateServices([]services.Port{lb(nodes, 6, tcp, "10.97.5.0/24")}, nil); err != nil {
		t.Fatal(err)
	}
	pod := startSockClient(t, cg, ns)
	before := counts(t, d)
	pod.do("tcp %s", at(nodes, 80))
	counterDelta(t, d, before, map[string]uint64{"sock-translated/connect": 1, "lb-source-denied/connect": 0})
	before = counts(t, d)
	if ans := pod.do("tcp %s", at(others, 80)); ans != refused {
		t.Errorf("a pod outside the ranges: %q, want %q", ans, refused)
	}
	counterDelta(t, d, before, map[string]uint64{"sock-translated/connect": 0, "lb-source-denied/connect": 1})
	before = counts(t, d)
	if ans := node.do("tcp %s", at(nodes, 80)); ans != refused {
		t.Errorf("the node, once the ranges hold only the pod: %q, want %q", ans, refused)
	}
	counterDelta(t, d, before, map[string]uint64{"lb-source-denied/connect": 1})
}
