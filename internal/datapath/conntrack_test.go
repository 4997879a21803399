package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/policy"
)

// Tests of the two conntrack tables (bpf/lib/conntrack.h): which packets
// assure a connection, moving it from shunt_ct_new to shunt_ct, and that a
// flood of new connections evicts only connections not assured yet.

const tcpRST = 0x04

// ctTest runs the pod programs of a datapath whose pods a, b and c are
// on lo (test runs see packets there), b isolated for ingress and open to
// a and c (any port, TCP and UDP).
type ctTest struct {
	t       *testing.T
	d       *Datapath
	a, b, c netip.Addr
	eps     []Endpoint
}

func newCtTest(t *testing.T, cfg Config, change func(*ebpf.CollectionSpec)) *ctTest {
	t.Helper()
	cfg.Mode = ModeRedirectPeer
	ct := &ctTest{t: t, d: openConfiguredDatapath(t, cfg, change),
		a: netip.MustParseAddr("10.99.0.10"), b: netip.MustParseAddr("10.99.0.11"), c: netip.MustParseAddr("10.99.0.12")}
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	ct.eps = []Endpoint{
		{IP: ct.a, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300},
		{IP: ct.b, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 301, IngressIsolated: true},
		{IP: ct.c, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 302},
	}
	ct.allowIntoB(300, 302)
	return ct
}

// allowIntoB makes b's ingress admit new connections from these
// identities only (TCP and UDP, any port).
func (ct *ctTest) allowIntoB(identities ...uint32) {
	ct.t.Helper()
	var st policy.State
	for _, id := range identities {
		for _, proto := range []uint8{6, 17} {
			st.Entries = append(st.Entries, policy.Entry{Key: policy.Key{Endpoint: ct.b, Identity: id, Proto: proto},
				Verdict: policy.VerdictAllow, RuleID: id})
		}
	}
	if err := ct.d.SyncPolicy(st, ct.eps); err != nil {
		ct.t.Fatal(err)
	}
}

// send runs from-pod on a packet and returns the verdict.
func (ct *ctTest) send(pkt []byte) uint32 {
	ct.t.Helper()
	ret, _, err := ct.d.objs.ShuntFromPod.Test(pkt)
	if err != nil {
		ct.t.Fatal(err)
	}
	return ret
}

func (ct *ctTest) tcp(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, flags byte) uint32 {
	ct.t.Helper()
	return ct.send(packet(src, dst, 6, tcpSegment(sport, dport, flags)))
}

// ctKeyOf is the key lib/conntrack.h's ct_key_of builds: the lower
// (address, port) end first, compared as the program sees them.
func ctKeyOf(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, proto uint8) podtcCtKey {
	s, d, sp, dp := be32(src), be32(dst), be16(sport), be16(dport)
	if s < d || (s == d && sp <= dp) {
		return podtcCtKey{AddrA: s, AddrB: d, PortA: sp, PortB: dp, Proto: proto}
	}
	return podtcCtKey{AddrA: d, AddrB: s, PortA: dp, PortB: sp, Proto: proto}
}

// table says which conntrack table holds the connection: "assured"
// (shunt_ct), "new" (shunt_ct_new), "both" or "none".
func (ct *ctTest) table(k podtcCtKey) string {
	ct.t.Helper()
	var v podtcCtValue
	inAssured := ct.d.objs.ShuntCt.Lookup(k, &v) == nil
	inNew := ct.d.objs.ShuntCtNew.Lookup(k, &v) == nil
	switch {
	case inAssured && inNew:
		return "both"
	case inAssured:
		return ctTableAssured
	case inNew:
		return ctTableNew
	}
	return "none"
}

