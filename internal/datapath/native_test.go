package datapath

import (
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// The two-node native routing test: the nodes of TestOverlayTwoNodes
// without a VXLAN device, the underlay routing each node's pod CIDR to it
// (the routes SyncTunnelRoutes installs), and a second pod on node A, the
// intruder, whose identity node B's policy does not admit:
//
//	pod A ─┐                                                  ┌─ pod B
//	10.244.1.10  node A ══ underlay 10.77.0.0/24 ══ node B    10.244.2.10
//	pod X ─┘     10.77.0.1                     10.77.0.2
//	10.244.1.20
const (
	nrIdentityX = 302
	nrUDPPort   = 5353 // pod B: UDP
)

// TestNativeTwoNodes: pods of two nodes reach each other with native
// routing (ICMP echo, TCP with data, UDP), leaving through bpf_fib_lookup
// and a redirect to the underlay (counted forwarded at from-pod), arriving
// through the uplink program (forwarded at from-uplink) with the sender's
// identity from the ipcache; the node's own traffic takes the route to the
// other node's pods and arrives as the remote-node identity; node B's
// ingress policy, which admits only A's identity, drops the intruder pod X
// of node A, the flow naming X's identity; without the routes the lookup
// fails and the packet is handed to the stack, counted fib-lookup-failed.
func TestNativeTwoNodes(t *testing.T) {
	requireBPF(t)
	for _, mode := range []Mode{ModeRedirectPeer, ModeRedirect} {
		t.Run(string(mode), func(t *testing.T) { testNativeTwoNodes(t, mode) })
	}
}

func testNativeTwoNodes(t *testing.T, mode Mode) {
	a, b := newOvNodes(t, mode, true, 0)
	x, _ := a.addPod(t, "x", netip.MustParseAddr("10.244.1.20"), nrIdentityX)

	// As the reconciler has it: this node's pods are endpoints, the other
	// node's pods and its pod-network address entries behind its underlay
	// address, and a route to its pod CIDR via that address.
	aPods, bPods := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.2.0/24")
	ipcacheA := []policy.PrefixIdentity{
		{Prefix: netip.PrefixFrom(a.pod.PodIP, 32), Identity: ovIdentityA},
		{Prefix: netip.PrefixFrom(x.PodIP, 32), Identity: nrIdentityX},
		{Prefix: netip.PrefixFrom(b.pod.PodIP, 32), Identity: ovIdentityB, Tunnel: b.underlay},
		{Prefix: netip.PrefixFrom(b.node.NodeIP, 32), Identity: policy.IdentityRemoteNode, Tunnel: b.underlay},
	}
	ipcacheB := []policy.PrefixIdentity{
		{Prefix: netip.PrefixFrom(b.pod.PodIP, 32), Identity: ovIdentityB},
		{Prefix: netip.PrefixFrom(a.pod.PodIP, 32), Identity: ovIdentityA, Tunnel: a.underlay},
		{Prefix: netip.PrefixFrom(x.PodIP, 32), Identity: nrIdentityX, Tunnel: a.underlay},
		{Prefix: netip.PrefixFrom(a.node.NodeIP, 32), Identity: policy.IdentityRemoteNode, Tunnel: a.underlay},
	}
	a.sync(t, policy.State{IPCache: ipcacheA})
	b.sync(t, policy.State{IPCache: ipcacheB})
	// A node off the underlay's network (a next hop A cannot reach
	// directly) gets no route and is named, not an error: the others are
	// installed.
	offNet := TunnelRoute{PodCIDR: netip.MustParsePrefix("10.99.7.0/24"), Node: netip.MustParseAddr("203.0.113.9")}
	routesA := []TunnelRoute{{PodCIDR: bPods, Node: b.underlay}, offNet}
	syncRoutes := func(n *ovNode, routes []TunnelRoute) []TunnelRoute {
		t.Helper()
		var unreachable []TunnelRoute
		if err := netnsrun.Do(n.netns, func() (err error) {
			unreachable, err = n.d.SyncTunnelRoutes(n.node.NodeIP, routes)
			return err
		}); err != nil {
			t.Fatalf("node %s: %v", n.name, err)
		}
		return unreachable
	}
	if got := syncRoutes(a, routesA); !slices.Equal(got, []TunnelRoute{offNet}) {
		t.Errorf("node A: unreachable %v, want %v", got, offNet)
	}
	syncRoutes(b, []TunnelRoute{{PodCIDR: aPods, Node: a.underlay}})
	out, err := exec.Command("ip", "-n", strings.TrimPrefix(a.netns, "/run/netns/"), "route", "show", "proto", "0x53").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "10.244.2.0/24 via 10.77.0.2 dev ul-a") {
		t.Fatalf("node A's native routes: %s %v; want 10.244.2.0/24 via 10.77.0.2 dev ul-a", out, err)
	}

	frA, frB := a.flows(t), b.flows(t)
	echoServer(t, b.pod, netip.AddrPortFrom(b.pod.PodIP, ovEchoPort))

	t.Run("ping, TCP and UDP, routed without encapsulation", func(t *testing.T) {
		beforeA, beforeB := counts(t, a.d), counts(t, b.d)
		if err := ping(a.pod, b.pod.PodIP); err != nil {
			t.Fatalf("ping %s from pod A: %v", b.pod.PodIP, err)
		}
		if err := tcpEcho(a.pod, netip.AddrPortFrom(b.pod.PodIP, ovEchoPort), 256<<10); err != nil {
			t.Fatalf("TCP from pod A to pod B: %v", err)
		}
		udp := listenUDP(t, b.pod, netip.AddrPortFrom(b.pod.PodIP, nrUDPPort))
		if err := sendUDP(podnet.NetnsPath(a.pod.Netns), netip.AddrPortFrom(b.pod.PodIP, nrUDPPort)); err != nil {
			t.Fatal(err)
		}
		if !readUDP(udp, 2*time.Second) {
			t.Errorf("pod B received no UDP datagram from pod A (A: %v, B: %v)", counts(t, a.d), counts(t, b.d))
		}
		// Both ways: B's replies leave routed too.
		counterDelta(t, a.d, beforeA, nil, "forwarded/from-pod", "forwarded/from-uplink")
		counterDelta(t, b.d, beforeB, nil, "forwarded/from-pod", "forwarded/from-uplink")
		for _, c := range []string{"to-stack/from-pod", "fib-lookup-failed/from-pod", "to-tunnel/from-pod"} {
			if d := counts(t, a.d)[c] - beforeA[c]; d != 0 {
				t.Errorf("node A: %s moved by %d: a packet left another way than routed by BPF", c, d)
			}
		}
		ev := findFlow(t, frB, func(e FlowEvent) bool {
			return e.Event == "new" && e.Point == "from-uplink" && e.Proto == 6 && e.DstPort == ovEchoPort
		})
		if ev.SrcIdentity != ovIdentityA || ev.DstIdentity != ovIdentityB || ev.Src != a.pod.PodIP || ev.Verdict != "FORWARDED" {
			t.Errorf("new connection on B: %+v; want source identity %d (the ipcache's), destination %d", ev, ovIdentityA, ovIdentityB)
		}
	})

	t.Run("the node's own traffic takes the route, arrives as remote-node", func(t *testing.T) {
		beforeB := counts(t, b.d)
		if err := netnsrun.Do(a.netns, func() error {
			c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(b.pod.PodIP, ovEchoPort).String(), 3*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}); err != nil {
			t.Fatalf("TCP from node A's own namespace to pod B: %v", err)
		}
		counterDelta(t, b.d, beforeB, nil, "forwarded/from-uplink")
		ev := findFlow(t, frB, func(e FlowEvent) bool {
			return e.Event == "new" && e.Point == "from-uplink" && e.Src == a.node.NodeIP
		})
		if ev.SrcIdentity != policy.IdentityRemoteNode {
			t.Errorf("node A's connection on B: %+v; want source identity %d (remote-node)", ev, policy.IdentityRemoteNode)
		}
	})

	// admitOnlyA isolates pod B, admitting only A's identity to its echo
	// port; the function it returns undoes it.
	admitOnlyA := func(t *testing.T) func() {
		b.ep.IngressIsolated = true
		b.sync(t, policy.State{IPCache: ipcacheB, Entries: []policy.Entry{{
			Key:     policy.Key{Endpoint: b.pod.PodIP, Identity: ovIdentityA, Proto: 6, Port: ovEchoPort, PortBits: 16},
			Verdict: policy.VerdictAllow, RuleID: ovDenyRule,
		}}})
		return func() {
			b.ep.IngressIsolated = false
			b.sync(t, policy.State{IPCache: ipcacheB})
		}
	}

	t.Run("B admits only A's identity: the intruder X is dropped on B", func(t *testing.T) {
		defer admitOnlyA(t)()
		beforeB := counts(t, b.d)
		if err := dialOnly(x, netip.AddrPortFrom(b.pod.PodIP, ovEchoPort), time.Second); err == nil {
			t.Fatalf("the intruder X connected to pod B, which admits only A's identity")
		}
		counterDelta(t, b.d, beforeB, nil, "policy-not-allowed/from-uplink")
		ev := findFlow(t, frB, func(e FlowEvent) bool { return e.Verdict == "DROPPED" && e.Src == x.PodIP })
		if ev.Reason != "policy-not-allowed" || ev.Point != "from-uplink" || ev.SrcIdentity != nrIdentityX ||
			ev.DstIdentity != ovIdentityB || ev.Dst != b.pod.PodIP {
			t.Errorf("drop on B: %+v; want policy-not-allowed at from-uplink, source identity %d (X's)", ev, nrIdentityX)
		}
		if err := tcpEcho(a.pod, netip.AddrPortFrom(b.pod.PodIP, ovEchoPort), 1<<10); err != nil {
			t.Errorf("TCP from A, whose identity B admits: %v", err)
		}
	})

	t.Run("the node proxy's connection carries its client's identity to B", func(t *testing.T) {
		defer admitOnlyA(t)()
		// A process of node A in a cgroup with A's socket hooks, dialling
		// as the node proxy does: its socket marked with the client's
		// identity (the sockops program writes the option into the SYN).
		cg := testCgroup(t)
		if err := a.d.AttachSocketLB(cg); err != nil {
			t.Fatal(err)
		}
		proxy := startSockClient(t, cg, a.netns)
		echo := netip.AddrPortFrom(b.pod.PodIP, ovEchoPort)
		markOf := func(identity uint32) uint32 {
			m, ok := proxyapi.Mark{Magic: testProxyMark.Magic, Mask: testProxyMark.Mask}.For(identity)
			if !ok {
				t.Fatalf("identity %d does not fit the mark", identity)
			}
			return m
		}
		beforeA, beforeB := counts(t, a.d), counts(t, b.d)
		if ans := proxy.do("tcpline %s %d", echo, markOf(ovIdentityA)); !strings.HasPrefix(ans, "ok ") {
			t.Errorf("node A's proxy for pod A's identity to pod B, which admits it: %q, want connected", ans)
		}
		if ans := proxy.do("tcpline %s %d", echo, markOf(nrIdentityX)); strings.HasPrefix(ans, "ok ") {
			t.Errorf("node A's proxy for X's identity to pod B, which admits only A's: %q, want refused", ans)
		}
		if ans := proxy.do("tcpline %s 0", echo); strings.HasPrefix(ans, "ok ") {
			t.Errorf("node A's process without the mark to pod B: %q, want refused (remote-node)", ans)
		}
		// X's SYN is retransmitted until the dial gives up: each carries it.
		if d := counts(t, a.d)["identity-carried/connect"] - beforeA["identity-carried/connect"]; d < 2 {
			t.Errorf("node A counted %d SYNs carrying an identity, want at least 2", d)
		}
		if d := counts(t, b.d)["identity-carried/from-uplink"] - beforeB["identity-carried/from-uplink"]; d < 2 {
			t.Errorf("node B took %d carried identities, want at least 2", d)
		}
		ev := findFlow(t, frB, func(e FlowEvent) bool {
			return e.Event == "new" && e.Point == "from-uplink" && e.Src == a.node.NodeIP && e.SrcIdentity == ovIdentityA
		})
		if ev.Verdict != "FORWARDED" || ev.Dst != b.pod.PodIP {
			t.Errorf("the proxy's connection on B: %+v; want forwarded to pod B as A's identity", ev)
		}
		ev = findFlow(t, frB, func(e FlowEvent) bool {
			return e.Verdict == "DROPPED" && e.Src == a.node.NodeIP && e.SrcIdentity == nrIdentityX
		})
		if ev.Reason != "policy-not-allowed" {
			t.Errorf("the proxy's connection for X on B: %+v; want policy-not-allowed as X's identity", ev)
		}
	})

	t.Run("no route: the lookup fails and the stack takes the packet", func(t *testing.T) {
		syncRoutes(a, nil)
		defer syncRoutes(a, routesA)
		// Every packet reported: the echo's connection may be tracked
		// already, and a known connection's packet is no event by default.
		if err := a.d.SetFlowMode(FlowModeAll); err != nil {
			t.Fatal(err)
		}
		beforeA := counts(t, a.d)
		if err := ping(a.pod, b.pod.PodIP); err == nil {
			t.Errorf("ping from pod A reached pod B with node A's route to it removed")
		}
		counterDelta(t, a.d, beforeA, nil, "fib-lookup-failed/from-pod")
		ev := findFlow(t, frA, func(e FlowEvent) bool { return e.Reason == "fib-lookup-failed" })
		if ev.Verdict != "FORWARDED" || ev.Point != "from-pod" || ev.Src != a.pod.PodIP || ev.Dst != b.pod.PodIP {
			t.Errorf("flow of the failed lookup: %+v; want FORWARDED (to the stack) at from-pod, A to B", ev)
		}
	})

	t.Run("the node's teardown takes its routes on the underlay with it", func(t *testing.T) {
		err := netnsrun.Do(b.netns, func() error {
			if err := podnet.TeardownNode(podnet.Node{HostIf: b.node.HostIf}); err != nil {
				return err
			}
			out, err := exec.Command("ip", "route", "show", "proto", "0x53").CombinedOutput()
			if err != nil || len(strings.TrimSpace(string(out))) != 0 {
				t.Errorf("routes of shunt's on node B after its node interface went: %s %v; want none", out, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// sendUDP sends one datagram to to from the namespace at nsPath.
func sendUDP(nsPath string, to netip.AddrPort) error {
	return netnsrun.Do(nsPath, func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("routed"))
		return err
	})
}
