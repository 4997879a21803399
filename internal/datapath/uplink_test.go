package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/shuntnet/shunt/internal/policy"
)

// The masquerade's unit tests run the uplink programs on crafted packets:
// a node 192.0.2.1 whose pods 10.99.0.10 and .11 talk to 198.51.100.7,
// with two ports to share (61000-61001) so collisions and exhaustion come
// quickly.
var (
	mqNode    = netip.MustParseAddr("192.0.2.1")
	mqPod     = netip.MustParseAddr("10.99.0.10")
	mqPod2    = netip.MustParseAddr("10.99.0.11")
	mqOutside = netip.MustParseAddr("198.51.100.7")
	mqPorts   = PortRange{Min: 61000, Max: 61001}
)

func openMasqDatapath(t *testing.T, change func(*ebpf.CollectionSpec)) *Datapath {
	t.Helper()
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, Masquerade: &Masquerade{Addr: mqNode, Ports: mqPorts}}, change)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	// Test runs see packets on lo: every pod's "veth" is ifindex 1.
	if err := d.SyncPolicy(policy.State{}, []Endpoint{
		{IP: mqPod, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300},
		{IP: mqPod2, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300},
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncMasqExclude([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}); err != nil {
		t.Fatal(err)
	}
	return d
}

// withChecksum fills in the transport checksum of a packet built by packet().
func withChecksum(pkt []byte) []byte {
	ip, l4 := pkt[14:34], pkt[34:]
	switch ip[9] {
	case 6:
		binary.BigEndian.PutUint16(l4[16:], 0)
		binary.BigEndian.PutUint16(l4[16:], l4Checksum(ip, l4))
	case 17:
		binary.BigEndian.PutUint16(l4[6:], 0)
		binary.BigEndian.PutUint16(l4[6:], l4Checksum(ip, l4))
	case 1:
		binary.BigEndian.PutUint16(l4[2:], 0)
		binary.BigEndian.PutUint16(l4[2:], ipChecksum(l4))
	}
	return pkt
}

// tuple is what a test reads back from an output packet: its addresses
// and ports (ICMP: the echo identifier as both).
type tuple struct {
	src, dst     netip.Addr
	sport, dport uint16
}

// checkedTuple parses an Ethernet + IPv4 + TCP/UDP/ICMP echo packet and
// fails the test when a checksum is wrong.
func checkedTuple(t *testing.T, pkt []byte) tuple {
	t.Helper()
	ip, l4 := pkt[14:34], pkt[34:]
	if ipChecksum(ip) != 0 {
		t.Errorf("IPv4 header checksum wrong")
	}
	tu := tuple{src: netip.AddrFrom4([4]byte(ip[12:16])), dst: netip.AddrFrom4([4]byte(ip[16:20]))}
	switch ip[9] {
	case 1:
		if ipChecksum(l4) != 0 {
			t.Errorf("ICMP checksum wrong")
		}
		tu.sport = binary.BigEndian.Uint16(l4[4:])
		tu.dport = tu.sport
	default:
		if l4Checksum(ip, l4) != 0 {
			t.Errorf("protocol %d checksum wrong", ip[9])
		}
		tu.sport, tu.dport = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
	}
	return tu
}

// icmpError is an ICMP error as a test reads it back: the outer IPv4
// header, the ICMP message, and in it the quoted IPv4 header and
// transport bytes.
type icmpError struct{ ip, icmp, quotedIP, quotedL4 []byte }

// checkedICMPError splits an ICMP error quoting a whole TCP or UDP packet
// and fails the test for each of its checksums that is wrong.
func checkedICMPError(t *testing.T, pkt []byte) icmpError {
	t.Helper()
	e := icmpError{ip: pkt[14:34], icmp: pkt[34:]}
	e.quotedIP, e.quotedL4 = e.icmp[8:28], e.icmp[28:]
	for what, ok := range map[string]bool{"outer IPv4": ipChecksum(e.ip) == 0, "ICMP": ipChecksum(e.icmp) == 0,
		"quoted IPv4": ipChecksum(e.quotedIP) == 0, "quoted transport": l4Checksum(e.quotedIP, e.quotedL4) == 0} {
		if !ok {
			t.Errorf("%s checksum wrong after translation", what)
		}
	}
	return e
}

func icmpEcho(typ uint8, id uint16) []byte {
	return []byte{typ, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 'm', 'a', 's', 'q'}
}

// TestMasquerade: a pod's flow to outside leaves from the node's address
// (its own port when free, checksums right) and its replies come back to
// it; a second pod with the same port collides and gets the other one; a
// third flow to the same destination finds no port and is dropped, counted
// and reported, while another destination has every port again; UDP,
// ICMP echo (the identifier as the port) and an ICMP port unreachable
// quoting a translated datagram (quote, quoted checksums and all) come
// back to the pod; a flow idle past its timeout gives its port up; TCP
// RST marks both entries; excluded destinations, the node's own traffic
// and what is not for a masqueraded flow are left alone.
func TestMasquerade(t *testing.T) {
	d := openMasqDatapath(t, nil)
	flows := flowReader(t, d)
	run := func(prog *ebpf.Program, pkt []byte) (uint32, []byte) {
		t.Helper()
		ret, out, err := prog.Test(pkt)
		if err != nil {
			t.Fatal(err)
		}
		return ret, out
	}
	egress := func(pkt []byte) (uint32, []byte) { t.Helper(); return run(d.uplink.ShuntToUplink, withChecksum(pkt)) }
	ingress := func(pkt []byte) (uint32, []byte) { t.Helper(); return run(d.uplink.ShuntFromUplink, withChecksum(pkt)) }
	before := counts(t, d)

	t.Run("TCP: the pod's own port when free; replies back", func(t *testing.T) {
		for i, flags := range []byte{tcpSYN, tcpACK} {
			ret, out := egress(packet(mqPod, mqOutside, 6, tcpSegment(61001, 443, flags)))
			if got, want := checkedTuple(t, out), (tuple{mqNode, mqOutside, 61001, 443}); ret != tcActOK || got != want {
				t.Errorf("packet %d out: verdict %d, %+v; want OK, %+v", i, ret, got, want)
			}
		}
		ret, out := ingress(packet(mqOutside, mqNode, 6, tcpSegment(443, 61001, tcpSYNACK)))
		if got, want := checkedTuple(t, out), (tuple{mqOutside, mqPod, 443, 61001}); ret != tcActRedirect || got != want {
			t.Errorf("reply: verdict %d, %+v; want redirect to the pod, %+v", ret, got, want)
		}
	})

	t.Run("collision: another pod with the same port gets the other", func(t *testing.T) {
		ret, out := egress(packet(mqPod2, mqOutside, 6, tcpSegment(61001, 443, tcpSYN)))
		if got, want := checkedTuple(t, out), (tuple{mqNode, mqOutside, 61000, 443}); ret != tcActOK || got != want {
			t.Errorf("verdict %d, %+v; want OK, %+v", ret, got, want)
		}
		ret, out = ingress(packet(mqOutside, mqNode, 6, tcpSegment(443, 61000, tcpSYNACK)))
		if got, want := checkedTuple(t, out), (tuple{mqOutside, mqPod2, 443, 61001}); ret != tcActRedirect || got != want {
			t.Errorf("reply: verdict %d, %+v; want redirect to pod 2, %+v", ret, got, want)
		}
	})

	t.Run("exhausted: dropped, counted, reported; another destination has all ports", func(t *testing.T) {
		was := counts(t, d)
		if ret, _ := egress(packet(mqPod, mqOutside, 6, tcpSegment(40000, 443, tcpSYN))); ret != tcActShot {
			t.Errorf("a third flow to %s:443 with two ports: verdict %d, want drop", mqOutside, ret)
		}
		counterDelta(t, d, was, map[string]uint64{"masq-port-exhausted/to-uplink": 1})
		expectFlow(t, flows(), "DROPPED", "masq-port-exhausted")
		ret, out := egress(packet(mqPod, mqOutside, 6, tcpSegment(40000, 80, tcpSYN)))
		if got := checkedTuple(t, out); ret != tcActOK || got.src != mqNode || got.sport < mqPorts.Min || got.sport > mqPorts.Max {
			t.Errorf("to port 80: verdict %d, %+v; want from %s, a port of %s", ret, got, mqNode, mqPorts)
		}
	})

	t.Run("UDP, and an ICMP port unreachable back to the pod's socket", func(t *testing.T) {
		ret, out := egress(packet(mqPod, mqOutside, 17, append(udpDatagramLen(5353, 53, 4), "abcd"...)))
		sent := checkedTuple(t, out)
		if ret != tcActOK || sent.src != mqNode || sent.sport < mqPorts.Min || sent.sport > mqPorts.Max {
			t.Fatalf("UDP out: verdict %d, %+v", ret, sent)
		}
		// What the outside quotes is what it received: the whole datagram.
		unreach := append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, out[14:]...)
		ret, back := ingress(packet(netip.MustParseAddr("203.0.113.1"), mqNode, 1, unreach)) // from a router on the way
		if ret != tcActRedirect {
			t.Fatalf("ICMP error: verdict %d, want redirect to the pod", ret)
		}
		e := checkedICMPError(t, back)
		got := []any{netip.AddrFrom4([4]byte(e.ip[16:20])), netip.AddrFrom4([4]byte(e.quotedIP[12:16])), binary.BigEndian.Uint16(e.quotedL4)}
		if want := []any{mqPod, mqPod, uint16(5353)}; !slices.Equal(got, want) {
			t.Errorf("ICMP error to %v quoting a datagram from %v:%v; want %v", got[0], got[1], got[2], want)
		}
	})

	t.Run("frag needed quoting a TCP segment, back to the pod", func(t *testing.T) {
		ret, out := egress(packet(mqPod, mqOutside, 6, tcpSegment(41000, 8080, tcpSYN)))
		sent := checkedTuple(t, out)
		if ret != tcActOK || sent.src != mqNode {
			t.Fatalf("TCP out: verdict %d, %+v", ret, sent)
		}
		// A router's "fragmentation needed" (MTU 1400) quoting the
		// whole segment as the node sent it.
		fragNeeded := append([]byte{3, 4, 0, 0, 0, 0, 1400 >> 8, 1400 & 0xff}, out[14:]...)
		ret, back := ingress(packet(netip.MustParseAddr("203.0.113.1"), mqNode, 1, fragNeeded))
		if ret != tcActRedirect {
			t.Fatalf("frag needed: verdict %d, want redirect to the pod", ret)
		}
		e := checkedICMPError(t, back)
		got := []any{netip.AddrFrom4([4]byte(e.ip[16:20])), netip.AddrFrom4([4]byte(e.quotedIP[12:16])), binary.BigEndian.Uint16(e.quotedL4), binary.BigEndian.Uint16(e.icmp[6:])}
		if want := []any{mqPod, mqPod, uint16(41000), uint16(1400)}; !slices.Equal(got, want) {
			t.Errorf("frag needed to %v quoting a segment from %v:%v, MTU %v; want %v", got[0], got[1], got[2], got[3], want)
		}
	})

	t.Run("the pod's own ICMP error about a reply leaves from the node", func(t *testing.T) {
		ret, out := egress(packet(mqPod, mqOutside, 17, udpDatagramLen(5454, 53, 2)))
		sent := checkedTuple(t, out)
		if ret != tcActOK {
			t.Fatalf("UDP out: verdict %d", ret)
		}
		// A reply reaches the pod, whose socket is gone: the pod's
		// stack answers port unreachable, quoting the reply as it
		// received it (from the outside to the pod).
		_, reply := ingress(packet(mqOutside, mqNode, 17, append(udpDatagramLen(53, sent.sport, 2), "ok"...)))
		unreach := append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, reply[14:]...)
		ret, gone := egress(packet(mqPod, mqOutside, 1, unreach))
		if ret != tcActOK {
			t.Fatalf("the pod's ICMP error: verdict %d, want OK", ret)
		}
		e := checkedICMPError(t, gone)
		got := []any{netip.AddrFrom4([4]byte(e.ip[12:16])), netip.AddrFrom4([4]byte(e.quotedIP[16:20])), binary.BigEndian.Uint16(e.quotedL4[2:])}
		if want := []any{mqNode, mqNode, sent.sport}; !slices.Equal(got, want) {
			t.Errorf("the pod's ICMP error from %v quoting a datagram to %v:%v; want %v", got[0], got[1], got[2], want)
		}
	})

	t.Run("ICMP echo: the identifier is the port", func(t *testing.T) {
		ret, out := egress(packet(mqPod, mqOutside, 1, icmpEcho(8, 0x1234)))
		sent := checkedTuple(t, out)
		if ret != tcActOK || sent.src != mqNode || sent.sport < mqPorts.Min || sent.sport > mqPorts.Max {
			t.Fatalf("echo out: verdict %d, %+v; want from %s, an identifier of %s", ret, sent, mqNode, mqPorts)
		}
		ret, back := ingress(packet(mqOutside, mqNode, 1, icmpEcho(0, sent.sport)))
		if got, want := checkedTuple(t, back), (tuple{mqOutside, mqPod, 0x1234, 0x1234}); ret != tcActRedirect || got != want {
			t.Errorf("echo reply: verdict %d, %+v; want redirect, %+v", ret, got, want)
		}
	})

	t.Run("a flow idle past its timeout gives its port up", func(t *testing.T) {
		// Both ports towards outside:8443 are held: 61000 by a flow of pod
		// 2 reset long ago, 61001 by a live one.
		stale := uplinktcMasqKey{Saddr: be32(mqPod2), Daddr: be32(mqOutside), Sport: be16(1111), Dport: be16(8443), Proto: 6}
		held := func(port uint16, seen uint64, owner uint16) {
			in := uplinktcMasqKey{Saddr: be32(mqOutside), Daddr: be32(mqNode), Sport: be16(8443), Dport: be16(port), Proto: 6, Dir: uint8(uplinktcMasqDirMASQ_IN)}
			v := uplinktcMasqValue{LastSeenNs: seen, Addr: be32(mqPod2), Port: be16(owner), Flags: uint32(uplinktcMasqFlagsMASQ_F_RST)}
			if err := d.uplink.ShuntMasqNat.Put(in, v); err != nil {
				t.Fatal(err)
			}
		}
		held(61000, 1, 1111)
		if err := d.uplink.ShuntMasqNat.Put(stale, uplinktcMasqValue{LastSeenNs: 1, Addr: be32(mqNode), Port: be16(61000)}); err != nil {
			t.Fatal(err)
		}
		held(61001, uint64(monotonicNow()), 2222)
		ret, out := egress(packet(mqPod, mqOutside, 6, tcpSegment(40000, 8443, tcpSYN)))
		if got, want := checkedTuple(t, out), (tuple{mqNode, mqOutside, 61000, 8443}); ret != tcActOK || got != want {
			t.Errorf("verdict %d, %+v; want OK, %+v (the port of the flow reset long ago)", ret, got, want)
		}
		var v uplinktcMasqValue
		if err := d.uplink.ShuntMasqNat.Lookup(stale, &v); err == nil {
			t.Errorf("the expired flow's own entry is still there: %+v", v)
		}
	})

	t.Run("a closed connection's port is free a second after it closed, not before", func(t *testing.T) {
		now := uint64(monotonicNow())
		held := func(port uint16, seen uint64) {
			in := uplinktcMasqKey{Saddr: be32(mqOutside), Daddr: be32(mqNode), Sport: be16(9443), Dport: be16(port), Proto: 6, Dir: uint8(uplinktcMasqDirMASQ_IN)}
			v := uplinktcMasqValue{LastSeenNs: seen, Addr: be32(mqPod2), Port: be16(port), Flags: uint32(uplinktcMasqFlagsMASQ_F_FIN_OUT | uplinktcMasqFlagsMASQ_F_FIN_IN)}
			if err := d.uplink.ShuntMasqNat.Put(in, v); err != nil {
				t.Fatal(err)
			}
		}
		held(61000, now-uint64(2*time.Second))
		held(61001, now+uint64(time.Minute)) // "later than now": another CPU refreshed it meanwhile
		ret, out := egress(packet(mqPod, mqOutside, 6, tcpSegment(40000, 9443, tcpSYN)))
		if got, want := checkedTuple(t, out), (tuple{mqNode, mqOutside, 61000, 9443}); ret != tcActOK || got != want {
			t.Errorf("verdict %d, %+v; want OK, %+v (the port of the connection closed 2 s ago)", ret, got, want)
		}
		if ret, _ := egress(packet(mqPod, mqOutside, 6, tcpSegment(40001, 9443, tcpSYN))); ret != tcActShot {
			t.Errorf("a second flow while the other port's connection closed just now: verdict %d, want drop (exhausted)", ret)
		}
	})

	t.Run("a reset marks both entries of the flow", func(t *testing.T) {
		egress(packet(mqPod, mqOutside, 6, tcpSegment(61001, 443, 0x04)))
		out := uplinktcMasqKey{Saddr: be32(mqPod), Daddr: be32(mqOutside), Sport: be16(61001), Dport: be16(443), Proto: 6}
		in := uplinktcMasqKey{Saddr: be32(mqOutside), Daddr: be32(mqNode), Sport: be16(443), Dport: be16(61001), Proto: 6, Dir: uint8(uplinktcMasqDirMASQ_IN)}
		for _, k := range []uplinktcMasqKey{out, in} {
			var v uplinktcMasqValue
			if err := d.uplink.ShuntMasqNat.Lookup(k, &v); err != nil || v.Flags&uint32(uplinktcMasqFlagsMASQ_F_RST) == 0 {
				t.Errorf("entry %+v: %+v, %v; want the rst flag", k, v, err)
			}
		}
	})

	t.Run("left alone", func(t *testing.T) {
		for _, c := range []struct {
			name string
			prog *ebpf.Program
			pkt  []byte
		}{
			{"to an excluded destination", d.uplink.ShuntToUplink, packet(mqPod, netip.MustParseAddr("10.96.0.10"), 6, tcpSegment(40001, 80, tcpSYN))},
			{"the node's own", d.uplink.ShuntToUplink, packet(mqNode, mqOutside, 6, tcpSegment(40001, 443, tcpSYN))},
			{"to the node, no masqueraded flow", d.uplink.ShuntFromUplink, packet(mqOutside, mqNode, 6, tcpSegment(443, 22, tcpSYN))},
			{"not for the node", d.uplink.ShuntFromUplink, packet(mqOutside, mqPod, 6, tcpSegment(443, 61001, tcpSYNACK))},
		} {
			in := withChecksum(c.pkt)
			ret, out := run(c.prog, bytes.Clone(in))
			if ret != tcActOK || !bytes.Equal(out, in) {
				t.Errorf("%s: verdict %d, changed %v; want OK, unchanged", c.name, ret, !bytes.Equal(out, in))
			}
		}
	})

	counterDelta(t, d, before, nil, "masqueraded/to-uplink", "unmasqueraded/from-uplink", "forwarded/from-uplink")
	rows, err := d.DumpMap("shunt_masq_nat", false)
	if err != nil || len(rows) == 0 || rows[0]["node"] == nil || rows[0]["pod"] == nil {
		t.Errorf("dump of shunt_masq_nat: %v, %v", rows, err)
	}
}