// TestConntrackAssured: a connection starts in shunt_ct_new and moves to
// shunt_ct only once assured: TCP when the originator acknowledges the
// reply, UDP when a reply was seen and it is 2 s old. What a SYN flood
// does (a SYN-ACK answered by RST, a RST from a closed port, a SYN-ACK
// never answered) assures nothing.
func TestConntrackAssured(t *testing.T) {
	ct := newCtTest(t, Config{}, nil)
	a, b := ct.a, ct.b
	steps := []struct {
		name    string
		pkt     []byte
		verdict uint32
		key     podtcCtKey
		table   string
	}{
		{"SYN: a new connection, not assured", packet(a, b, 6, tcpSegment(40000, 80, tcpSYN)), tcActRedirect, ctKeyOf(a, 40000, b, 80, 6), ctTableNew},
		{"SYN-ACK: the reply, still not assured", packet(b, a, 6, tcpSegment(80, 40000, tcpSYNACK)), tcActRedirect, ctKeyOf(a, 40000, b, 80, 6), ctTableNew},
		{"ACK from the originator: handshake done, assured", packet(a, b, 6, tcpSegment(40000, 80, tcpACK)), tcActRedirect, ctKeyOf(a, 40000, b, 80, 6), ctTableAssured},
		{"data both ways: stays assured", packet(b, a, 6, tcpSegment(80, 40000, tcpACK)), tcActRedirect, ctKeyOf(a, 40000, b, 80, 6), ctTableAssured},

		{"flood to an open port: SYN", packet(a, b, 6, tcpSegment(40001, 80, tcpSYN)), tcActRedirect, ctKeyOf(a, 40001, b, 80, 6), ctTableNew},
		{"flood to an open port: SYN-ACK", packet(b, a, 6, tcpSegment(80, 40001, tcpSYNACK)), tcActRedirect, ctKeyOf(a, 40001, b, 80, 6), ctTableNew},
		{"flood to an open port: the flooder's kernel resets it", packet(a, b, 6, tcpSegment(40001, 80, tcpRST)), tcActRedirect, ctKeyOf(a, 40001, b, 80, 6), ctTableNew},
		{"flood to an open port: a late ACK of the reset one is no handshake", packet(a, b, 6, tcpSegment(40001, 80, tcpACK)), tcActRedirect, ctKeyOf(a, 40001, b, 80, 6), ctTableNew},

		{"flood to a closed port: SYN", packet(a, b, 6, tcpSegment(40002, 81, tcpSYN)), tcActRedirect, ctKeyOf(a, 40002, b, 81, 6), ctTableNew},
		{"flood to a closed port: RST", packet(b, a, 6, tcpSegment(81, 40002, tcpRST|tcpACK)), tcActRedirect, ctKeyOf(a, 40002, b, 81, 6), ctTableNew},

		{"SYN, SYN-ACK and no ACK: SYN", packet(a, b, 6, tcpSegment(40003, 80, tcpSYN)), tcActRedirect, ctKeyOf(a, 40003, b, 80, 6), ctTableNew},
		{"SYN, SYN-ACK and no ACK: SYN-ACK", packet(b, a, 6, tcpSegment(80, 40003, tcpSYNACK)), tcActRedirect, ctKeyOf(a, 40003, b, 80, 6), ctTableNew},
		{"SYN, SYN-ACK and no ACK: the SYN again", packet(a, b, 6, tcpSegment(40003, 80, tcpSYN)), tcActRedirect, ctKeyOf(a, 40003, b, 80, 6), ctTableNew},
		{"SYN, SYN-ACK and no ACK: the SYN-ACK again", packet(b, a, 6, tcpSegment(80, 40003, tcpSYNACK)), tcActRedirect, ctKeyOf(a, 40003, b, 80, 6), ctTableNew},

		{"UDP request", packet(a, b, 17, udpDatagram(40004, 53)), tcActRedirect, ctKeyOf(a, 40004, b, 53, 17), ctTableNew},
		{"UDP reply within 2 s: a DNS-like exchange, not assured", packet(b, a, 17, udpDatagram(53, 40004)), tcActRedirect, ctKeyOf(a, 40004, b, 53, 17), ctTableNew},
	}
	for _, s := range steps {
		if v := ct.send(s.pkt); v != s.verdict {
			t.Errorf("%s: verdict %d, want %d", s.name, v, s.verdict)
		}
		if got := ct.table(s.key); got != s.table {
			t.Errorf("%s: the connection is in %s, want %s", s.name, got, s.table)
		}
	}

	// A UDP flow that is still in use 2 s after it began, with replies, is
	// a stream: its next packet assures it. (Its start is moved back
	// rather than waited for.)
	udp := ctKeyOf(a, 40004, b, 53, 17)
	var v podtcCtValue
	if err := ct.d.objs.ShuntCtNew.Lookup(udp, &v); err != nil {
		t.Fatal(err)
	}
	v.CreatedNs -= uint64(3 * time.Second)
	if err := ct.d.objs.ShuntCtNew.Put(udp, v); err != nil {
		t.Fatal(err)
	}
	if ret := ct.send(packet(a, b, 17, udpDatagram(40004, 53))); ret != tcActRedirect {
		t.Errorf("UDP request 2 s into the flow: verdict %d", ret)
	}
	if got := ct.table(udp); got != ctTableAssured {
		t.Errorf("UDP flow with replies, 2 s old: in %s, want %s", got, ctTableAssured)
	}
	// A UDP flow without replies stays new however old.
	oneWay := ctKeyOf(a, 40005, b, 514, 17)
	ct.send(packet(a, b, 17, udpDatagram(40005, 514)))
	if err := ct.d.objs.ShuntCtNew.Lookup(oneWay, &v); err != nil {
		t.Fatal(err)
	}
	v.CreatedNs -= uint64(3 * time.Second)
	ct.d.objs.ShuntCtNew.Put(oneWay, v)
	ct.send(packet(a, b, 17, udpDatagram(40005, 514)))
	if got := ct.table(oneWay); got != ctTableNew {
		t.Errorf("one-way UDP flow, 2 s old: in %s, want %s", got, ctTableNew)
	}

	// The dump shows both tables, each entry with its table and state.
	rows, err := ct.d.DumpMap("shunt_ct", false)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, r := range rows {
		seen[r["source"].(string)+">"+r["destination"].(string)+"/"+r["protocol"].(string)] = r["table"].(string) + " " + r["state"].(string)
	}
	for flow, want := range map[string]string{
		"10.99.0.10:40000>10.99.0.11:80/TCP": "assured established",
		"10.99.0.10:40001>10.99.0.11:80/TCP": "new reset",
		"10.99.0.10:40003>10.99.0.11:80/TCP": "new replied", // the handshake not finished
		"10.99.0.10:40004>10.99.0.11:53/UDP": "assured established",
	} {
		if seen[flow] != want {
			t.Errorf("dump of shunt_ct: %s is %q, want %q (all: %v)", flow, seen[flow], want, seen)
		}
	}
}

