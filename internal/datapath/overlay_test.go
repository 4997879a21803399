package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
	"github.com/shuntnet/shunt/internal/teardown"
)

// The two-node overlay test builds, out of network namespaces, two nodes
// joined by an underlay veth pair, each with its own datapath (pins), its
// collect-metadata VXLAN device and one pod, and an intruder on a second
// underlay link to node B that forges overlay packets:
//
//	pod A ── node A ══ underlay 10.77.0.0/24 ══ node B ── pod B
//	10.244.1.10   10.77.0.1          10.77.0.2 │ 10.78.0.2   10.244.2.10
//	                                           └── intruder 10.78.0.3
const (
	ovPort       = 4789
	ovVXLAN      = "shunt_vxlan"
	ovIdentityA  = 300
	ovIdentityB  = 301
	ovDenyRule   = 77
	ovEchoPort   = 8080 // pod B: open
	ovDeniedPort = 9090 // pod B: denied to A when the test says so
	ovBackPort   = 8081 // pod A: what B dials when its egress is isolated
	ovSpoofPort  = 9999 // pod B: UDP the intruder's packets are for
)

// ovNode is one node of the test: its namespace, datapath and pod.
type ovNode struct {
	name      string
	netns     string // the node's network namespace (path)
	underlay  netip.Addr
	d         *Datapath
	node      podnet.Node
	vxIfindex int
	pod       podnet.Pod
	ep        Endpoint
	extra     []Endpoint // the node's other pods (addPod)
}

// TestOverlayTwoNodes: pods of two nodes reach each other through the
// VXLAN overlay (ICMP echo, TCP with data); the receiving node judges its
// pod's ingress with the sender's identity from the VNI (a deny drops it
// there, named with that identity); a reply passes the receiving pod's
// egress isolation through the connection the inbound SYN opened; overlay
// packets whose outer source is not the node hosting their inner source, or
// whose VNI is no pod identity, are dropped as tunnel-spoofed.
//
// Each twice: with the VXLAN device decapsulating, and with the uplink
// programs attached as on a node with an underlay address, where the
// uplink hands the overlay's packets to shunt_from_overlay_wire, which
// takes the plain ones off the wire itself (GSO ones still go through the
// device): every case must hold either way.
func TestOverlayTwoNodes(t *testing.T) {
	requireBPF(t)
	for _, mode := range []Mode{ModeRedirectPeer, ModeRedirect} {
		for _, wire := range []bool{false, true} {
			name := string(mode)
			if wire {
				name += "/off-the-wire"
			}
			t.Run(name, func(t *testing.T) { testOverlayTwoNodes(t, mode, wire) })
		}
	}
}

