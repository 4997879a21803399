package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// The NodePort unit tests run the uplink and pod programs on crafted
// packets, in a namespace of their own whose uplink "np-ul" holds the
// node's address 192.0.2.1/24 (the client 192.0.2.9 is on that link, its
// MAC known), with native routing to another node 192.0.2.2 whose pods
// are 10.98.0.0/24. The node's pod-network address, the source of SNATed
// flows, is 10.99.0.1; its pod 10.99.0.10.
var (
	npNode      = netip.MustParseAddr("192.0.2.1")
	npClient    = netip.MustParseAddr("192.0.2.9")
	npOtherNode = netip.MustParseAddr("192.0.2.2")
	npSNAT      = netip.MustParseAddr("10.99.0.1")
	npLocalPod  = netip.MustParseAddr("10.99.0.10")
	npRemotePod = netip.MustParseAddr("10.98.0.20")
	npLB        = netip.MustParseAddr("192.0.2.100")
	npPorts     = PortRange{Min: 61000, Max: 61001}
)

// skbContext is the start of struct __sk_buff a test run may set: the
// packet arrives on ifindex (ingress_ifindex too), as it would on the
// uplink.
func skbContext(ifindex int) []byte {
	ctx := make([]byte, 44)
	binary.NativeEndian.PutUint32(ctx[36:], uint32(ifindex)) // ingress_ifindex
	binary.NativeEndian.PutUint32(ctx[40:], uint32(ifindex)) // ifindex
	return ctx
}

// nodePortTestNode lays out the namespace the NodePort tests run in and
// opens a datapath on it with maglevSize (0: random backends), its pod
// npLocalPod and npRemotePod on the other node in the ipcache.
func nodePortTestNode(t *testing.T, maglevSize int) (d *Datapath, ns string, uplink int) {
	return nodePortTestNodeMode(t, maglevSize, dpinfo.NodePortSNAT)
}

// nodePortTestNodeMode is nodePortTestNode with flows to backends on the
// other node going as mode says (DSR from npNode).
func nodePortTestNodeMode(t *testing.T, maglevSize int, mode dpinfo.NodePortMode) (d *Datapath, ns string, uplink int) {
	return nodePortTestNodeWith(t, maglevSize, mode, nil)
}

// nodePortTestNodeWith is nodePortTestNodeMode taking the kernel
// fallbacks given.
func nodePortTestNodeWith(t *testing.T, maglevSize int, mode dpinfo.NodePortMode, fallbacks dpinfo.Fallbacks) (d *Datapath, ns string, uplink int) {
	return nodePortTestNodeRouted(t, maglevSize, mode, fallbacks, false)
}