// TestConntrackFloodKeepsEstablished: a flood of new connections that
// overflows shunt_ct_new many times over (shrunk to floodTable entries
// here) leaves an assured connection in shunt_ct, where it passes although
// policy no longer admits it as new (either way). With the single table of before
// (ConntrackSingleTable, shunt_ct shrunk alike) the same flood evicts it
// and its next packet is dropped: what the second table is for.
func TestConntrackFloodKeepsEstablished(t *testing.T) {
	const floodTable = 256
	for _, single := range []bool{false, true} {
		name := "two-tables"
		if single {
			name = "single-table"
		}
		t.Run(name, func(t *testing.T) {
			ct := newCtTest(t, Config{ConntrackSingleTable: single}, func(spec *ebpf.CollectionSpec) {
				for _, m := range []string{"shunt_ct_new", "shunt_ct"} {
					if ms, ok := spec.Maps[m]; ok {
						ms.MaxEntries = floodTable
					}
				}
			})
			a, b, c := ct.a, ct.b, ct.c
			ct.tcp(a, 40000, b, 80, tcpSYN)
			ct.tcp(b, 80, a, 40000, tcpSYNACK)
			ct.tcp(a, 40000, b, 80, tcpACK)
			// From now on policy refuses the connection both ways: a's
			// new connections to b, and b's to a (a isolated, admitting
			// nothing), so that a lost entry cannot be picked up again
			// from an answer either (TestConntrackPicksUpAnswers).
			ct.eps[0].IngressIsolated = true
			ct.allowIntoB(302)

			// c floods b: SYNs to an open port (SYN-ACK, then c's RST) and to a
			// closed one (RST), 10 times the table.
			for i := range 10 * floodTable {
				sport := uint16(10000 + i)
				if i%2 == 0 {
					ct.tcp(c, sport, b, 80, tcpSYN)
					ct.tcp(b, 80, c, sport, tcpSYNACK)
					ct.tcp(c, sport, b, 80, tcpRST)
				} else {
					ct.tcp(c, sport, b, 81, tcpSYN)
					ct.tcp(b, 81, c, sport, tcpRST|tcpACK)
				}
			}
			if n := countKeysOf(t, ct.d.objs.ShuntCtNew); !single && n > floodTable {
				t.Errorf("shunt_ct_new holds %d entries, more than its %d", n, floodTable)
			}
			verdict := ct.tcp(a, 40000, b, 80, tcpACK)
			if !single && verdict != tcActRedirect {
				t.Errorf("established connection after the flood: verdict %d, want it to pass (it is in %s)",
					verdict, ct.table(ctKeyOf(a, 40000, b, 80, 6)))
			}
			if single && verdict != tcActShot {
				t.Errorf("single table: established connection after the flood: verdict %d, want a drop "+
					"(evicted, and policy denies it as new); the test shows nothing", verdict)
			}
		})
	}
}