// vxlanPackets is what node n's VXLAN device has received and sent.
func vxlanPackets(t *testing.T, n *ovNode) (rx, tx uint64) {
	t.Helper()
	if err := netnsrun.Do(n.netns, func() error {
		l, err := netlink.LinkByIndex(n.vxIfindex)
		if err != nil {
			return err
		}
		rx, tx = l.Attrs().Statistics.RxPackets, l.Attrs().Statistics.TxPackets
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rx, tx
}

func testOverlayTwoNodes(t *testing.T, mode Mode, wire bool) {
	a, b := newOvNodesWith(t, mode, false, wire, 1450)
	nsX := testNetns(t)
	veth(t, nsX, "ul-x", netip.MustParsePrefix("10.78.0.3/24"), b.netns, "ul-xb", netip.MustParsePrefix("10.78.0.2/24"))
	ipcache := ovIPCache
	a.sync(t, policy.State{IPCache: ipcache(a, b)})
	b.sync(t, policy.State{IPCache: ipcache(b, a)})
	fr := b.flows(t)

	echoServer(t, b.pod, netip.AddrPortFrom(b.pod.PodIP, ovEchoPort))
	echoServer(t, b.pod, netip.AddrPortFrom(b.pod.PodIP, ovDeniedPort))
	echoServer(t, a.pod, netip.AddrPortFrom(a.pod.PodIP, ovBackPort))

	t.Run("ping and TCP across the overlay", func(t *testing.T) {
		beforeA, beforeB := counts(t, a.d), counts(t, b.d)
		_, txA := vxlanPackets(t, a)
		rxB, _ := vxlanPackets(t, b)
		if err := ping(a.pod, b.pod.PodIP); err != nil {
			t.Fatalf("ping %s from pod A: %v", b.pod.PodIP, err)
		}
		// Off the wire, BPF builds and takes the encapsulation on both
		// sides: neither device sees the ping.
		_, txA2 := vxlanPackets(t, a)
		rxB2, _ := vxlanPackets(t, b)
		if tx := txA2 - txA; (tx == 0) != wire {
			t.Errorf("A's VXLAN device sent %d packets for the ping; want none off the wire (A's pod program encapsulated it), some without", tx)
		}
		if rx := rxB2 - rxB; (rx == 0) != wire {
			t.Errorf("B's VXLAN device received %d packets for the ping; want none off the wire (B's uplink took it), some without", rx)
		}
		if err := tcpEcho(a.pod, netip.AddrPortFrom(b.pod.PodIP, ovEchoPort), 256<<10); err != nil {
			t.Fatalf("TCP from pod A to pod B: %v", err)
		}
		counterDelta(t, a.d, beforeA, nil, "to-tunnel/from-pod", "forwarded/from-overlay")
		counterDelta(t, b.d, beforeB, nil, "to-tunnel/from-pod", "forwarded/from-overlay")
		ev := findFlow(t, fr, func(e FlowEvent) bool {
			return e.Event == "new" && e.Point == "from-overlay" && e.Proto == 6 && e.DstPort == ovEchoPort
		})
		if ev.SrcIdentity != ovIdentityA || ev.DstIdentity != ovIdentityB || ev.Src != a.pod.PodIP || ev.Verdict != "FORWARDED" {
			t.Errorf("new connection on B: %+v; want source identity %d (the VNI), destination %d", ev, ovIdentityA, ovIdentityB)
		}
		// B recorded it as one the tc translation left alone: B's pod's
		// answers skip the translation's lookups.
		k := ctKeyOf(ev.Src, ev.SrcPort, ev.Dst, ev.DstPort, 6)
		if f, ok := connFlags(b.d, k); !ok || f&uint32(podtcCtFlagsCT_F_NO_TC_NAT) == 0 {
			t.Errorf("the connection on B: conntrack flags %s (recorded: %v), want no-tc-nat", flagsText(f, ctFlagNames), ok)
		}
	})

	t.Run("B's ingress denies A's identity: dropped on B", func(t *testing.T) {
		b.ep.IngressRules = true
		b.sync(t, policy.State{IPCache: ipcache(b, a), Entries: []policy.Entry{{
			Key:     policy.Key{Endpoint: b.pod.PodIP, Identity: ovIdentityA, Proto: 6, Port: ovDeniedPort, PortBits: 16},
			Verdict: policy.VerdictDeny, RuleID: ovDenyRule,
		}}})
		beforeB := counts(t, b.d)
		if err := dialOnly(a.pod, netip.AddrPortFrom(b.pod.PodIP, ovDeniedPort), time.Second); err == nil {
			t.Fatalf("TCP to %d connected through a deny", ovDeniedPort)
		}
		counterDelta(t, b.d, beforeB, nil, "policy-denied/from-overlay")
		ev := findFlow(t, fr, func(e FlowEvent) bool { return e.Verdict == "DROPPED" && e.DstPort == ovDeniedPort })
		if ev.Reason != "policy-denied" || ev.Point != "from-overlay" || ev.SrcIdentity != ovIdentityA || ev.RuleID != ovDenyRule ||
			ev.Src != a.pod.PodIP || ev.Dst != b.pod.PodIP {
			t.Errorf("drop on B: %+v; want policy-denied at from-overlay, source identity %d, rule %d", ev, ovIdentityA, ovDenyRule)
		}
		// The deny names one port: the rest stays open.
		if err := tcpEcho(a.pod, netip.AddrPortFrom(b.pod.PodIP, ovEchoPort), 1<<10); err != nil {
			t.Errorf("TCP to %d beside the deny: %v", ovEchoPort, err)
		}
	})

	t.Run("B isolated for egress: its replies pass, its own connections do not", func(t *testing.T) {
		b.ep.EgressIsolated, b.ep.IngressRules = true, false
		b.sync(t, policy.State{IPCache: ipcache(b, a)})
		beforeB := counts(t, b.d)
		if err := tcpEcho(a.pod, netip.AddrPortFrom(b.pod.PodIP, ovEchoPort), 64<<10); err != nil {
			t.Fatalf("TCP from A to B, whose egress is isolated: %v", err)
		}
		if err := dialOnly(b.pod, netip.AddrPortFrom(a.pod.PodIP, ovBackPort), time.Second); err == nil {
			t.Errorf("B connected to A with its egress isolated and no rule")
		}
		counterDelta(t, b.d, beforeB, nil, "to-tunnel/from-pod", "policy-not-allowed/from-pod")
		b.ep.EgressIsolated = false
		b.sync(t, policy.State{IPCache: ipcache(b, a)})
	})

	t.Run("a service on A with its backend on B (tc path)", func(t *testing.T) {
		// No socket hook runs here (none is attached): node A's tc path
		// translates pod A's connection to the VIP, and the replies,
		// which come back through the overlay, get the VIP back.
		vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), 80)
		if _, err := a.d.SyncServices([]services.Port{{Frontend: services.Frontend{VIP: vip.Addr(), Port: vip.Port(), Proto: 6},
			Name: "test/web:80", Backends: []services.Backend{{IP: b.pod.PodIP, Port: ovEchoPort}}}}); err != nil {
			t.Fatal(err)
		}
		defer a.d.SyncServices(nil)
		beforeA := counts(t, a.d)
		if err := tcpEcho(a.pod, vip, 64<<10); err != nil {
			t.Fatalf("TCP from pod A to the VIP %s, backend on B: %v", vip, err)
		}
		counterDelta(t, a.d, beforeA, nil, "service-translated/from-pod", "service-translated/from-overlay")
	})

	t.Run("for no pod of the node: the node's stack takes it", func(t *testing.T) {
		// An address of node B's own that A reaches through the overlay
		// (A's ipcache says so): B's stack, not a pod, receives it.
		nodeB := netip.AddrPortFrom(netip.MustParseAddr("10.244.2.1"), 7777)
		a.sync(t, policy.State{IPCache: append(ipcache(a, b),
			policy.PrefixIdentity{Prefix: netip.PrefixFrom(nodeB.Addr(), 32), Identity: policy.IdentityWorld, Tunnel: b.underlay})})
		defer a.sync(t, policy.State{IPCache: ipcache(a, b)})
		var l *net.UDPConn
		if err := netnsrun.Do(b.netns, func() (err error) {
			l, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(nodeB))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		beforeB := counts(t, b.d)
		if err := netnsrun.Do(podnet.NetnsPath(a.pod.Netns), func() error {
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(nodeB))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("to the node"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if !readUDP(l, 2*time.Second) {
			t.Errorf("node B's stack did not receive what pod A sent to %s through the overlay (B: %v)", nodeB, counts(t, b.d))
		}
		counterDelta(t, b.d, beforeB, map[string]uint64{"to-stack/from-overlay": 1})
	})

	t.Run("forged overlay packets are dropped as tunnel-spoofed", func(t *testing.T) {
		udp := listenUDP(t, b.pod, netip.AddrPortFrom(b.pod.PodIP, ovSpoofPort))
		frame := packet(a.pod.PodIP, b.pod.PodIP, 17, udpDatagram(5555, ovSpoofPort))
		for _, c := range []struct {
			name  string
			outer netip.Addr
			vni   uint32
			want  string // the counter on B
		}{
			// A pod of node A, from an address that is not node A.
			{"wrong outer source", netip.MustParseAddr("10.78.0.3"), ovIdentityA, "tunnel-spoofed/from-overlay"},
			// Node A's address (forged on the intruder's own link), with
			// an identity no pod has: the reserved "world".
			{"no pod identity", a.underlay, policy.IdentityWorld, "tunnel-spoofed/from-overlay"},
			// The control: the same path with node A's address and A's
			// identity is delivered, so the drops above are the rules'.
			// (An underlay address forged this well is beyond what the
			// overlay can tell; the underlay must not let it through.)
			{"control: node A's address and identity", a.underlay, ovIdentityA, "forwarded/from-overlay"},
		} {
			before := counts(t, b.d)
			if err := forgeOverlay(nsX, c.outer, b.underlay, c.vni, frame); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			got := waitCounter(t, b.d, before, c.want, 2*time.Second)
			if !got {
				t.Errorf("%s: counter %s did not move on B (all: %v)", c.name, c.want, counts(t, b.d))
			}
			delivered := readUDP(udp, 300*time.Millisecond)
			if want := c.want == "forwarded/from-overlay"; delivered != want {
				t.Errorf("%s: delivered to pod B %v, want %v", c.name, delivered, want)
			}
			if c.want == "tunnel-spoofed/from-overlay" {
				ev := findFlow(t, fr, func(e FlowEvent) bool { return e.Reason == "tunnel-spoofed" && e.DstPort == ovSpoofPort })
				if ev.Verdict != "DROPPED" || ev.SrcIdentity != c.vni || ev.Src != a.pod.PodIP || ev.Point != "from-overlay" {
					t.Errorf("%s: flow %+v; want DROPPED at from-overlay, source identity %d (the VNI)", c.name, ev, c.vni)
				}
			}
		}
	})
}

// newOvNodes builds the two nodes of the drawing above, without the
// intruder: namespaces joined by an underlay veth pair (MTU 1500), one pod
// each (identities ovIdentityA and B), pods routing the cluster's
// 10.244.0.0/16 and the services' 10.96.0.0/16 to their node, with podMTU
// (0: 1500); native: routed without encapsulation.
func newOvNodes(t *testing.T, mode Mode, native bool, podMTU int) (a, b *ovNode) {
	t.Helper()
	return newOvNodesWith(t, mode, native, false, podMTU)
}

// newOvNodesWith is newOvNodes with, when wire, the uplink programs
// attached beside the overlay's (for NodePort, as the agent attaches them
// on a node with an underlay address) and the tunnel endpoint configured:
// the overlay's packets are taken off the wire by the overlay program the
// uplink program calls.
func newOvNodesWith(t *testing.T, mode Mode, native, wire bool, podMTU int) (a, b *ovNode) {
	t.Helper()
	podCIDR := netip.MustParsePrefix("10.244.0.0/16") // the cluster's: both pods route it to their node
	services := netip.MustParsePrefix("10.96.0.0/16")
	nsA, nsB := testNetns(t), testNetns(t)
	veth(t, nsA, "ul-a", netip.MustParsePrefix("10.77.0.1/24"), nsB, "ul-b", netip.MustParsePrefix("10.77.0.2/24"))
	a = newOvNode(t, "a", nsA, mode, native, wire, netip.MustParseAddr("10.77.0.1"),
		podnet.Node{PodCIDR: podCIDR, NodeIP: netip.MustParseAddr("10.244.1.1"), HostIf: "shunt_host", MTU: podMTU, ServiceCIDR: services},
		netip.MustParseAddr("10.244.1.10"), ovIdentityA)
	b = newOvNode(t, "b", nsB, mode, native, wire, netip.MustParseAddr("10.77.0.2"),
		podnet.Node{PodCIDR: podCIDR, NodeIP: netip.MustParseAddr("10.244.2.1"), HostIf: "shunt_host", MTU: podMTU, ServiceCIDR: services},
		netip.MustParseAddr("10.244.2.10"), ovIdentityB)
	return a, b
}

// ovIPCache is the ipcache of node local with the overlay: its own pods
// as local entries, the remote node's behind that node's underlay address.
func ovIPCache(local, remote *ovNode) []policy.PrefixIdentity {
	var entries []policy.PrefixIdentity
	for _, ep := range append([]Endpoint{local.ep}, local.extra...) {
		entries = append(entries, policy.PrefixIdentity{Prefix: netip.PrefixFrom(ep.IP, 32), Identity: ep.Identity})
	}
	for _, ep := range append([]Endpoint{remote.ep}, remote.extra...) {
		entries = append(entries, policy.PrefixIdentity{Prefix: netip.PrefixFrom(ep.IP, 32), Identity: ep.Identity, Tunnel: remote.underlay})
	}
	return entries
}

// newOvNode builds a node inside its namespace: the node interface, the
// VXLAN device (or, native, none: the underlay interface carries pods'
// packets as they are), one pod, a datapath with its own pins, the pod and
// overlay (native: uplink; wire: both) programs attached.
func newOvNode(t *testing.T, name, nodeNetns string, mode Mode, native, wire bool, underlay netip.Addr, node podnet.Node, podIP netip.Addr, identity uint32) *ovNode {
	t.Helper()
	n := &ovNode{name: name, netns: nodeNetns, underlay: underlay, node: node}
	pinDir := filepath.Join("/sys/fs/bpf", testName("shunt-test-overlay-"+name))
	t.Cleanup(func() {
		if n.d != nil {
			n.d.Close()
		}
		if err := teardown.Pins(pinDir); err != nil {
			t.Error(err)
		}
	})
	err := netnsrun.Do(nodeNetns, func() error {
		if err := podnet.SetupNode(node); err != nil {
			return err
		}
		cfg := Config{PinDir: pinDir, Mode: mode, ProxyMark: testProxyMark}
		var uplink string
		if native {
			var err error
			if uplink, cfg.NativeIfindex, err = UplinkOf(underlay); err != nil {
				return err
			}
		} else {
			vx, err := EnsureVXLAN(ovVXLAN, underlay, ovPort)
			if err != nil {
				return err
			}
			// Opening it again adopts the device.
			if again, err := EnsureVXLAN(ovVXLAN, underlay, ovPort); err != nil || again != vx {
				return fmt.Errorf("EnsureVXLAN again: ifindex %d, %v; want %d (adopted)", again, err, vx)
			}
			n.vxIfindex, cfg.TunnelIfindex, cfg.NodeIP = vx, vx, node.NodeIP
			if wire {
				var ulIndex int
				if uplink, ulIndex, err = UplinkOf(underlay); err != nil {
					return err
				}
				cfg.TunnelEndpoint, cfg.TunnelUnderlayIfindex = netip.AddrPortFrom(underlay, ovPort), ulIndex
				// As the agent does (enableUplinkForwarding): bpf_fib_lookup
				// routes nothing out of a device that does not forward.
				if out, err := exec.Command("sysctl", "-qw", "net.ipv4.conf."+uplink+".forwarding=1").CombinedOutput(); err != nil {
					return fmt.Errorf("enabling forwarding on %s: %v: %s", uplink, err, out)
				}
				cfg.NodePort = &NodePort{UplinkIfindex: ulIndex, SNATAddr: node.NodeIP, Ports: npPorts, Mode: dpinfo.NodePortSNAT}
			}
		}
		var err error
		if n.d, err = Open(thisKernel(t, cfg)); err != nil {
			return err
		}
		if native {
			return n.d.AttachUplink(uplink, cfg.NativeIfindex)
		}
		if wire {
			if err := n.d.AttachUplink(uplink, cfg.NodePort.UplinkIfindex); err != nil {
				return err
			}
		}
		return n.d.AttachOverlay(ovVXLAN, n.vxIfindex)
	})
	if err != nil {
		t.Fatalf("node %s: %v", name, err)
	}
	n.pod, n.ep = n.addPod(t, name, podIP, identity)
	hooks, err := n.d.Hooks()
	want := "from-overlay"
	if native {
		want = "from-uplink"
	}
	if err != nil || hooks[want] != 1 || hooks["from-pod"] != 1 {
		t.Fatalf("node %s: hooks %v, %v; want one %s and one from-pod", name, hooks, err, want)
	}
	return n
}

// addPod plumbs a pod of the node, its programs attached; the node's
// first pod is n.pod, any other is synced with it (n.extra).
func (n *ovNode) addPod(t *testing.T, name string, podIP netip.Addr, identity uint32) (podnet.Pod, Endpoint) {
	t.Helper()
	pod := podnet.Pod{Netns: testName("shunt-test-ovpod-" + name), HostIf: "pod-" + name, PodIP: podIP}
	t.Cleanup(func() {
		if err := podnet.DeleteNetns(pod.Netns); err != nil {
			t.Error(err)
		}
	})
	var ep Endpoint
	err := netnsrun.Do(n.netns, func() error {
		links, err := podnet.SetupPod(n.node, pod)
		if err != nil {
			return err
		}
		ep = Endpoint{IP: podIP, Ifindex: links.HostIfindex, PodMAC: links.PodMAC, NodeMAC: links.HostMAC, Identity: identity}
		return n.d.AttachPod(pod.HostIf, links.HostIfindex)
	})
	if err != nil {
		t.Fatalf("node %s, pod %s: %v", n.name, name, err)
	}
	if n.pod.PodIP.IsValid() {
		n.extra = append(n.extra, ep)
	}
	return pod, ep
}

// flows turns the node's default flow events on and reads them until the
// test ends.
func (n *ovNode) flows(t *testing.T) *FlowReader {
	t.Helper()
	return defaultFlows(t, n.d)
}

// defaultFlows turns d's default flow events on and reads them until the
// test ends.
func defaultFlows(t *testing.T, d *Datapath) *FlowReader {
	t.Helper()
	if err := d.SetFlowMode(FlowModeDefault); err != nil {
		t.Fatal(err)
	}
	fr, err := d.Flows()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fr.Close() })
	return fr
}

func (n *ovNode) sync(t *testing.T, state policy.State) {
	t.Helper()
	if err := n.d.SyncPolicy(state, append([]Endpoint{n.ep}, n.extra...)); err != nil {
		t.Fatalf("node %s: %v", n.name, err)
	}
}

// veth joins two namespaces with a veth pair, an address on each end.
func veth(t testing.TB, nsA, ifA string, addrA netip.Prefix, nsB, ifB string, addrB netip.Prefix) {
	t.Helper()
	peerNS, err := netns.GetFromPath(nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer peerNS.Close()
	up := func(ifname string, addr netip.Prefix) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(addr)}); err != nil {
			return fmt.Errorf("adding %s to %s: %w", addr, ifname, err)
		}
		return netlink.LinkSetUp(l)
	}
	err = netnsrun.Do(nsA, func() error {
		la := netlink.NewLinkAttrs()
		la.Name = ifA
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: ifB, PeerNamespace: netlink.NsFd(int(peerNS))}); err != nil {
			return fmt.Errorf("creating veth %s/%s: %w", ifA, ifB, err)
		}
		return up(ifA, addrA)
	})
	if err == nil {
		err = netnsrun.Do(nsB, func() error { return up(ifB, addrB) })
	}
	if err != nil {
		t.Fatal(err)
	}
}