// TestMasqueradeInsertFailed: a flow whose translation cannot be recorded
// is dropped, counted and reported as masq-insert-failed.
func TestMasqueradeInsertFailed(t *testing.T) {
	d := openMasqDatapath(t, smallHash(4, "shunt_masq_nat"))
	fill[uplinktcMasqKey, uplinktcMasqValue](t, d.uplink.ShuntMasqNat, func(i int) uplinktcMasqKey {
		return uplinktcMasqKey{Saddr: uint32(i + 1), Proto: 99}
	})
	flows := flowReader(t, d)
	before := counts(t, d)
	ret, _, err := d.uplink.ShuntToUplink.Test(withChecksum(packet(mqPod, mqOutside, 17, udpDatagram(5353, 53))))
	if err != nil {
		t.Fatal(err)
	}
	if ret != tcActShot {
		t.Errorf("verdict %d with a full NAT table, want drop", ret)
	}
	counterDelta(t, d, before, map[string]uint64{"masq-insert-failed/to-uplink": 1})
	expectFlow(t, flows(), "DROPPED", "masq-insert-failed")
}

// udpDatagramLen is a UDP header for a payload of n bytes.
func udpDatagramLen(sport, dport uint16, n int) []byte {
	udp := udpDatagram(sport, dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+n))
	return udp
}