// TestConntrackPicksUpAnswers: a TCP connection whose entry was lost (a
// flush, an eviction) is recorded again from its next segment, whichever
// end sends it: a segment policy refuses its own way is admitted as the
// answer of a connection its destination opened when policy admits that
// way, and recorded so (the opener, a reply seen). A stray segment picked
// up that way does not open the door: its sender's SYN on the same tuple
// is judged as a new connection of its own and dropped, as is a SYN that
// no entry holds.
func TestConntrackPicksUpAnswers(t *testing.T) {
	ct := newCtTest(t, Config{}, nil)
	b := ct.b
	d := netip.MustParseAddr("10.99.0.13") // not admitted into b
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	ct.eps = append(ct.eps, Endpoint{IP: d, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 303})
	ct.allowIntoB(300, 302)
	flush := func() {
		t.Helper()
		for _, m := range []string{"shunt_ct", "shunt_ct_new"} {
			if _, err := ct.d.FlushMap(m); err != nil {
				t.Fatal(err)
			}
		}
	}

	// b opens a connection to d (b's egress and d's ingress are open).
	for _, s := range []struct {
		src, dst     netip.Addr
		sport, dport uint16
		flags        byte
	}{{b, d, 40010, 80, tcpSYN}, {d, b, 80, 40010, tcpSYNACK}, {b, d, 40010, 80, tcpACK}} {
		if v := ct.tcp(s.src, s.sport, s.dst, s.dport, s.flags); v != tcActRedirect {
			t.Fatalf("handshake of b to d: verdict %d", v)
		}
	}
	conn := ctKeyOf(b, 40010, d, 80, 6)
	flush()
	fr := defaultFlows(t, ct.d)
	// d answers first: its own way (d into b) policy refuses; as b's
	// connection's answer it passes, recorded with b as the opener, and
	// its flow says so (event answer: not a connection d opened).
	if v := ct.tcp(d, 80, b, 40010, tcpACK); v != tcActRedirect {
		t.Errorf("d's answer after the flush: verdict %d, want %d (picked up as b's connection)", v, tcActRedirect)
	}
	ev := findFlow(t, fr, func(e FlowEvent) bool { return e.Src == d && e.SrcPort == 80 })
	if ev.Event != "answer" || ev.Verdict != "FORWARDED" {
		t.Errorf("flow of d's answer: %+v; want event answer, forwarded", ev)
	}
	var v podtcCtValue
	if err := ct.d.objs.ShuntCtNew.Lookup(conn, &v); err != nil {
		t.Fatalf("the picked-up connection: %v", err)
	}
	bIsA := conn.AddrA == be32(b)
	if opener := v.Flags&1 != 0 == bIsA; !opener || v.Flags&2 == 0 {
		t.Errorf("picked-up entry flags %#x: want b as the opener and a reply seen", v.Flags)
	}
	// b's next ACK (from the opener) assures it, as after a handshake.
	if v := ct.tcp(b, 40010, d, 80, tcpACK); v != tcActRedirect || ct.table(conn) != ctTableAssured {
		t.Errorf("b's ACK after the pick-up: verdict %d, the connection in %s; want it passed and assured", v, ct.table(conn))
	}

	// A stray ACK from d to b's port 22 is picked up the same way (it
	// reaches b, whose kernel resets it), but d's SYN on that tuple is
	// d's own new connection, which b's ingress refuses.
	if v := ct.tcp(d, 40020, b, 22, tcpACK); v != tcActRedirect {
		t.Errorf("d's stray ACK: verdict %d, want %d", v, tcActRedirect)
	}
	if v := ct.tcp(d, 40020, b, 22, tcpSYN); v != tcActShot {
		t.Errorf("d's SYN after its stray ACK: verdict %d, want %d (dropped: policy refuses d into b)", v, tcActShot)
	}
	if v := ct.tcp(d, 40021, b, 22, tcpSYN); v != tcActShot {
		t.Errorf("d's SYN: verdict %d, want %d", v, tcActShot)
	}
	// A connection policy refuses both ways ends: with d isolated for
	// ingress (admitting nothing), b's connection to d, its entry lost,
	// is refused whichever end speaks first.
	ct.eps[3].IngressIsolated = true
	ct.allowIntoB(300, 302)
	flush()
	if v := ct.tcp(d, 80, b, 40010, tcpACK); v != tcActShot {
		t.Errorf("d's segment, policy refusing the connection both ways: verdict %d, want %d", v, tcActShot)
	}
	if v := ct.tcp(b, 40010, d, 80, tcpACK); v != tcActShot {
		t.Errorf("b's segment, policy refusing the connection both ways: verdict %d, want %d", v, tcActShot)
	}
}