// echoServer answers every TCP connection to addr in the pod with what it
// receives, until the test ends.
func echoServer(t *testing.T, pod podnet.Pod, addr netip.AddrPort) {
	t.Helper()
	var l net.Listener
	err := netnsrun.Do(podnet.NetnsPath(pod.Netns), func() error {
		var err error
		l, err = net.Listen("tcp4", addr.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
}

// dial connects from inside the pod (the socket stays in its namespace).
func dial(pod podnet.Pod, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netnsrun.Do(podnet.NetnsPath(pod.Netns), func() error {
		var err error
		c, err = net.DialTimeout("tcp4", to.String(), timeout)
		return err
	})
	return c, err
}

// dialOnly tries to connect and closes at once.
func dialOnly(pod podnet.Pod, to netip.AddrPort, timeout time.Duration) error {
	c, err := dial(pod, to, timeout)
	if err == nil {
		c.Close()
	}
	return err
}

// tcpEcho sends size bytes over a new connection and checks they come back.
func tcpEcho(pod podnet.Pod, to netip.AddrPort, size int) error {
	c, err := dial(pod, to, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	out := make([]byte, size)
	for i := range out {
		out[i] = byte(i * 7)
	}
	werr := make(chan error, 1)
	go func() { _, err := c.Write(out); werr <- err }()
	in := make([]byte, size)
	if _, err := io.ReadFull(c, in); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	if !bytes.Equal(in, out) {
		return errors.New("the echo differs from what was sent")
	}
	return nil
}

// ping sends one ICMP echo request from the pod and waits for its reply.
func ping(pod podnet.Pod, to netip.Addr) error {
	var conn net.PacketConn
	err := netnsrun.Do(podnet.NetnsPath(pod.Netns), func() error {
		var err error
		conn, err = net.ListenPacket("ip4:icmp", pod.PodIP.String())
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	const id, seq = 0x5a5a, 1
	req := []byte{8, 0, 0, 0, id >> 8, id & 0xff, 0, seq, 'o', 'v', 'e', 'r', 'l', 'a', 'y', '!'} // even length: ipChecksum sums 16-bit words
	binary.BigEndian.PutUint16(req[2:], ipChecksum(req))
	if _, err := conn.WriteTo(req, &net.IPAddr{IP: to.AsSlice()}); err != nil {
		return err
	}
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("no echo reply: %w", err)
		}
		if n >= 8 && buf[0] == 0 && binary.BigEndian.Uint16(buf[4:]) == id && from.String() == to.String() {
			return nil
		}
	}
}

// listenUDP opens a UDP socket in the pod, closed when the test ends.
func listenUDP(t *testing.T, pod podnet.Pod, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := netnsrun.Do(podnet.NetnsPath(pod.Netns), func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readUDP says whether a datagram arrives within wait (and drains it).
func readUDP(c *net.UDPConn, wait time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 64)
	_, err := c.Read(buf)
	return err == nil
}

// forgeOverlay sends frame (an Ethernet frame) to the VXLAN port of remote
// from the intruder's namespace, encapsulated by an ordinary (not
// collect-metadata) VXLAN device with this VNI and outer source. The device
// is deleted afterwards.
func forgeOverlay(intruderNetns string, outer, remote netip.Addr, vni uint32, frame []byte) error {
	return netnsrun.Do(intruderNetns, func() error {
		ul, err := netlink.LinkByName("ul-x")
		if err != nil {
			return err
		}
		// The outer source must be an address of the intruder's
		// namespace for the kernel to send from it.
		if _, err := underlayLink(outer); err != nil {
			if err := netlink.AddrAdd(ul, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(outer, 32))}); err != nil {
				return fmt.Errorf("adding %s: %w", outer, err)
			}
		}
		la := netlink.NewLinkAttrs()
		la.Name = "forge"
		vx := &netlink.Vxlan{LinkAttrs: la, VxlanId: int(vni), SrcAddr: outer.AsSlice(), Group: remote.AsSlice(),
			Port: ovPort, VtepDevIndex: ul.Attrs().Index}
		if err := netlink.LinkAdd(vx); err != nil {
			return fmt.Errorf("creating the forging VXLAN device: %w", err)
		}
		defer netlink.LinkDel(vx)
		l, err := netlink.LinkByName("forge")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		// A packet socket hands the frame to the device as it is: the
		// inner source address is whatever the frame says.
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Protocol: htons(unix.ETH_P_IP)})
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// waitCounter waits until a counter moved since before.
func waitCounter(t *testing.T, d *Datapath, before map[string]uint64, counter string, wait time.Duration) bool {
	t.Helper()
	for end := time.Now().Add(wait); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if counts(t, d)[counter] > before[counter] {
			return true
		}
	}
	return false
}

// findFlow reads flow events until one matches (failing the test after a
// few seconds without one); events before it are skipped.
func findFlow(t *testing.T, fr *FlowReader, match func(FlowEvent) bool) FlowEvent {
	t.Helper()
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		fr.r.SetDeadline(time.Now().Add(100 * time.Millisecond))
		if err := fr.r.ReadInto(&fr.rec); err != nil {
			continue
		}
		e, err := decodeFlow(fr.rec.RawSample, fr.boot)
		if err != nil {
			t.Fatal(err)
		}
		if match(e) {
			return e
		}
	}
	t.Fatalf("no matching flow event within 3s")
	return FlowEvent{}
}

// overlayPins is a pin directory of the test's own, removed when it ends.
func overlayPins(t *testing.T, name string) string {
	pinDir := filepath.Join("/sys/fs/bpf", testName("shunt-test-overlay-"+name))
	t.Cleanup(func() {
		if err := teardown.Pins(pinDir); err != nil {
			t.Error(err)
		}
	})
	return pinDir
}

// addLoopback puts addresses (/32) on the calling thread's namespace's
// loopback: an underlay address for a node that needs no real underlay.
func addLoopback(addrs ...netip.Addr) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, 32))}); err != nil {
			return err
		}
	}
	return nil
}