// nodePortTestNodeRouted is nodePortTestNodeWith with the VXLAN overlay
// (tunnel: a collect-metadata VXLAN device on the uplink's address and
// ovPort, MTU fragTunnelMTU, the pods' MTU) instead of native routing,
// the configuration changed by adjust before the datapath opens.
func nodePortTestNodeRouted(t testing.TB, maglevSize int, mode dpinfo.NodePortMode, fallbacks dpinfo.Fallbacks, tunnel bool,
	adjust ...func(*Config)) (d *Datapath, ns string, uplink int) {
	requireBPF(t)
	var vx int
	ns, peer := testNetns(t), testNetns(t)
	veth(t, ns, "np-ul", netip.PrefixFrom(npNode, 24), peer, "np-out", netip.PrefixFrom(npClient, 24))
	if err := netnsrun.Do(ns, func() error {
		// The uplink forwards, as the agent sets it (bpf_fib_lookup
		// refuses a device that does not).
		if out, err := exec.Command("sysctl", "-qw", "net.ipv4.conf.np-ul.forwarding=1").CombinedOutput(); err != nil {
			t.Fatalf("sysctl: %v: %s", err, out)
		}
		for _, args := range [][]string{
			{"route", "add", "10.98.0.0/24", "via", npOtherNode.String(), "dev", "np-ul"},
			{"neigh", "replace", npClient.String(), "lladdr", "02:00:00:00:00:09", "dev", "np-ul", "nud", "permanent"},
			{"neigh", "replace", npOtherNode.String(), "lladdr", "02:00:00:00:00:02", "dev", "np-ul", "nud", "permanent"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v: %s", args, err, out)
			}
		}
		var err error
		if _, uplink, err = UplinkOf(npNode); err != nil || !tunnel {
			return err
		}
		vx, err = EnsureVXLAN(ovVXLAN, npNode, ovPort)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Mode: ModeRedirectPeer, NativeIfindex: uplink, MaglevSize: maglevSize,
		NodePort:  &NodePort{UplinkIfindex: uplink, SNATAddr: npSNAT, Ports: npPorts, Mode: mode, DSRAddr: npNode},
		Fallbacks: fallbacks}
	cfg = thisKernel(t, cfg)
	if tunnel {
		cfg.NativeIfindex, cfg.TunnelIfindex, cfg.NodeIP = 0, vx, npSNAT
		cfg.TunnelEndpoint = netip.AddrPortFrom(npNode, ovPort) // as the agent gives it
	}
	for _, f := range adjust {
		f(&cfg)
	}
	d = openConfiguredDatapath(t, cfg, nil)
	return d, ns, uplink
}

// runFromUplink runs the node's shunt_from_uplink on pkt (checksums as
// given) as arriving on its uplink, inside its namespace ns, and returns
// the verdict and the packet as the program left it.
func runFromUplink(t *testing.T, d *Datapath, ns string, uplink int, pkt []byte) (uint32, []byte) {
	t.Helper()
	opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256), Context: skbContext(uplink)}
	var ret uint32
	if err := netnsrun.Do(ns, func() error {
		var err error
		ret, err = d.uplink.ShuntFromUplink.Run(opts)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ret, opts.DataOut // as long as the program left it
}

// syncNodePortPods puts the test node's pod npLocalPod and the other
// node's npRemotePod into d's ipcache (and the first into its endpoints).
func syncNodePortPods(t *testing.T, d *Datapath) {
	t.Helper()
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	if err := d.SyncPolicy(policy.State{IPCache: []policy.PrefixIdentity{
		{Prefix: netip.PrefixFrom(npLocalPod, 32), Identity: 300},
		{Prefix: netip.PrefixFrom(npRemotePod, 32), Identity: 301, Tunnel: npOtherNode},
	}}, []Endpoint{{IP: npLocalPod, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300}}); err != nil {
		t.Fatal(err)
	}
}

// icmpErrorAbout is what an ICMP error says: its outer source and
// destination, and the quoted packet's source address and port and
// destination address and port.
func icmpErrorAbout(e icmpError) []any {
	return []any{netip.AddrFrom4([4]byte(e.ip[12:16])), netip.AddrFrom4([4]byte(e.ip[16:20])),
		netip.AddrFrom4([4]byte(e.quotedIP[12:16])), binary.BigEndian.Uint16(e.quotedL4[0:]),
		netip.AddrFrom4([4]byte(e.quotedIP[16:20])), binary.BigEndian.Uint16(e.quotedL4[2:])}
}

// icmpErrorCase is an ICMP error message from a sender, and the outer
// source it should have once translated.
type icmpErrorCase struct {
	what    string
	from    netip.Addr
	message []byte
	src     netip.Addr
}

// checkTranslatedError checks an ICMP error message translated into out:
// its checksums, what it says (icmpErrorAbout) against want, and its type,
// code and MTU unchanged.
func checkTranslatedError(t *testing.T, what string, out, message []byte, want []any) {
	t.Helper()
	e := checkedICMPError(t, out)
	if got := icmpErrorAbout(e); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: from %v to %v quoting %v:%v -> %v:%v; want %v", what, got[0], got[1], got[2], got[3], got[4], got[5], want)
	}
	if e.icmp[0] != message[0] || e.icmp[1] != message[1] || !bytes.Equal(e.icmp[4:8], message[4:8]) {
		t.Errorf("%s: type, code or MTU changed: % x, want % x", what, e.icmp[:8], message[:8])
	}
}