// TestICMPErrorFlows: an ICMP error about a tracked connection passes (it
// relates to the connection) and is reported as event icmp-error naming
// the error, where before it was only a packet, seen when tracing every
// packet. One about no connection is judged as a packet of its own.
func TestICMPErrorFlows(t *testing.T) {
	ct := newCtTest(t, Config{}, nil)
	a, b := ct.a, ct.b
	fr := defaultFlows(t, ct.d)
	query := packet(a, b, 17, udpDatagram(40000, 53))
	if v := ct.send(query); v != tcActRedirect {
		t.Fatalf("a's datagram to b: verdict %d", v)
	}
	for _, c := range []struct {
		message []byte
		want    string
	}{
		{icmpUnreachable(query), "port-unreachable"},
		{icmpFragNeeded(query, 1400), "fragmentation-needed"},
		{append([]byte{11, 0, 0, 0, 0, 0, 0, 0}, query[14:14+28]...), "ttl-exceeded"},
	} {
		if v := ct.send(withChecksum(packet(b, a, 1, c.message))); v != tcActRedirect {
			t.Errorf("%s from b about a's datagram: verdict %d, want it passed (related)", c.want, v)
		}
		ev := findFlow(t, fr, func(e FlowEvent) bool { return e.Proto == 1 && e.Src == b })
		if ev.Event != "icmp-error" || ev.ICMPError != c.want || ev.Verdict != "FORWARDED" || ev.TCPFlags != 0 {
			t.Errorf("flow of b's ICMP error: %+v; want event icmp-error, %s, forwarded", ev, c.want)
		}
	}
}

func TestICMPErrorNames(t *testing.T) {
	for b, want := range map[uint8]string{
		0x43: "port-unreachable", 0x44: "fragmentation-needed", 0x4d: "administratively-prohibited",
		0x80: "ttl-exceeded", 0x81: "reassembly-time-exceeded", 0x8f: "ttl-exceeded-code-15",
		0xc2: "bad-length", 0x05: "icmp-error-0x5", 0: "",
	} {
		if got := icmpErrorName(b); got != want {
			t.Errorf("icmpErrorName(%#x) = %q, want %q", b, got, want)
		}
	}
}
