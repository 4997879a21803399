package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/services"
)

// dsrOuterLen is the outer header DSR puts in front of a packet: IPv4
// with one 8-byte option (bpf/lib/dsr.h).
const dsrOuterLen = 28

// dsrPacket is what a node sends another by DSR: frame's packet (an
// Ethernet frame as packet builds it, checksums filled in) behind an outer
// IPv4 header from outerSrc to outerDst with the option naming svc:port.
func dsrPacket(outerSrc, outerDst, svc netip.Addr, port uint16, frame []byte) []byte {
	frame = withChecksum(frame)
	inner := frame[14:]
	o := make([]byte, dsrOuterLen)
	o[0] = 0x47
	binary.BigEndian.PutUint16(o[2:], uint16(dsrOuterLen+len(inner)))
	binary.BigEndian.PutUint16(o[6:], 0x4000)
	o[8], o[9] = 64, 4
	s, d, a := outerSrc.As4(), outerDst.As4(), svc.As4()
	copy(o[12:], s[:])
	copy(o[16:], d[:])
	o[20], o[21] = 0x9a, 8
	binary.BigEndian.PutUint16(o[22:], port)
	copy(o[24:], a[:])
	binary.BigEndian.PutUint16(o[10:], ipChecksum(o))
	out := append([]byte{}, frame[:14]...)
	out = append(out, o...)
	return append(out, inner...)
}

// dsrNode is a NodePort test node (nodePortTestNode) in mode, its pod
// npLocalPod and npRemotePod of the other node known, with a NodePort of
// each (30080 local, 30081 and UDP 30054 remote) and a load balancer
// address of the local one; run runs a program on a packet, the output
// as long as the program made it.
func dsrNode(t *testing.T, mode dpinfo.NodePortMode) (d *Datapath, fromOutside, fromPod func([]byte) (uint32, []byte)) {
	d, _, fromOutside, fromPod = dsrNodeWith(t, mode, nil)
	return d, fromOutside, fromPod
}

// dsrNodeWith is dsrNode taking the kernel fallbacks given; fromOutsideGSO
// runs the uplink's ingress program on a packet the kernel holds as a GSO
// packet of segments of gsoSize bytes.
func dsrNodeWith(t *testing.T, mode dpinfo.NodePortMode, fallbacks dpinfo.Fallbacks) (d *Datapath,
	fromOutsideGSO func(pkt []byte, gsoSize uint32) (uint32, []byte), fromOutside, fromPod func([]byte) (uint32, []byte)) {
	return dsrNodeRouted(t, mode, fallbacks, false)
}

