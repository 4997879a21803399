package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/policy"
)

// TestFlowEvents: drops are reported with reason, identities and rule in
// the default sampling; forwarded packets only when tracing every packet;
// nothing when off; a full ring buffer counts losses and never stops a
// packet.
func TestFlowEvents(t *testing.T) {
	requireBPF(t)
	d, err := Open(thisKernel(t, Config{PinDir: testPinDir(t), Mode: ModeRedirectPeer, FlowBufferBytes: 4096}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	a, b := netip.MustParseAddr("10.99.0.10"), netip.MustParseAddr("10.99.0.11")
	eps := []Endpoint{
		{IP: a, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300},
		{IP: b, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 301, IngressIsolated: true, IngressRules: true},
	}
	state := policy.State{Entries: []policy.Entry{
		{Key: policy.Key{Endpoint: b, Identity: 300, Proto: 6, Port: 80, PortBits: 16}, Verdict: policy.VerdictAllow, RuleID: 21},
		{Key: policy.Key{Endpoint: b, Identity: 300, Proto: 6, Port: 22, PortBits: 16}, Verdict: policy.VerdictDeny, RuleID: 22},
	}}
	if err := d.SyncPolicy(state, eps); err != nil {
		t.Fatal(err)
	}
	fr, err := d.Flows()
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	read := func() []FlowEvent {
		t.Helper()
		var out []FlowEvent
		for {
			fr.r.SetDeadline(time.Now().Add(50 * time.Millisecond))
			if err := fr.r.ReadInto(&fr.rec); err != nil {
				return out
			}
			e, err := decodeFlow(fr.rec.RawSample, fr.boot)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
		}
	}
	run := func(pkt []byte) {
		t.Helper()
		if _, _, err := d.objs.ShuntFromPod.Test(pkt); err != nil {
			t.Fatal(err)
		}
	}

	if err := d.SetFlowMode(FlowModeDefault); err != nil {
		t.Fatal(err)
	}
	run(packet(a, b, 6, tcpSegment(42000, 22, tcpSYN))) // denied
	run(packet(a, b, 6, tcpSegment(42001, 80, tcpSYN))) // new connection
	run(packet(a, b, 6, tcpSegment(42001, 80, tcpACK))) // same connection: not reported
	run(packet(a, b, 6, tcpSegment(42001, 80, 0x11)))   // FIN: connection end
	evs := read()
	if len(evs) != 3 {
		t.Fatalf("default sampling: %d events, want 3 (drop, new, end): %+v", len(evs), evs)
	}
	drop := evs[0]
	if drop.Verdict != "DROPPED" || drop.Reason != "policy-denied" || drop.RuleID != 22 || drop.SrcIdentity != 300 ||
		drop.DstIdentity != 301 || drop.Src != a || drop.Dst != b || drop.DstPort != 22 || drop.Proto != 6 || drop.Point != "from-pod" {
		t.Errorf("drop event: %+v", drop)
	}
	if time.Since(drop.Time) > time.Minute || time.Since(drop.Time) < 0 {
		t.Errorf("event time %s is not now", drop.Time)
	}
	if evs[1].Event != "new" || evs[1].Verdict != "FORWARDED" || evs[1].RuleID != 21 || evs[2].Event != "end" {
		t.Errorf("connection events: %+v %+v", evs[1], evs[2])
	}

	d.SetFlowMode(FlowModeAll)
	run(packet(a, b, 6, tcpSegment(42001, 80, tcpACK)))
	if evs := read(); len(evs) != 1 || evs[0].Event != "packet" {
		t.Errorf("tracing every packet: %+v", evs)
	}
	d.SetFlowMode(FlowModeOff)
	run(packet(a, b, 6, tcpSegment(42002, 22, tcpSYN)))
	if evs := read(); len(evs) != 0 {
		t.Errorf("flows off: %+v", evs)
	}

	// 4 KiB hold about 50 events: 200 unread packets overflow it, and
	// every one is still forwarded.
	d.SetFlowMode(FlowModeAll)
	for i := 0; i < 200; i++ {
		ret, _, err := d.objs.ShuntFromPod.Test(packet(a, b, 6, tcpSegment(42001, 80, tcpACK)))
		if err != nil || ret != tcActRedirect {
			t.Fatalf("packet %d with a full ring buffer: verdict %d, %v", i, ret, err)
		}
	}
	emitted, lost, err := d.FlowStats()
	if err != nil || lost == 0 || emitted == 0 {
		t.Errorf("flow stats after overflow: emitted %d lost %d (%v); want both > 0", emitted, lost, err)
	}
}