// TestMasqueradeLeavesRepliesOfInbound: a connection the outside opens to
// a pod (its address routed to the node) is tracked by the pod's programs
// as opened by the outside; the pod's replies (a SYN-ACK, a UDP answer)
// leave the uplink with the pod's address, untranslated, as the client
// expects them, and take no masquerade port. A connection the pod opens
// to the same host is still masqueraded.
func TestMasqueradeLeavesRepliesOfInbound(t *testing.T) {
	d := openMasqDatapath(t, nil)
	run := func(prog *ebpf.Program, pkt []byte) (uint32, []byte) {
		t.Helper()
		ret, out, err := prog.Test(withChecksum(pkt))
		if err != nil {
			t.Fatal(err)
		}
		return ret, out
	}
	masqEntries := func() int {
		t.Helper()
		n := 0
		var k uplinktcMasqKey
		var v uplinktcMasqValue
		it := d.uplink.ShuntMasqNat.Iterate()
		for it.Next(&k, &v) {
			n++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := counts(t, d)

	for _, c := range []struct {
		name           string
		proto          uint8
		request, reply []byte
	}{
		{"TCP", 6, tcpSegment(45000, 8080, tcpSYN), tcpSegment(8080, 45000, tcpSYNACK)},
		{"UDP", 17, append(udpDatagramLen(45001, 5353, 2), "hi"...), append(udpDatagramLen(5353, 45001, 2), "ok"...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The request reaches the pod through its veth's to-pod
			// program, which tracks the connection as the outside's.
			if ret, _ := run(d.objs.ShuntToPod, packet(mqOutside, mqPod, c.proto, c.request)); ret == tcActShot {
				t.Fatalf("the request to the pod: dropped")
			}
			if ret, _ := run(d.objs.ShuntFromPod, packet(mqPod, mqOutside, c.proto, c.reply)); ret == tcActShot {
				t.Fatalf("the pod's reply at its veth: dropped")
			}
			entries := masqEntries()
			in := withChecksum(packet(mqPod, mqOutside, c.proto, c.reply))
			ret, out := run(d.uplink.ShuntToUplink, bytes.Clone(in))
			if ret != tcActOK || !bytes.Equal(out, in) {
				t.Errorf("the pod's reply at the uplink: verdict %d, changed %v (from %v); want OK, unchanged (from the pod's address)",
					ret, !bytes.Equal(out, in), checkedTuple(t, out).src)
			}
			if n := masqEntries(); n != entries {
				t.Errorf("shunt_masq_nat went from %d to %d entries; a reply takes no port", entries, n)
			}
		})
	}

	t.Run("a connection the pod opens is still masqueraded", func(t *testing.T) {
		syn := tcpSegment(46000, 443, tcpSYN)
		if ret, _ := run(d.objs.ShuntFromPod, packet(mqPod, mqOutside, 6, syn)); ret == tcActShot {
			t.Fatalf("the pod's SYN at its veth: dropped")
		}
		ret, out := run(d.uplink.ShuntToUplink, packet(mqPod, mqOutside, 6, syn))
		if got := checkedTuple(t, out); ret != tcActOK || got.src != mqNode {
			t.Errorf("the pod's SYN at the uplink: verdict %d, %+v; want OK from %s", ret, got, mqNode)
		}
	})
	counterDelta(t, d, before, map[string]uint64{"masqueraded/to-uplink": 1}, "to-stack/from-pod", "forwarded/to-pod")
}