// dsrNodeRouted is dsrNodeWith with the VXLAN overlay (tunnel) instead of
// native routing (nodePortTestNodeRouted).
func dsrNodeRouted(t *testing.T, mode dpinfo.NodePortMode, fallbacks dpinfo.Fallbacks, tunnel bool) (d *Datapath,
	fromOutsideGSO func(pkt []byte, gsoSize uint32) (uint32, []byte), fromOutside, fromPod func([]byte) (uint32, []byte)) {
	d, ns, uplink := nodePortTestNodeRouted(t, 0, mode, fallbacks, tunnel)
	syncNodePortPods(t, d)
	// The other node is a node of the cluster: its DSR packets are taken.
	if err := d.SyncDSRNodes([]netip.Addr{npOtherNode}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SyncServices(dsrTestPorts()); err != nil {
		t.Fatal(err)
	}
	run := func(prog *ebpf.Program, pkt []byte, ctx []byte) (uint32, []byte) {
		t.Helper()
		var ret uint32
		opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256), Context: ctx}
		if err := netnsrun.Do(ns, func() error {
			var err error
			ret, err = prog.Run(opts)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ret, opts.DataOut
	}
	fromOutside = func(pkt []byte) (uint32, []byte) {
		t.Helper()
		return run(d.uplink.ShuntFromUplink, pkt, skbContext(uplink))
	}
	fromPod = func(pkt []byte) (uint32, []byte) { t.Helper(); return run(d.objs.ShuntFromPod, withChecksum(pkt), nil) }
	fromOutsideGSO = func(pkt []byte, gsoSize uint32) (uint32, []byte) {
		t.Helper()
		ctx := append(skbContext(uplink), make([]byte, skbGSOSizeOff+4-44)...)
		binary.NativeEndian.PutUint32(ctx[skbGSOSizeOff:], gsoSize)
		binary.NativeEndian.PutUint32(ctx[skbGSOSegsOff:], uint32(len(pkt)+int(gsoSize)-1)/gsoSize)
		return run(d.uplink.ShuntFromUplink, pkt, ctx)
	}
	return d, fromOutsideGSO, fromOutside, fromPod
}

// dsrTestPorts are dsrNode's Services.
func dsrTestPorts() []services.Port {
	local := []services.Backend{{IP: npLocalPod, Port: 8080}}
	remote := []services.Backend{{IP: npRemotePod, Port: 8080}}
	return []services.Port{
		{Frontend: services.Frontend{VIP: npNode, Port: 30080, Proto: 6}, Kind: services.KindNodePort, Name: "local", Backends: local},
		{Frontend: services.Frontend{VIP: npLB, Port: 80, Proto: 6}, Kind: services.KindLoadBalancer, Name: "lb", Backends: local},
		{Frontend: services.Frontend{VIP: npNode, Port: 30081, Proto: 6}, Kind: services.KindNodePort, Name: "remote", Backends: remote},
		{Frontend: services.Frontend{VIP: npNode, Port: 30054, Proto: 17}, Kind: services.KindNodePort, Name: "dns-remote",
			Backends: []services.Backend{{IP: npRemotePod, Port: 5353}}},
	}
}

// nodePortEntries counts shunt_nodeport_nat's entries: the replies' and
// the DSR client entries.
func nodePortEntries(t *testing.T, d *Datapath) (replies, dsr int) {
	t.Helper()
	var k podtcTcNatKey
	var v uplinktcNodeportNatValue
	it := d.objs.ShuntNodeportNat.Iterate()
	for it.Next(&k, &v) {
		if v.Reply != 0 {
			replies++
		}
		if v.Dsr != 0 {
			dsr++
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return replies, dsr
}

func TestNodePortDSR(t *testing.T) {
	d, fromOutside, fromPod := dsrNode(t, dpinfo.NodePortDSR)
	flows := flowReader(t, d)
	before := counts(t, d)

	t.Run("ingress node: IPIP to the backend's node, the client's address and the service in the option", func(t *testing.T) {
		for i, flags := range []byte{tcpSYN, tcpACK} {
			in := withChecksum(packet(npClient, npNode, 6, tcpSegment(40001, 30081, flags)))
			ret, out := fromOutside(in)
			if ret != tcActRedirect || len(out) != len(in)+dsrOuterLen {
				t.Fatalf("packet %d: verdict %d, %d bytes; want redirect, %d bytes", i, ret, len(out), len(in)+dsrOuterLen)
			}
			if dst := net.HardwareAddr(out[0:6]).String(); dst != "02:00:00:00:00:02" {
				t.Errorf("to MAC %s, want the other node's", dst)
			}
			o := out[14 : 14+dsrOuterLen]
			if ipChecksum(o) != 0 {
				t.Error("outer header checksum wrong")
			}
			src, dst := netip.AddrFrom4([4]byte(o[12:16])), netip.AddrFrom4([4]byte(o[16:20]))
			svc, port := netip.AddrFrom4([4]byte(o[24:28])), binary.BigEndian.Uint16(o[22:])
			if o[0] != 0x47 || o[9] != 4 || src != npNode || dst != npOtherNode || o[20] != 0x9a || o[21] != 8 || svc != npNode || port != 30081 ||
				int(binary.BigEndian.Uint16(o[2:])) != len(out)-14 {
				t.Errorf("outer header % x: want IPIP with an option, %s -> %s, service %s:30081, length %d", o, npNode, npOtherNode, npNode, len(out)-14)
			}
			inner := append(append([]byte{}, out[:14]...), out[14+dsrOuterLen:]...)
			if got, want := checkedTuple(t, inner), (tuple{npClient, npRemotePod, 40001, 8080}); got != want {
				t.Errorf("inner %+v, want %+v", got, want)
			}
			if ttl := inner[14+8]; ttl != 63 {
				t.Errorf("inner TTL %d, want 63 (one hop)", ttl)
			}
		}
		if replies, dsr := nodePortEntries(t, d); replies != 0 || dsr != 1 {
			t.Errorf("shunt_nodeport_nat: %d reply entries and %d DSR entries, want none (the reply leaves from the backend's node) and 1", replies, dsr)
		}
		var saw bool
		for _, f := range flows() {
			if f.Reason == "dsr-encap" && f.OrigDst == npNode && f.OrigDstPort == 30081 {
				saw = true
			}
		}
		if !saw {
			t.Error("no flow names dsr-encap with the NodePort as its service")
		}
	})

	t.Run("UDP by DSR too (mode dsr, not hybrid)", func(t *testing.T) {
		ret, out := fromOutside(withChecksum(packet(npClient, npNode, 17, udpDatagram(40001, 30054))))
		if ret != tcActRedirect || len(out) < 14+dsrOuterLen+28 || out[14+9] != 4 {
			t.Fatalf("verdict %d, %d bytes; want IPIP", ret, len(out))
		}
		inner := append(append([]byte{}, out[:14]...), out[14+dsrOuterLen:]...)
		if got, want := checkedTuple(t, inner), (tuple{npClient, npRemotePod, 40001, 5353}); got != want {
			t.Errorf("inner %+v, want %+v", got, want)
		}
	})

	t.Run("too big once encapsulated: fragmentation needed with DF, dropped without", func(t *testing.T) {
		big := func(df bool) []byte {
			pkt := packet(npClient, npNode, 6, append(tcpSegment(40002, 30081, tcpACK), make([]byte, 1500-40)...))
			if df {
				binary.BigEndian.PutUint16(pkt[14+6:], 0x4000)
				binary.BigEndian.PutUint16(pkt[14+10:], 0)
				binary.BigEndian.PutUint16(pkt[14+10:], ipChecksum(pkt[14:34]))
			}
			return withChecksum(pkt)
		}
		ret, out := fromOutside(big(true))
		if ret != tcActRedirect {
			t.Fatalf("verdict %d, want the answer redirected back out", ret)
		}
		// The quote is the IPv4 header and 8 bytes, as a router's.
		e := icmpError{ip: out[14:34], icmp: out[34:]}
		e.quotedIP, e.quotedL4 = e.icmp[8:28], e.icmp[28:36]
		if ipChecksum(e.ip) != 0 || ipChecksum(e.icmp) != 0 || ipChecksum(e.quotedIP) != 0 {
			t.Error("a checksum of the answer is wrong")
		}
		if e.icmp[0] != 3 || e.icmp[1] != 4 || binary.BigEndian.Uint16(e.icmp[6:]) != 1500-dsrOuterLen {
			t.Errorf("ICMP % x, want fragmentation needed, MTU %d", e.icmp[:8], 1500-dsrOuterLen)
		}
		if dst := netip.AddrFrom4([4]byte(e.ip[16:20])); dst != npClient {
			t.Errorf("answer to %s, want the client", dst)
		}
		if q := netip.AddrFrom4([4]byte(e.quotedIP[16:20])); q != npNode || binary.BigEndian.Uint16(e.quotedL4[2:]) != 30081 {
			t.Errorf("quote to %s:%d, want the NodePort as the client sent it", q, binary.BigEndian.Uint16(e.quotedL4[2:]))
		}
		if ret, _ := fromOutside(big(false)); ret != tcActShot {
			t.Errorf("without DF: verdict %d, want drop", ret)
		}
	})

	t.Run("backend's node: decapsulated, recorded, the reply from the service address", func(t *testing.T) {
		in := dsrPacket(npOtherNode, npNode, npLB, 80, packet(npClient, npLocalPod, 6, tcpSegment(40003, 8080, tcpSYN)))
		ret, out := fromOutside(in)
		if ret != tcActRedirect || len(out) != len(in)-dsrOuterLen {
			t.Fatalf("verdict %d, %d bytes; want redirect into the pod, %d bytes", ret, len(out), len(in)-dsrOuterLen)
		}
		if got, want := checkedTuple(t, out), (tuple{npClient, npLocalPod, 40003, 8080}); got != want {
			t.Errorf("delivered %+v, want %+v", got, want)
		}
		ret, out = fromPod(packet(npLocalPod, npClient, 6, tcpSegment(8080, 40003, tcpSYNACK)))
		if got, want := checkedTuple(t, out), (tuple{npLB, npClient, 80, 40003}); ret != tcActRedirect || got != want {
			t.Errorf("reply: verdict %d, %+v; want redirect out of the uplink, %+v", ret, got, want)
		}
		// The route to the load balancer address moves to this node: the
		// client's next packet, arriving as it is, finds the flow.
		ret, out = fromOutside(withChecksum(packet(npClient, npLB, 6, tcpSegment(40003, 80, tcpACK))))
		if got, want := checkedTuple(t, out), (tuple{npClient, npLocalPod, 40003, 8080}); ret != tcActRedirect || got != want {
			t.Errorf("after the move: verdict %d, %+v; want %+v", ret, got, want)
		}
	})

	t.Run("backend's node: an inner source of the cluster is refused", func(t *testing.T) {
		in := dsrPacket(npOtherNode, npNode, npLB, 80, packet(npRemotePod, npLocalPod, 6, tcpSegment(40004, 8080, tcpSYN)))
		if ret, _ := fromOutside(in); ret != tcActShot {
			t.Errorf("verdict %d, want drop (tunnel-spoofed)", ret)
		}
	})

	counterDelta(t, d, before, map[string]uint64{
		"dsr-encap/from-uplink": 3, "dsr-decap/from-uplink": 1, "dsr-too-big/from-uplink": 1,
		"frag-needed/from-uplink": 1, "tunnel-spoofed/from-uplink": 1, "nodeport-reply/from-pod": 1,
	})
}

// TestNodePortHybrid: TCP by DSR, UDP by SNAT, with native routing and
// with the overlay (UDP's SNAT into the tunnel, TCP's IPIP out of the
// uplink).
func TestNodePortHybrid(t *testing.T) {
	for _, tunnel := range []bool{false, true} {
		t.Run(map[bool]string{false: "native", true: "overlay"}[tunnel], func(t *testing.T) {
			d, _, fromOutside, _ := dsrNodeRouted(t, dpinfo.NodePortHybrid, nil, tunnel)
			before := counts(t, d)
			ret, out := fromOutside(withChecksum(packet(npClient, npNode, 6, tcpSegment(40001, 30081, tcpSYN))))
			if ret != tcActRedirect || out[14+9] != 4 {
				t.Errorf("TCP: verdict %d, protocol %d; want DSR (IPIP)", ret, out[14+9])
			}
			ret, out = fromOutside(withChecksum(packet(npClient, npNode, 17, udpDatagram(40001, 30054))))
			if got := checkedTuple(t, out); ret != tcActRedirect || got.src != npSNAT || got.dst != npRemotePod {
				t.Errorf("UDP: verdict %d, %+v; want SNAT from %s to %s", ret, got, npSNAT, npRemotePod)
			}
			if replies, dsr := nodePortEntries(t, d); replies != 1 || dsr != 1 {
				t.Errorf("shunt_nodeport_nat: %d reply entries, %d DSR entries; want 1 (UDP's SNAT) and 1 (TCP's DSR)", replies, dsr)
			}
			toTunnel := uint64(0)
			if tunnel {
				toTunnel = 1
			}
			counterDelta(t, d, before, map[string]uint64{"dsr-encap/from-uplink": 1, "to-tunnel/from-uplink": toTunnel})
		})
	}
}

// Offsets in struct __sk_buff of what a test run may set beyond
// skbContext: the GSO segment count and size.
const (
	skbGSOSegsOff = 164
	skbGSOSizeOff = 176
)

// TestNodePortDSRNoGSODecap: with the kernel fallback dsr-no-gso-decap
// (Linux < 6.3, forced here), the backend's node still decapsulates a
// single DSR packet (without BPF_F_ADJ_ROOM_DECAP_L3_IPV4), and drops a
// GSO one, counted dsr-gso-decap, rather than hand the pod a packet
// whose GSO type still says IPIP.
func TestNodePortDSRNoGSODecap(t *testing.T) {
	d, fromOutsideGSO, fromOutside, _ := dsrNodeWith(t, dpinfo.NodePortDSR, dpinfo.Fallbacks{dpinfo.FallbackNoGSODecap: true})
	before := counts(t, d)
	in := dsrPacket(npOtherNode, npNode, npLB, 80, packet(npClient, npLocalPod, 6, tcpSegment(40005, 8080, tcpSYN)))
	ret, out := fromOutside(in)
	if ret != tcActRedirect || len(out) < len(in)-dsrOuterLen {
		t.Fatalf("a single packet: verdict %d, %d bytes; want redirect into the pod, %d bytes", ret, len(out), len(in)-dsrOuterLen)
	}
	if got, want := checkedTuple(t, out[:len(in)-dsrOuterLen]), (tuple{npClient, npLocalPod, 40005, 8080}); got != want {
		t.Errorf("delivered %+v, want %+v", got, want)
	}
	gso := dsrPacket(npOtherNode, npNode, npLB, 80, packet(npClient, npLocalPod, 6, append(tcpSegment(40005, 8080, tcpACK), make([]byte, 2000)...)))
	if ret, _ := fromOutsideGSO(gso, 1000); ret != tcActShot {
		t.Errorf("a GSO packet: verdict %d, want drop", ret)
	}
	counterDelta(t, d, before, map[string]uint64{"dsr-decap/from-uplink": 1, "dsr-gso-decap/from-uplink": 1})
}

// tcpWithMSS is a TCP header with options NOP×4 and MSS mss.
func tcpWithMSS(sport, dport uint16, flags byte, mss uint16) []byte {
	return tcpWithMSSAfter(sport, dport, flags, mss, []byte{1, 1, 1, 1})
}

// tcpWithMSSAfter is a TCP header with options before (a multiple of 4
// bytes long), then MSS mss.
func tcpWithMSSAfter(sport, dport uint16, flags byte, mss uint16, before []byte) []byte {
	tcp := append(append(tcpSegment(sport, dport, flags), before...), 2, 4, byte(mss>>8), byte(mss))
	tcp[12] = byte(len(tcp)/4) << 4
	return tcp
}

// mssOf reads the MSS option of a packet tcpWithMSSAfter built (the
// last option), checking the TCP checksum.
func mssOf(t *testing.T, pkt []byte) uint16 {
	t.Helper()
	tcpLen := int(pkt[14+20+12]>>4) * 4
	checkedTuple(t, pkt[:14+20+tcpLen])
	return binary.BigEndian.Uint16(pkt[14+20+tcpLen-2:])
}

// TestNodePortDSRClampMSS: the backend's SYN-ACK to a flow that arrived
// by DSR announces an MSS that leaves room for DSR's 28 bytes on the
// uplink (MTU 1500: 1432), so that the client's segments fit once the
// ingress node encapsulates them; a smaller MSS stays, and so does the
// MSS of a flow that came straight to this node (no DSR).
func TestNodePortDSRClampMSS(t *testing.T) {
	_, fromOutside, fromPod := dsrNode(t, dpinfo.NodePortDSR)
	nops := []byte{1, 1, 1, 1}
	// SACK permitted, a timestamp, a window scale and 17 NOPs: the MSS
	// is the 21st option, in the header's last 4 bytes (the walk stopped
	// at the 8th before).
	late := append([]byte{4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 3, 3, 7, 1}, bytes.Repeat([]byte{1}, 16)...)
	// An option whose length runs past the header's end hides the MSS.
	malformed := []byte{1, 1, 8, 40}
	for _, c := range []struct {
		what       string
		viaDSR     bool
		cport, mss uint16
		before     []byte
		want       uint16
	}{
		{"by DSR, MSS 1460", true, 40021, 1460, nops, 1432},
		{"by DSR, MSS 1200", true, 40022, 1200, nops, 1200},
		{"straight to this node, MSS 1460", false, 40023, 1460, nops, 1460},
		{"by DSR, MSS 1460 after 20 other options", true, 40024, 1460, late, 1432},
		{"by DSR, MSS 1460 after a malformed option", true, 40025, 1460, malformed, 1460},
	} {
		syn := packet(npClient, npLocalPod, 6, tcpSegment(c.cport, 8080, tcpSYN))
		var ret uint32
		if c.viaDSR {
			ret, _ = fromOutside(dsrPacket(npOtherNode, npNode, npLB, 80, syn))
		} else {
			ret, _ = fromOutside(withChecksum(packet(npClient, npLB, 6, tcpSegment(c.cport, 80, tcpSYN))))
		}
		if ret != tcActRedirect {
			t.Fatalf("%s: the client's SYN: verdict %d, want redirect into the pod", c.what, ret)
		}
		in := packet(npLocalPod, npClient, 6, tcpWithMSSAfter(8080, c.cport, tcpSYNACK, c.mss, c.before))
		ret, out := fromPod(in)
		if got := checkedTuple(t, out[:len(in)]); ret != tcActRedirect || got != (tuple{npLB, npClient, 80, c.cport}) {
			t.Fatalf("%s: the SYN-ACK: verdict %d, %+v", c.what, ret, got)
		}
		if got := mssOf(t, out[:len(in)]); got != c.want {
			t.Errorf("%s: the SYN-ACK leaves with MSS %d, want %d", c.what, got, c.want)
		}
	}
}

// TestNodePortDSRClientPortReused: the backend sees the client's own
// address whether the flow came straight to this node or by DSR from
// another, so both flows of one client port have one reply tuple. A
// client that reuses its port through the other frontend takes that
// reply tuple over, and when it comes back to the first frontend its SYN
// takes it back: each connection's SYN-ACK leaves from the frontend that
// connection dialled (before, the DSR flow's SYN-ACK left from the
// node's NodePort, and the client reset it).
func TestNodePortDSRClientPortReused(t *testing.T) {
	_, fromOutside, fromPod := dsrNode(t, dpinfo.NodePortDSR)
	synAck := func(what string, want tuple) {
		t.Helper()
		ret, out := fromPod(packet(npLocalPod, npClient, 6, tcpSegment(8080, 40040, tcpSYNACK)))
		if got := checkedTuple(t, out); ret != tcActRedirect || got != want {
			t.Errorf("%s: the SYN-ACK leaves %+v (verdict %d), want %+v", what, got, ret, want)
		}
	}
	viaDSR := func() uint32 {
		ret, _ := fromOutside(dsrPacket(npOtherNode, npNode, npLB, 80, packet(npClient, npLocalPod, 6, tcpSegment(40040, 8080, tcpSYN))))
		return ret
	}
	straight := func() uint32 {
		ret, _ := fromOutside(withChecksum(packet(npClient, npNode, 6, tcpSegment(40040, 30080, tcpSYN))))
		return ret
	}
	for i, step := range []struct {
		what string
		send func() uint32
		want tuple
	}{
		{"by DSR through the load balancer address", viaDSR, tuple{npLB, npClient, 80, 40040}},
		{"the same port straight to this node's NodePort", straight, tuple{npNode, npClient, 30080, 40040}},
		{"the same port by DSR again", viaDSR, tuple{npLB, npClient, 80, 40040}},
		{"and straight again", straight, tuple{npNode, npClient, 30080, 40040}},
	} {
		if ret := step.send(); ret != tcActRedirect {
			t.Fatalf("step %d (%s): the SYN: verdict %d, want redirect into the pod", i, step.what, ret)
		}
		synAck(step.what, step.want)
	}
}

// TestNodePortDSROverlay: with the VXLAN overlay instead of native
// routing, DSR goes the same way: the IPIP leaves by the uplink to the
// backend's node's underlay address (its MAC, the outer header built as
// with native routing), never into the VXLAN device. The room is the
// pods' MTU (the tunnel device's, 1450) rather than the uplink's less 28
// (1472): a single packet of 1460 bytes with DF is answered with
// fragmentation needed naming 1450, one of 1450 goes; the backend's
// SYN-ACK to a flow that came by DSR is clamped to 1410. The backend's
// reply leaves out of the uplink from the service address. (Hybrid mode
// with the overlay: TestNodePortHybrid.)
func TestNodePortDSROverlay(t *testing.T) {
	d, _, fromOutside, fromPod := dsrNodeRouted(t, dpinfo.NodePortDSR, nil, true)
	before := counts(t, d)
	sized := func(sport uint16, ipLen int) []byte {
		pkt := packet(npClient, npNode, 6, append(tcpSegment(sport, 30081, tcpACK), make([]byte, ipLen-40)...))
		binary.BigEndian.PutUint16(pkt[14+6:], 0x4000)
		binary.BigEndian.PutUint16(pkt[14+10:], 0)
		binary.BigEndian.PutUint16(pkt[14+10:], ipChecksum(pkt[14:34]))
		return withChecksum(pkt)
	}
	for _, c := range []struct {
		what   string
		sport  uint16
		ipLen  int
		tooBig bool
	}{
		{"a SYN", 40051, 40, false},
		{"1450 bytes, the pods' MTU", 40052, fragTunnelMTU, false},
		{"1460 bytes: fits the uplink with IPIP, not the pod", 40053, fragTunnelMTU + 10, true},
	} {
		in := sized(c.sport, c.ipLen)
		if c.ipLen == 40 {
			in = withChecksum(packet(npClient, npNode, 6, tcpSegment(c.sport, 30081, tcpSYN)))
		}
		ret, out := fromOutside(in)
		if ret != tcActRedirect {
			t.Fatalf("%s: verdict %d, want redirect", c.what, ret)
		}
		if c.tooBig {
			e := icmpError{ip: out[14:34], icmp: out[34:]}
			if e.icmp[0] != 3 || e.icmp[1] != 4 || binary.BigEndian.Uint16(e.icmp[6:]) != fragTunnelMTU ||
				netip.AddrFrom4([4]byte(e.ip[16:20])) != npClient || ipChecksum(e.icmp) != 0 {
				t.Errorf("%s: ICMP % x to %s; want fragmentation needed, MTU %d, to the client", c.what, e.icmp[:8],
					netip.AddrFrom4([4]byte(e.ip[16:20])), fragTunnelMTU)
			}
			continue
		}
		o := out[14 : 14+dsrOuterLen]
		if len(out) != len(in)+dsrOuterLen || o[9] != 4 || o[20] != 0x9a || netip.AddrFrom4([4]byte(o[16:20])) != npOtherNode ||
			netip.AddrFrom4([4]byte(o[12:16])) != npNode || ipChecksum(o) != 0 {
			t.Errorf("%s: %d bytes, outer % x; want %d bytes, IPIP with the DSR option from %s to %s", c.what, len(out), o,
				len(in)+dsrOuterLen, npNode, npOtherNode)
		}
		if dst := net.HardwareAddr(out[0:6]).String(); dst != "02:00:00:00:00:02" {
			t.Errorf("%s: to MAC %s, want the other node's on the uplink", c.what, dst)
		}
	}

	// The backend's node: the SYN-ACK leaves out of the uplink from
	// the service address, its MSS clamped to the pods' MTU.
	for _, c := range []struct {
		cport, mss, want uint16
	}{{40054, 1460, fragTunnelMTU - 40}, {40055, 1400, 1400}} {
		if ret, _ := fromOutside(dsrPacket(npOtherNode, npNode, npLB, 80, packet(npClient, npLocalPod, 6, tcpSegment(c.cport, 8080, tcpSYN)))); ret != tcActRedirect {
			t.Fatalf("the client's SYN by DSR: verdict %d, want redirect into the pod", ret)
		}
		in := packet(npLocalPod, npClient, 6, tcpWithMSS(8080, c.cport, tcpSYNACK, c.mss))
		ret, out := fromPod(in)
		if got := checkedTuple(t, out[:len(in)]); ret != tcActRedirect || got != (tuple{npLB, npClient, 80, c.cport}) {
			t.Fatalf("the SYN-ACK: verdict %d, %+v; want redirect out of the uplink from %s:80", ret, got, npLB)
		}
		if dst := net.HardwareAddr(out[0:6]).String(); dst != "02:00:00:00:00:09" {
			t.Errorf("the SYN-ACK to MAC %s, want the client's on the uplink", dst)
		}
		if got := mssOf(t, out[:len(in)]); got != c.want {
			t.Errorf("MSS %d: the SYN-ACK leaves with MSS %d, want %d", c.mss, got, c.want)
		}
	}
	counterDelta(t, d, before, map[string]uint64{"dsr-encap/from-uplink": 2, "frag-needed/from-uplink": 1,
		"dsr-decap/from-uplink": 2, "nodeport-reply/from-pod": 2, "to-tunnel/from-uplink": 0})
}

// TestNodePortDSRICMPErrorFromOutside: an ICMP error a router sends
// about a DSR flow's reply is addressed to the service address the reply
// left from, so it reaches the ingress node: that node sends it on to the
// backend's node in DSR's IPIP, as it is (one hop less), the option
// naming the service. The backend's node translates it for the pod (outer
// destination and quote the backend's, every checksum right) and delivers
// it; an error about a flow it does not hold is dropped. With native
// routing and with the overlay.
func TestNodePortDSRICMPErrorFromOutside(t *testing.T) {
	router := netip.MustParseAddr("203.0.113.1")
	for _, tunnel := range []bool{false, true} {
		t.Run(map[bool]string{false: "native", true: "overlay"}[tunnel], func(t *testing.T) {
			d, _, fromOutside, fromPod := dsrNodeRouted(t, dpinfo.NodePortDSR, nil, tunnel)
			before := counts(t, d)

			// The ingress node: a DSR flow (UDP, mode dsr), then a
			// router's fragmentation needed about its reply, which left
			// the backend's node from the NodePort.
			if ret, out := fromOutside(withChecksum(packet(npClient, npNode, 17, udpDatagram(40071, 30054)))); ret != tcActRedirect || out[14+9] != 4 {
				t.Fatalf("the client's datagram: verdict %d; want DSR", ret)
			}
			reply := withChecksum(packet(npNode, npClient, 17, udpDatagram(30054, 40071)))
			in := withChecksum(packet(router, npNode, 1, icmpFragNeeded(reply, 1300)))
			ret, out := fromOutside(bytes.Clone(in))
			if ret != tcActRedirect || len(out) < len(in)+dsrOuterLen {
				t.Fatalf("the error at the ingress node: verdict %d, %d bytes; want redirect, IPIP", ret, len(out))
			}
			o := out[14 : 14+dsrOuterLen]
			if o[9] != 4 || netip.AddrFrom4([4]byte(o[16:20])) != npOtherNode || o[20] != 0x9a ||
				netip.AddrFrom4([4]byte(o[24:28])) != npNode || binary.BigEndian.Uint16(o[22:]) != 30054 || ipChecksum(o) != 0 {
				t.Errorf("outer header % x: want IPIP to %s naming %s:30054", o, npOtherNode, npNode)
			}
			inner := out[14+dsrOuterLen : len(in)+dsrOuterLen]
			if inner[8] != 63 || ipChecksum(inner[:20]) != 0 || !bytes.Equal(inner[12:], in[14+12:]) {
				t.Errorf("inner\n% x\nwant the error as it came, TTL 63\n% x", inner, in[14:])
			}

			// The backend's node: a DSR flow to its pod, the pod's reply
			// from the service, then the router's error about it, sent on
			// by the ingress node.
			if ret, _ := fromOutside(dsrPacket(npOtherNode, npNode, npLB, 53, packet(npClient, npLocalPod, 17, udpDatagram(40072, 5353)))); ret != tcActRedirect {
				t.Fatalf("the client's datagram by DSR: verdict %d, want redirect into the pod", ret)
			}
			ret, reply = fromPod(packet(npLocalPod, npClient, 17, udpDatagram(5353, 40072)))
			if got := checkedTuple(t, reply); ret != tcActRedirect || got != (tuple{npLB, npClient, 53, 40072}) {
				t.Fatalf("the pod's reply: verdict %d, %+v", ret, got)
			}
			message := icmpFragNeeded(reply, 1300)
			ret, out = fromOutside(dsrPacket(npOtherNode, npNode, npLB, 53, packet(router, npLB, 1, message)))
			if ret != tcActRedirect {
				t.Fatalf("the error at the backend's node: verdict %d, want redirect into the pod", ret)
			}
			checkTranslatedError(t, "a router's fragmentation needed", out[:14+20+len(message)], message,
				[]any{router, npLocalPod, npLocalPod, uint16(5353), npClient, uint16(40072)})

			// About no flow of this node: dropped.
			stray := withChecksum(packet(npLB, npClient, 17, udpDatagram(53, 40999)))
			if ret, _ := fromOutside(dsrPacket(npOtherNode, npNode, npLB, 53, packet(router, npLB, 1, icmpFragNeeded(stray, 1300)))); ret != tcActShot {
				t.Errorf("an error about no flow of this node: verdict %d, want drop", ret)
			}
			counterDelta(t, d, before, map[string]uint64{"dsr-encap/from-uplink": 2, "dsr-decap/from-uplink": 2})
		})
	}
}

// TestNodePortDSRUnknownNode: DSR's IPIP is taken only from a node of the
// cluster (shunt_dsr_nodes). With native routing and with the overlay:
// the other node's packet is decapsulated and delivered as before; the
// same packet from a host of the underlay that is no node is dropped as
// dsr-unknown-node, counted, its flow naming the stranger's IPIP to this
// node, and nothing of it reaches the pod or shunt_nodeport_nat. A node
// that leaves the cluster is a stranger from then on; the map is in `map
// dump`, and the drift check finds and repairs an entry removed or added
// behind the agent's back.
func TestNodePortDSRUnknownNode(t *testing.T) {
	stranger := netip.MustParseAddr("192.0.2.77")
	for _, c := range []struct {
		routing string
		tunnel  bool
	}{{"native", false}, {"overlay", true}} {
		t.Run(c.routing, func(t *testing.T) {
			d, _, fromOutside, _ := dsrNodeRouted(t, dpinfo.NodePortDSR, nil, c.tunnel)
			flows := flowReader(t, d)
			before := counts(t, d)
			syn := func(cport uint16) []byte {
				return packet(npClient, npLocalPod, 6, tcpSegment(cport, 8080, tcpSYN))
			}
			in := dsrPacket(npOtherNode, npNode, npLB, 80, syn(40081))
			if ret, out := fromOutside(in); ret != tcActRedirect || len(out) != len(in)-dsrOuterLen {
				t.Fatalf("from node %s: verdict %d, %d bytes; want redirect into the pod, %d bytes", npOtherNode, ret, len(out), len(in)-dsrOuterLen)
			}
			replies, _ := nodePortEntries(t, d)
			if ret, _ := fromOutside(dsrPacket(stranger, npNode, npLB, 80, syn(40082))); ret != tcActShot {
				t.Errorf("from %s, no node: verdict %d, want drop", stranger, ret)
			}
			if r, _ := nodePortEntries(t, d); r != replies {
				t.Errorf("the stranger's packet was recorded: %d reply entries, had %d", r, replies)
			}
			var saw bool
			for _, f := range flows() {
				if f.Reason == "dsr-unknown-node" {
					saw = true
					if f.Verdict != "DROPPED" || f.Src != stranger || f.Dst != npNode || f.Proto != 4 || f.Point != "from-uplink" {
						t.Errorf("flow %+v: want DROPPED, IPIP from %s to %s at from-uplink", f, stranger, npNode)
					}
				}
			}
			if !saw {
				t.Error("no flow names dsr-unknown-node")
			}

			rows, err := d.DumpMap("shunt_dsr_nodes", false)
			if err != nil || len(rows) != 1 || rows[0]["node"] != npOtherNode.String() {
				t.Errorf("map dump shunt_dsr_nodes: %v, %v; want one row, node %s", rows, err, npOtherNode)
			}

			// Drift: an entry deleted and one added behind the agent's
			// back are found and repaired.
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(d.uplink.ShuntDsrNodes.Delete(uplinktcDsrNodeKey{Addr: be32(npOtherNode)}))
			must(d.uplink.ShuntDsrNodes.Put(uplinktcDsrNodeKey{Addr: be32(stranger)}, uplinktcDsrNodeValue{}))
			r, err := d.VerifyMaps(true)
			must(err)
			var found []string
			for _, e := range r.Entries {
				if e.Map == "shunt_dsr_nodes" {
					found = append(found, e.Key+" | "+e.Expected+" | "+e.Found)
				}
			}
			if want := []string{npOtherNode.String() + " | node | ", stranger.String() + " |  | node"}; !slices.Equal(found, want) ||
				r.Checked["shunt_dsr_nodes"] != 1 || r.Repaired["shunt_dsr_nodes"] != 2 {
				t.Errorf("drift of shunt_dsr_nodes: %q, checked %d, repaired %d; want %q, 1, 2", found, r.Checked["shunt_dsr_nodes"],
					r.Repaired["shunt_dsr_nodes"], want)
			}
			if ret, _ := fromOutside(dsrPacket(stranger, npNode, npLB, 80, syn(40083))); ret != tcActShot {
				t.Errorf("after the repair, from %s: verdict %d, want drop", stranger, ret)
			}
			if ret, _ := fromOutside(dsrPacket(npOtherNode, npNode, npLB, 80, syn(40084))); ret != tcActRedirect {
				t.Errorf("after the repair, from node %s: verdict %d, want redirect", npOtherNode, ret)
			}

			// The other node leaves the cluster.
			must(d.SyncDSRNodes(nil))
			if ret, _ := fromOutside(dsrPacket(npOtherNode, npNode, npLB, 80, syn(40085))); ret != tcActShot {
				t.Errorf("from %s once it is no node: verdict %d, want drop", npOtherNode, ret)
			}
			counterDelta(t, d, before, map[string]uint64{"dsr-decap/from-uplink": 2, "dsr-unknown-node/from-uplink": 3})
		})
	}
}

// TestNodePortDSRPathError: a router between the nodes that cannot carry
// one of the ingress node's DSR packets answers it with fragmentation
// needed to the ingress node's underlay address, quoting the IPIP packet
// (outer header with the option, then the client's packet as translated,
// as a Linux router quotes: the whole packet up to 576 bytes). The
// ingress node turns it into the error the client needs: from the
// service address the client dialled to the client, the MTU less the 28
// bytes of DSR's outer header, quoting the client's packet as it sent it
// (to the service address and port, its own TTL), every checksum right,
// routed to the client, counted and seen (every packet's flows) as
// frag-needed. An error that
// names no MTU, quotes too little to find the flow, or is about no flow
// this node sends by DSR goes on as before (the node's stack). With
// native routing and with the overlay.
func TestNodePortDSRPathError(t *testing.T) {
	router := netip.MustParseAddr("192.0.2.254")
	for _, tunnel := range []bool{false, true} {
		t.Run(map[bool]string{false: "native", true: "overlay"}[tunnel], func(t *testing.T) {
			d, _, fromOutside, _ := dsrNodeRouted(t, dpinfo.NodePortDSR, nil, tunnel)
			// A load balancer address with its backend on the other
			// node: the error's source is the service, not this node.
			remoteLB := services.Port{Frontend: services.Frontend{VIP: npLB, Port: 81, Proto: 6}, Kind: services.KindLoadBalancer,
				Name: "lb-remote", Backends: []services.Backend{{IP: npRemotePod, Port: 8080}}}
			if _, err := d.SyncServices(append(dsrTestPorts(), remoteLB)); err != nil {
				t.Fatal(err)
			}
			flows := flowReader(t, d)
			// A translated error is a packet of its flow, seen when
			// every packet is.
			if err := d.SetFlowMode(FlowModeAll); err != nil {
				t.Fatal(err)
			}
			before := counts(t, d)

			syn := withChecksum(packet(npClient, npLB, 6, tcpSegment(40091, 81, tcpSYN)))
			ret, ipip := fromOutside(bytes.Clone(syn))
			if ret != tcActRedirect || ipip[14+9] != 4 {
				t.Fatalf("the client's SYN: verdict %d, want IPIP to the other node", ret)
			}
			ipip = ipip[:len(syn)+dsrOuterLen]
			errorAbout := func(quote []byte, mtu uint16) []byte {
				return withChecksum(packet(router, npNode, 1, append([]byte{3, 4, 0, 0, 0, 0, byte(mtu >> 8), byte(mtu)}, quote...)))
			}

			ret, out := fromOutside(errorAbout(ipip[14:], 1400))
			const want = 14 + 20 + 8 + 20 + 8
			if ret != tcActRedirect || len(out) < want {
				t.Fatalf("the router's error: verdict %d, %d bytes; want redirect, %d bytes", ret, len(out), want)
			}
			out = out[:want]
			ip, icmp, quote := out[14:34], out[34:], out[42:62]
			if ipChecksum(ip) != 0 || ipChecksum(icmp) != 0 || ipChecksum(quote) != 0 {
				t.Errorf("a checksum is wrong: IPv4 %#x, ICMP %#x, quoted IPv4 %#x (want 0 each)", ipChecksum(ip), ipChecksum(icmp), ipChecksum(quote))
			}
			from, to := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
			if from != npLB || to != npClient || ip[9] != 1 || binary.BigEndian.Uint16(ip[2:]) != want-14 {
				t.Errorf("the error's header % x: want ICMP from %s to %s, %d bytes", ip, npLB, npClient, want-14)
			}
			if icmp[0] != 3 || icmp[1] != 4 || binary.BigEndian.Uint16(icmp[6:]) != 1400-dsrOuterLen {
				t.Errorf("ICMP % x: want fragmentation needed, MTU %d", icmp[:8], 1400-dsrOuterLen)
			}
			if !bytes.Equal(quote, syn[14:34]) || !bytes.Equal(out[62:70], syn[34:42]) {
				t.Errorf("the quote\n% x\nwant the client's SYN as it sent it\n% x", out[42:70], syn[14:42])
			}
			if dst := net.HardwareAddr(out[0:6]).String(); dst != "02:00:00:00:00:09" {
				t.Errorf("the error to MAC %s, want the client's on the uplink", dst)
			}
			var saw bool
			evs := flows()
			for _, f := range evs {
				saw = saw || (f.Reason == "frag-needed" && f.Src == npLB && f.Dst == npClient && f.Proto == 1)
			}
			if !saw {
				t.Errorf("no flow names frag-needed from the service to the client: %+v", evs)
			}

			// Left as they were (the node's stack gets them).
			otherFlow := bytes.Clone(ipip[14:])
			binary.BigEndian.PutUint16(otherFlow[dsrOuterLen+20:], 40092) // another client port: no flow
			for _, c := range []struct {
				what string
				in   []byte
			}{
				{"no MTU named (RFC 792)", errorAbout(ipip[14:], 0)},
				{"only 8 bytes of the outer payload quoted", errorAbout(ipip[14:14+dsrOuterLen+8], 1400)},
				{"about no flow of this node", errorAbout(otherFlow, 1400)},
			} {
				if ret, out := fromOutside(bytes.Clone(c.in)); ret != tcActOK || !bytes.Equal(out[:len(c.in)], c.in) {
					t.Errorf("%s: verdict %d, want %d and the packet unchanged", c.what, ret, tcActOK)
				}
			}
			counterDelta(t, d, before, map[string]uint64{"dsr-encap/from-uplink": 1, "frag-needed/from-uplink": 1})
		})
	}
}