// TestEnsureVXLANRefuses: EnsureVXLAN adopts only a device it could have
// made, and names what is wrong otherwise.
func TestEnsureVXLANRefuses(t *testing.T) {
	requireBPF(t)
	ns := testNetns(t)
	ul := netip.MustParseAddr("10.77.0.1")
	err := netnsrun.Do(ns, func() error {
		if err := addLoopback(ul); err != nil {
			return err
		}
		la := netlink.NewLinkAttrs()
		la.Name = "classic"
		if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: la, VxlanId: 7, Port: ovPort}); err != nil {
			return err
		}
		if _, err := EnsureVXLAN("vx", ul, ovPort); err != nil {
			return err
		}
		for _, c := range []struct {
			name     string
			underlay netip.Addr
			port     int
			want     string
		}{
			{"vx", netip.MustParseAddr("10.77.0.9"), ovPort, "not an address of this node"},
			{"vx", netip.MustParseAddr("fd00::1"), ovPort, "IPv4 underlay"},
			{"vx", ul, 0, "UDP port 0"},
			{"vx", ul, 4790, "not a collect-metadata VXLAN device on UDP port 4790"},
			{"classic", ul, ovPort, "(type vxlan, collect-metadata false, port 4789)"},
			{"lo", ul, ovPort, "(type device)"},
		} {
			_, err := EnsureVXLAN(c.name, c.underlay, c.port)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("EnsureVXLAN(%s, %s, %d): %v; want an error saying %q", c.name, c.underlay, c.port, err, c.want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAttachOverlayAdopts: a restarted agent (a second Open on the same
// pins) adopts the pinned overlay link and switches it to its program,
// leaving one attachment; DetachOverlay removes it. The tc fallback's
// restart (a filter replaced in place) is TestClsBPFFallback's.
func TestAttachOverlayAdopts(t *testing.T) {
	requireKernelFeature(t, dpinfo.FallbackTC)
	ns := testNetns(t)
	pinDir := overlayPins(t, "adopt")
	ul := netip.MustParseAddr("10.77.0.1")
	err := netnsrun.Do(ns, func() error {
		if err := addLoopback(ul); err != nil {
			return err
		}
		vx, err := EnsureVXLAN(ovVXLAN, ul, ovPort)
		if err != nil {
			return err
		}
		var progIDs []ebpf.ProgramID
		for range 2 {
			d, err := Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, TunnelIfindex: vx, NodeIP: testNodeIP}))
			if err != nil {
				return err
			}
			defer d.Close()
			if err := d.AttachOverlay(ovVXLAN, vx); err != nil {
				return err
			}
			info, err := d.overlay.ShuntFromOverlay.Info()
			if err != nil {
				return err
			}
			id, _ := info.ID()
			progIDs = append(progIDs, id)
		}
		l, err := link.LoadPinnedLink(filepath.Join(pinDir, "links", "from-overlay-"+ovVXLAN), nil)
		if err != nil {
			return err
		}
		info, err := l.Info()
		l.Close() // a link lives while a pin or a descriptor holds it
		if err != nil {
			return err
		}
		if info.Program != progIDs[1] || progIDs[0] == progIDs[1] {
			t.Errorf("pinned link runs program %d; the restarted agent's is %d (the first's %d)", info.Program, progIDs[1], progIDs[0])
		}
		tcx, err := link.QueryPrograms(link.QueryOptions{Target: vx, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		if len(tcx.Programs) != 1 {
			t.Errorf("%d programs at tcx ingress of %s, want 1", len(tcx.Programs), ovVXLAN)
		}
		d, err := Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, TunnelIfindex: vx, NodeIP: testNodeIP}))
		if err != nil {
			return err
		}
		defer d.Close()
		if err := d.DetachOverlay(ovVXLAN); err != nil {
			return err
		}
		if tcx, err := link.QueryPrograms(link.QueryOptions{Target: vx, Attach: ebpf.AttachTCXIngress}); err != nil || len(tcx.Programs) != 0 {
			t.Errorf("after DetachOverlay: %+v, %v; want no program", tcx, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSyncTunnelRoutes: the node's routes to other nodes' pods sit on the
// overlay device with their tunnel key (encap ip id 6 dst NODE), a second
// sync with one node fewer removes that node's route and only that one (a
// route of someone else on the device stays), and ARP is off on the device.
func TestSyncTunnelRoutes(t *testing.T) {
	requireBPF(t)
	ns := testNetns(t)
	pinDir := overlayPins(t, "routes")
	ul, src := netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("10.78.0.1")
	err := netnsrun.Do(ns, func() error {
		if err := addLoopback(ul, src); err != nil {
			return err
		}
		vx, err := EnsureVXLAN(ovVXLAN, ul, ovPort)
		if err != nil {
			return err
		}
		d, err := Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, TunnelIfindex: vx, NodeIP: testNodeIP}))
		if err != nil {
			return err
		}
		defer d.Close()
		theirs := &netlink.Route{LinkIndex: vx, Dst: prefixNet(netip.MustParsePrefix("10.99.0.0/24")), Scope: netlink.SCOPE_LINK}
		if err := netlink.RouteAdd(theirs); err != nil {
			return err
		}
		two := []TunnelRoute{
			{PodCIDR: netip.MustParsePrefix("10.78.1.0/24"), Node: netip.MustParseAddr("10.77.0.2")},
			{PodCIDR: netip.MustParsePrefix("10.78.2.0/24"), Node: netip.MustParseAddr("10.77.0.3")},
		}
		routes := func() string {
			out, err := exec.Command("ip", "-d", "route", "show", "dev", ovVXLAN).CombinedOutput()
			if err != nil {
				t.Fatalf("ip route: %v\n%s", err, out)
			}
			return string(out)
		}
		if _, err := d.SyncTunnelRoutes(src, two); err != nil {
			return err
		}
		got := routes()
		for _, want := range []string{"10.78.1.0/24", "id 6 src 0.0.0.0 dst 10.77.0.2", "10.78.2.0/24", "dst 10.77.0.3", "src 10.78.0.1", "10.99.0.0/24"} {
			if !strings.Contains(got, want) {
				t.Errorf("routes on %s:\n%s\nwant %q", ovVXLAN, got, want)
			}
		}
		if _, err := d.SyncTunnelRoutes(src, two[:1]); err != nil {
			return err
		}
		got = routes()
		if strings.Contains(got, "10.78.2.0/24") || !strings.Contains(got, "10.78.1.0/24") || !strings.Contains(got, "10.99.0.0/24") {
			t.Errorf("after the second node left, routes on %s:\n%s\nwant 10.78.1.0/24 and the foreign 10.99.0.0/24 only", ovVXLAN, got)
		}
		l, err := netlink.LinkByIndex(vx)
		if err != nil {
			return err
		}
		if l.Attrs().RawFlags&unix.IFF_NOARP == 0 {
			t.Errorf("ARP is on for %s", ovVXLAN)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
