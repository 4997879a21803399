package datapath

import (
	"net/netip"
	"testing"

	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// Tests of the established-connection shortcuts (BenchmarkPacketCost
// measures them): conntrack records whether the tc service translation
// left a connection alone (CT_F_NO_TC_NAT), so its later packets skip
// that translation's lookups, and shunt_to_pod looks the sender's
// identity up for a known connection only when its flow is reported.

// ctFlagsOf reads the flags of a connection's conntrack entry (either
// table); ok is false when there is none.
func (ct *ctTest) ctFlagsOf(k podtcCtKey) (flags uint32, ok bool) {
	ct.t.Helper()
	return connFlags(ct.d, k)
}

// connFlags reads the flags of a connection's entry in d's conntrack
// tables (either); ok is false when there is none.
func connFlags(d *Datapath, k podtcCtKey) (flags uint32, ok bool) {
	var v podtcCtValue
	if d.objs.ShuntCt.Lookup(k, &v) == nil || d.objs.ShuntCtNew.Lookup(k, &v) == nil {
		return v.Flags, true
	}
	return 0, false
}

// TestConntrackRecordsUntranslatedFromOtherNodes: a connection another
// node's pod opens to a pod here (native routing: shunt_from_uplink;
// the overlay's: TestOverlayTwoNodes) is recorded as one the tc
// translation left alone, so the pod's answers skip its lookups, as a
// local pod's connection is (TestConntrackRecordsUntranslated).
func TestConntrackRecordsUntranslatedFromOtherNodes(t *testing.T) {
	d, ns, uplink := nodePortTestNode(t, 0)
	syncNodePortPods(t, d)
	ret, _ := runFromUplink(t, d, ns, uplink, withChecksum(packet(npRemotePod, npLocalPod, 6, tcpSegment(40000, 8080, tcpSYN))))
	if ret != tcActRedirect {
		t.Fatalf("SYN from the other node's pod: verdict %d, want redirect to the pod", ret)
	}
	if f, ok := connFlags(d, ctKeyOf(npRemotePod, 40000, npLocalPod, 8080, 6)); !ok || f&uint32(podtcCtFlagsCT_F_NO_TC_NAT) == 0 {
		t.Errorf("the other node's pod -> the pod: conntrack flags %s (recorded: %v), want no-tc-nat", flagsText(f, ctFlagNames), ok)
	}
}

// TestConntrackRecordsUntranslated: a pod's connection to a pod is
// recorded as one the tc translation left alone, and keeps going to the
// pod when a Service with that address and port appears later (the
// translation is decided when a connection begins, as the kernel's NAT
// does); a connection the translation made is not marked, and its
// packets both ways are still translated, also when its translated answer
// crosses shunt_to_pod (bpf_redirect); a connection the node opens to a
// pod (shunt_to_pod) is marked too, its answers skip the translation.
func TestConntrackRecordsUntranslated(t *testing.T) {
	ct := newCtTest(t, Config{}, nil)
	noNAT := uint32(podtcCtFlagsCT_F_NO_TC_NAT)

	if v := ct.tcp(ct.a, 41000, ct.b, 80, tcpSYN); v != tcActRedirect {
		t.Fatalf("SYN a -> b: verdict %d, want redirect", v)
	}
	direct := ctKeyOf(ct.a, 41000, ct.b, 80, 6)
	if f, ok := ct.ctFlagsOf(direct); !ok || f&noNAT == 0 {
		t.Errorf("a -> b: conntrack flags %s (recorded: %v), want no-tc-nat", flagsText(f, ctFlagNames), ok)
	}

	// A service whose frontend is b's own address and port (no ClusterIP
	// is a pod's address; an external frontend can be a node's): new
	// connections to it are translated, a:41000's stays with b.
	vip := services.Frontend{VIP: ct.b, Port: 80, Proto: 6}
	if _, err := ct.d.SyncServices([]services.Port{{Frontend: vip, Kind: services.KindClusterIP, Name: "late",
		Backends: []services.Backend{{IP: ct.c, Port: 8080}}}}); err != nil {
		t.Fatal(err)
	}
	out := ct.fromPodOut(packet(ct.a, ct.b, 6, tcpSegment(41000, 80, tcpACK)))
	if got := parseFlow(t, out); got.dst != ct.b || got.dport != 80 {
		t.Errorf("the connection begun before the service: sent to %s:%d, want %s:80 as before", got.dst, got.dport, ct.b)
	}
	out = ct.fromPodOut(packet(ct.a, ct.b, 6, tcpSegment(41001, 80, tcpSYN)))
	if got := parseFlow(t, out); got.dst != ct.c || got.dport != 8080 {
		t.Errorf("a new connection to the frontend: sent to %s:%d, want the backend %s:8080", got.dst, got.dport, ct.c)
	}
	translated := ctKeyOf(ct.a, 41001, ct.c, 8080, 6)
	if f, ok := ct.ctFlagsOf(translated); !ok || f&noNAT != 0 {
		t.Errorf("the translated connection: conntrack flags %s (recorded: %v), want it recorded without no-tc-nat", flagsText(f, ctFlagNames), ok)
	}
	out = ct.fromPodOut(packet(ct.c, ct.a, 6, tcpSegment(8080, 41001, tcpSYNACK)))
	if got := parseFlow(t, out); got.src != ct.b || got.sport != 80 {
		t.Errorf("the backend's answer: from %s:%d, want the frontend %s:80", got.src, got.sport, ct.b)
	}
	// With bpf_redirect, that answer, from the frontend now, crosses
	// shunt_to_pod on its way to a: the record it opens there must not
	// keep a's next packets from the translation.
	if ret, _, err := ct.d.objs.ShuntToPod.Test(withChecksum(packet(ct.b, ct.a, 6, tcpSegment(80, 41001, tcpSYNACK)))); err != nil || ret != tcActOK {
		t.Fatalf("the translated answer at a's veth: verdict %d, %v; want it passed", ret, err)
	}
	if f, ok := ct.ctFlagsOf(ctKeyOf(ct.b, 80, ct.a, 41001, 6)); ok && f&noNAT != 0 {
		t.Errorf("the frontend's answer recorded by shunt_to_pod: conntrack flags %s, want no no-tc-nat", flagsText(f, ctFlagNames))
	}
	out = ct.fromPodOut(packet(ct.a, ct.b, 6, tcpSegment(41001, 80, tcpACK)))
	if got := parseFlow(t, out); got.dst != ct.c || got.dport != 8080 {
		t.Errorf("the translated connection's next packet: to %s:%d, want %s:8080", got.dst, got.dport, ct.c)
	}

	// The node to a pod: recorded by shunt_to_pod, marked.
	node := netip.MustParseAddr("10.99.0.1")
	if ret, _, err := ct.d.objs.ShuntToPod.Test(packet(node, ct.a, 6, tcpSegment(42000, 80, tcpSYN))); err != nil || ret != tcActOK {
		t.Fatalf("the node's SYN to a: verdict %d, %v; want it passed", ret, err)
	}
	if f, ok := ct.ctFlagsOf(ctKeyOf(node, 42000, ct.a, 80, 6)); !ok || f&noNAT == 0 {
		t.Errorf("node -> a: conntrack flags %s (recorded: %v), want no-tc-nat", flagsText(f, ctFlagNames), ok)
	}
}

// fromPodOut runs shunt_from_pod on a packet it must redirect and
// returns the packet as it leaves.
func (ct *ctTest) fromPodOut(pkt []byte) []byte {
	ct.t.Helper()
	ret, out, err := ct.d.objs.ShuntFromPod.Test(withChecksum(pkt))
	if err != nil {
		ct.t.Fatal(err)
	}
	if ret != tcActRedirect {
		ct.t.Fatalf("shunt_from_pod on %x: verdict %d, want redirect", pkt[14:], ret)
	}
	return out
}

// TestToPodReportsKnownSender: with every packet reported, a packet of a
// known connection the node opened to a pod still names the sender's
// identity (looked up only then), as a new connection's does.
func TestToPodReportsKnownSender(t *testing.T) {
	ct := newCtTest(t, Config{}, nil)
	flows := flowReader(t, ct.d)
	if err := ct.d.SetFlowMode(FlowModeAll); err != nil {
		t.Fatal(err)
	}
	world := netip.MustParseAddr("192.0.2.9")
	for _, flags := range []byte{tcpSYN, tcpACK} {
		if ret, _, err := ct.d.objs.ShuntToPod.Test(packet(world, ct.a, 6, tcpSegment(43000, 80, flags))); err != nil || ret != tcActOK {
			t.Fatalf("to a, flags %#x: verdict %d, %v; want it passed", flags, ret, err)
		}
	}
	var seen int
	for _, e := range flows() {
		if e.Src != world || e.Point != "to-pod" {
			continue
		}
		seen++
		if e.SrcIdentity != policy.IdentityWorld {
			t.Errorf("flow %+v: source identity %d, want the world's (%d)", e, e.SrcIdentity, policy.IdentityWorld)
		}
	}
	if seen != 2 {
		t.Errorf("%d flows of the connection reported, want 2 (every packet)", seen)
	}
}