func TestNodePort(t *testing.T) {
	d, ns, uplink := nodePortTestNode(t, 0)
	syncNodePortPods(t, d)
	fe := func(vip netip.Addr, port uint16) services.Frontend {
		return services.Frontend{VIP: vip, Port: port, Proto: 6}
	}
	local := []services.Backend{{IP: npLocalPod, Port: 8080}}
	remote := []services.Backend{{IP: npRemotePod, Port: 8080}}
	if _, err := d.SyncServices([]services.Port{
		{Frontend: fe(npNode, 30080), Kind: services.KindNodePort, Name: "local", Backends: local},
		{Frontend: fe(npNode, 30081), Kind: services.KindNodePort, Name: "remote", Backends: remote},
		{Frontend: fe(npNode, 30082), Kind: services.KindNodePort, Name: "local-policy-none-here", LocalOnly: true},
		{Frontend: fe(npLB, 80), Kind: services.KindLoadBalancer, Name: "lb", Backends: local},
		{Frontend: fe(npLB, 81), Kind: services.KindLoadBalancer, Name: "lb-client-in-range", Backends: local,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.8/30")}},
		{Frontend: fe(npLB, 82), Kind: services.KindLoadBalancer, Name: "lb-client-out-of-range", Backends: local,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
		{Frontend: services.Frontend{VIP: npNode, Port: 30053, Proto: 17}, Kind: services.KindNodePort, Name: "dns",
			Backends: []services.Backend{{IP: npLocalPod, Port: 5353}}},
		{Frontend: services.Frontend{VIP: npNode, Port: 30054, Proto: 17}, Kind: services.KindNodePort, Name: "dns-remote",
			Backends: []services.Backend{{IP: npRemotePod, Port: 5353}}},
		{Frontend: services.Frontend{VIP: npNode, Port: 30055, Proto: 17}, Kind: services.KindNodePort, Name: "dns-remote-2",
			Backends: []services.Backend{{IP: npRemotePod, Port: 5354}}},
		{Frontend: fe(netip.MustParseAddr("10.96.0.10"), 80), Kind: services.KindClusterIP, Name: "clusterip", Backends: local},
	}); err != nil {
		t.Fatal(err)
	}
	flows := flowReader(t, d)
	before := counts(t, d)
	run := func(prog *ebpf.Program, pkt []byte, ctx []byte) (uint32, []byte) {
		t.Helper()
		var ret uint32
		out := make([]byte, len(pkt)+256)
		err := netnsrun.Do(ns, func() error {
			opts := &ebpf.RunOptions{Data: withChecksum(pkt), DataOut: out}
			if ctx != nil {
				opts.Context = ctx
			}
			var err error
			ret, err = prog.Run(opts)
			out = out[:len(pkt)]
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ret, out
	}
	fromOutside := func(pkt []byte) (uint32, []byte) {
		t.Helper()
		return run(d.uplink.ShuntFromUplink, pkt, skbContext(uplink))
	}
	fromPod := func(pkt []byte) (uint32, []byte) { t.Helper(); return run(d.objs.ShuntFromPod, pkt, nil) }

	t.Run("backend on this node: the client's address kept, the reply from the NodePort", func(t *testing.T) {
		for i, flags := range []byte{tcpSYN, tcpACK} {
			ret, out := fromOutside(packet(npClient, npNode, 6, tcpSegment(40000, 30080, flags)))
			if got, want := checkedTuple(t, out), (tuple{npClient, npLocalPod, 40000, 8080}); ret != tcActRedirect || got != want {
				t.Errorf("packet %d: verdict %d, %+v; want redirect to the pod, %+v", i, ret, got, want)
			}
		}
		ret, out := fromPod(packet(npLocalPod, npClient, 6, tcpSegment(8080, 40000, tcpSYNACK)))
		if got, want := checkedTuple(t, out), (tuple{npNode, npClient, 30080, 40000}); ret != tcActRedirect || got != want {
			t.Errorf("reply: verdict %d, %+v; want redirect out of the uplink, %+v", ret, got, want)
		}
		if dst := net.HardwareAddr(out[0:6]).String(); dst != "02:00:00:00:00:09" {
			t.Errorf("reply to MAC %s, want the client's (the route lookup's)", dst)
		}
	})

	var snatPort uint16
	t.Run("backend on another node: SNAT to the node's pod-network address, routed; the reply back to the client", func(t *testing.T) {
		ret, out := fromOutside(packet(npClient, npNode, 6, tcpSegment(40001, 30081, tcpSYN)))
		got := checkedTuple(t, out)
		snatPort = got.sport
		if ret != tcActRedirect || got.src != npSNAT || got.dst != npRemotePod || got.dport != 8080 || snatPort < npPorts.Min || snatPort > npPorts.Max {
			t.Errorf("verdict %d, %+v; want redirect, from %s and a port of %s to %s:8080", ret, got, npSNAT, npPorts, npRemotePod)
		}
		if dst := net.HardwareAddr(out[0:6]).String(); dst != "02:00:00:00:00:02" {
			t.Errorf("to MAC %s, want the other node's", dst)
		}
		// A second client with the same port gets the other SNAT port.
		ret, out = fromOutside(packet(netip.MustParseAddr("192.0.2.10"), npNode, 6, tcpSegment(40001, 30081, tcpSYN)))
		if got2 := checkedTuple(t, out); ret != tcActRedirect || got2.sport == snatPort || got2.src != npSNAT {
			t.Errorf("second client: verdict %d, %+v; want the other port than %d", ret, got2, snatPort)
		}
		ret, out = fromOutside(packet(npRemotePod, npSNAT, 6, tcpSegment(8080, snatPort, tcpSYNACK)))
		if got, want := checkedTuple(t, out), (tuple{npNode, npClient, 30081, 40001}); ret != tcActRedirect || got != want {
			t.Errorf("reply: verdict %d, %+v; want redirect back out, %+v", ret, got, want)
		}
		// Both ports taken towards this backend: a third client is
		// dropped, counted as out of ports.
		if ret, _ := fromOutside(packet(netip.MustParseAddr("192.0.2.11"), npNode, 6, tcpSegment(40001, 30081, tcpSYN))); ret != tcActShot {
			t.Errorf("third client with no SNAT port left: verdict %d, want drop", ret)
		}
	})

	t.Run("a reset SNAT flow gives its port up a second later", func(t *testing.T) {
		third := netip.MustParseAddr("192.0.2.11")
		if ret, _ := fromOutside(packet(npClient, npNode, 6, tcpSegment(40001, 30081, tcpRST))); ret != tcActRedirect {
			t.Errorf("the client's RST: verdict %d, want redirect", ret)
		}
		if ret, _ := fromOutside(packet(third, npNode, 6, tcpSegment(40001, 30081, tcpSYN))); ret != tcActShot {
			t.Errorf("at once: verdict %d, want drop (the port is held a second after the reset)", ret)
		}
		time.Sleep(1100 * time.Millisecond)
		ret, out := fromOutside(packet(third, npNode, 6, tcpSegment(40001, 30081, tcpSYN)))
		if got := checkedTuple(t, out); ret != tcActRedirect || got.sport != snatPort {
			t.Errorf("a second later: verdict %d, %+v; want the freed port %d", ret, got, snatPort)
		}
		ret, out = fromOutside(packet(npRemotePod, npSNAT, 6, tcpSegment(8080, snatPort, tcpSYNACK)))
		if got, want := checkedTuple(t, out), (tuple{npNode, third, 30081, 40001}); ret != tcActRedirect || got != want {
			t.Errorf("reply on the reused port: verdict %d, %+v; want %+v (the new client's)", ret, got, want)
		}
	})

	t.Run("Local without an endpoint here: dropped", func(t *testing.T) {
		if ret, _ := fromOutside(packet(npClient, npNode, 6, tcpSegment(40002, 30082, tcpSYN))); ret != tcActShot {
			t.Errorf("verdict %d, want drop (no local backend)", ret)
		}
	})

	t.Run("load balancer address", func(t *testing.T) {
		ret, out := fromOutside(packet(npClient, npLB, 6, tcpSegment(40003, 80, tcpSYN)))
		if got, want := checkedTuple(t, out), (tuple{npClient, npLocalPod, 40003, 8080}); ret != tcActRedirect || got != want {
			t.Errorf("verdict %d, %+v; want redirect, %+v", ret, got, want)
		}
		ret, out = fromPod(packet(npLocalPod, npClient, 6, tcpSegment(8080, 40003, tcpSYNACK)))
		if got, want := checkedTuple(t, out), (tuple{npLB, npClient, 80, 40003}); ret != tcActRedirect || got != want {
			t.Errorf("reply: verdict %d, %+v; want %+v", ret, got, want)
		}
	})

	t.Run("load balancer source ranges: a client in them admitted, one outside dropped", func(t *testing.T) {
		ret, out := fromOutside(packet(npClient, npLB, 6, tcpSegment(40006, 81, tcpSYN)))
		if got, want := checkedTuple(t, out), (tuple{npClient, npLocalPod, 40006, 8080}); ret != tcActRedirect || got != want {
			t.Errorf("in range: verdict %d, %+v; want redirect, %+v", ret, got, want)
		}
		if ret, _ := fromOutside(packet(npClient, npLB, 6, tcpSegment(40007, 82, tcpSYN))); ret != tcActShot {
			t.Errorf("out of range: verdict %d, want drop", ret)
		}
		var denied bool
		for _, e := range flows() {
			denied = denied || (e.Reason == "lb-source-denied" && e.Dst == npLB && e.DstPort == 82 && e.Verdict == "DROPPED")
		}
		if !denied {
			t.Errorf("no flow event names the source range drop (lb-source-denied)")
		}
	})

	t.Run("UDP, to this node's backend and SNATed to another's", func(t *testing.T) {
		ret, out := fromOutside(packet(npClient, npNode, 17, udpDatagram(40010, 30053)))
		if got, want := checkedTuple(t, out), (tuple{npClient, npLocalPod, 40010, 5353}); ret != tcActRedirect || got != want {
			t.Errorf("verdict %d, %+v; want redirect, %+v", ret, got, want)
		}
		ret, out = fromPod(packet(npLocalPod, npClient, 17, udpDatagram(5353, 40010)))
		if got, want := checkedTuple(t, out), (tuple{npNode, npClient, 30053, 40010}); ret != tcActRedirect || got != want {
			t.Errorf("reply: verdict %d, %+v; want %+v", ret, got, want)
		}
		ret, out = fromOutside(packet(npClient, npNode, 17, udpDatagram(40011, 30054)))
		got := checkedTuple(t, out)
		if ret != tcActRedirect || got.src != npSNAT || got.dst != npRemotePod || got.dport != 5353 {
			t.Errorf("to another node: verdict %d, %+v; want SNAT from %s to %s:5353", ret, got, npSNAT, npRemotePod)
		}
		ret, out = fromOutside(packet(npRemotePod, npSNAT, 17, udpDatagram(5353, got.sport)))
		if got, want := checkedTuple(t, out), (tuple{npNode, npClient, 30054, 40011}); ret != tcActRedirect || got != want {
			t.Errorf("reply from another node: verdict %d, %+v; want %+v", ret, got, want)
		}
	})

	t.Run("ICMP errors about the way to a backend reach the client about the frontend", func(t *testing.T) {
		fr := defaultFlows(t, d)
		ret, toRemote := fromOutside(packet(npClient, npNode, 17, udpDatagram(40012, 30054)))
		if sent := checkedTuple(t, toRemote); ret != tcActRedirect || sent.src != npSNAT {
			t.Fatalf("to another node: verdict %d, %+v; want SNAT from %s", ret, sent, npSNAT)
		}
		// src: the outer source the client sees.
		for _, tc := range []icmpErrorCase{
			{"the backend's port unreachable", npRemotePod, icmpUnreachable(toRemote), npNode},
			{"a router's fragmentation needed: its address stays", npOtherNode, icmpFragNeeded(toRemote, 1400), npOtherNode},
		} {
			ret, out := fromOutside(packet(tc.from, npSNAT, 1, tc.message))
			if ret != tcActRedirect {
				t.Errorf("%s: verdict %d, want redirect out of the uplink", tc.what, ret)
				continue
			}
			checkTranslatedError(t, tc.what, out, tc.message, []any{tc.src, npClient, npClient, uint16(40012), npNode, uint16(30054)})
			checkICMPErrorFlow(t, fr, tc)
			if dst := net.HardwareAddr(out[0:6]).String(); dst != "02:00:00:00:00:09" {
				t.Errorf("%s: to MAC %s, want the client's", tc.what, dst)
			}
		}
		// A backend on this node saw the client's own address: only the
		// backend becomes the frontend.
		ret, toLocal := fromOutside(packet(npClient, npNode, 17, udpDatagram(40013, 30053)))
		if ret != tcActRedirect {
			t.Fatalf("to this node's backend: verdict %d", ret)
		}
		unreachable := icmpUnreachable(toLocal)
		ret, out := fromPod(packet(npLocalPod, npClient, 1, unreachable))
		if ret != tcActRedirect {
			t.Fatalf("the local backend's port unreachable: verdict %d, want redirect out of the uplink", ret)
		}
		checkTranslatedError(t, "the local backend's port unreachable", out, unreachable, []any{npNode, npClient, npClient, uint16(40013), npNode, uint16(30053)})
		// An error about no flow from outside goes on as before.
		stray := withChecksum(packet(npClient, npRemotePod, 17, udpDatagram(40014, 5353)))
		if ret, out := fromOutside(packet(npRemotePod, npSNAT, 1, icmpUnreachable(stray))); ret != tcActOK ||
			!bytes.Equal(out[34:], withChecksum(packet(npRemotePod, npSNAT, 1, icmpUnreachable(stray)))[34:]) {
			t.Errorf("an error about no NodePort flow: verdict %d, want OK and unchanged", ret)
		}
	})

	t.Run("ICMP errors from outside about a reply reach the backend about what it sent", func(t *testing.T) {
		fr := defaultFlows(t, d)
		router := netip.MustParseAddr("203.0.113.1")
		// A flow to the backend on the other node (SNAT) and its reply
		// as it leaves for the client.
		ret, toRemote := fromOutside(packet(npClient, npNode, 17, udpDatagram(40015, 30055)))
		sent := checkedTuple(t, toRemote)
		if ret != tcActRedirect || sent.src != npSNAT {
			t.Fatalf("to another node: verdict %d, %+v", ret, sent)
		}
		ret, reply := fromOutside(packet(npRemotePod, npSNAT, 17, udpDatagram(5354, sent.sport)))
		if got := checkedTuple(t, reply); ret != tcActRedirect || got != (tuple{npNode, npClient, 30055, 40015}) {
			t.Fatalf("the reply: verdict %d, %+v", ret, got)
		}
		// src: the outer source the backend sees.
		for _, tc := range []icmpErrorCase{
			{"the client's port unreachable", npClient, icmpUnreachable(reply), npSNAT},
			{"a router's fragmentation needed: its address stays", router, icmpFragNeeded(reply, 1300), router},
		} {
			ret, out := fromOutside(packet(tc.from, npNode, 1, tc.message))
			if ret != tcActRedirect {
				t.Errorf("%s: verdict %d, want redirect to the backend's node", tc.what, ret)
				continue
			}
			checkTranslatedError(t, tc.what, out, tc.message, []any{tc.src, npRemotePod, npRemotePod, uint16(5354), npSNAT, sent.sport})
			checkICMPErrorFlow(t, fr, tc)
		}
		// A backend on this node: the client's address stays, the
		// frontend becomes the backend, and its policy admits the error
		// as related to its flow.
		if ret, _ := fromOutside(packet(npClient, npNode, 17, udpDatagram(40016, 30053))); ret != tcActRedirect {
			t.Fatalf("to this node's backend: verdict %d", ret)
		}
		ret, reply = fromPod(packet(npLocalPod, npClient, 17, udpDatagram(5353, 40016)))
		if got := checkedTuple(t, reply); ret != tcActRedirect || got != (tuple{npNode, npClient, 30053, 40016}) {
			t.Fatalf("the local backend's reply: verdict %d, %+v", ret, got)
		}
		unreachable := icmpUnreachable(reply)
		ret, out := fromOutside(packet(npClient, npNode, 1, unreachable))
		if ret != tcActRedirect {
			t.Fatalf("the client's port unreachable about a local backend's reply: verdict %d, want redirect to the pod", ret)
		}
		checkTranslatedError(t, "the client's port unreachable about a local backend's reply", out, unreachable,
			[]any{npClient, npLocalPod, npLocalPod, uint16(5353), npClient, uint16(40016)})
		// An error about no flow from outside goes on as before.
		stray := withChecksum(packet(npNode, npClient, 17, udpDatagram(30053, 40999)))
		in := withChecksum(packet(npClient, npNode, 1, icmpUnreachable(stray)))
		if ret, out := fromOutside(bytes.Clone(in)); ret != tcActOK || !bytes.Equal(out[:len(in)], in) {
			t.Errorf("an error about no NodePort flow's reply: verdict %d, want OK and unchanged", ret)
		}
	})

	t.Run("left alone: a ClusterIP, the node's own ports", func(t *testing.T) {
		for _, pkt := range [][]byte{
			packet(npClient, netip.MustParseAddr("10.96.0.10"), 6, tcpSegment(40004, 80, tcpSYN)),
			packet(npClient, npNode, 6, tcpSegment(40005, 22, tcpSYN)),
		} {
			want := checkedTuple(t, withChecksum(pkt))
			if ret, out := fromOutside(pkt); ret != tcActOK || checkedTuple(t, out) != want {
				t.Errorf("verdict %d, %+v; want OK, unchanged %+v", ret, checkedTuple(t, out), want)
			}
		}
	})

	counterDelta(t, d, before, map[string]uint64{"nodeport-xlate/from-uplink": 17, "lb-source-denied/from-uplink": 1, "nodeport-reply/from-uplink": 6, "nodeport-reply/from-pod": 5,
		"nodeport-entry-missing/from-uplink": 0})

	t.Run("a segment of a flow without an entry (evicted by a full table): counted, taken as a new flow", func(t *testing.T) {
		before := counts(t, d)
		for i, flags := range []byte{tcpACK, tcpACK, tcpSYN, tcpACK} {
			// 40020: no entry, then the first ACK's; 40021: a new flow.
			sport := uint16(40020 + i/2)
			ret, out := fromOutside(packet(npClient, npNode, 6, tcpSegment(sport, 30080, flags)))
			if got, want := checkedTuple(t, out), (tuple{npClient, npLocalPod, sport, 8080}); ret != tcActRedirect || got != want {
				t.Errorf("packet %d: verdict %d, %+v; want redirect to the pod, %+v", i, ret, got, want)
			}
		}
		counterDelta(t, d, before, map[string]uint64{"nodeport-entry-missing/from-uplink": 1, "nodeport-xlate/from-uplink": 4})
	})

	var kinds []string
	for _, e := range flows() {
		if e.Reason == "nodeport-reply" || e.OrigDst == npNode || e.OrigDst == npLB {
			kinds = append(kinds, e.Reason)
		}
	}
	if len(kinds) == 0 {
		t.Errorf("no flow event names the NodePort translations")
	}
}

// checkICMPErrorFlow: the translated error of tc was reported as an
// icmp-error flow naming it (the first byte of its message is the type,
// the second the code). Earlier events of other errors are skipped: the
// flow's source is tc's, before or after the translation.
func checkICMPErrorFlow(t *testing.T, fr *FlowReader, tc icmpErrorCase) {
	t.Helper()
	ev := findFlow(t, fr, func(e FlowEvent) bool {
		return e.Proto == 1 && e.Event == "icmp-error" && (e.Src == tc.src || e.Src == tc.from)
	})
	want := map[[2]byte]string{{3, 3}: "port-unreachable", {3, 4}: "fragmentation-needed"}[[2]byte{tc.message[0], tc.message[1]}]
	if ev.ICMPError != want || ev.Verdict != "FORWARDED" {
		t.Errorf("%s: flow %+v; want icmp-error %s, forwarded", tc.what, ev, want)
	}
}
