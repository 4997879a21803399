package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
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
	d, ns, uplink := nodePortTestNodeWith(t, 0, mode, fallbacks)
	syncNodePortPods(t, d)
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

func TestNodePortHybrid(t *testing.T) {
	d, fromOutside, _ := dsrNode(t, dpinfo.NodePortHybrid)
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
	tcp := append(tcpSegment(sport, dport, flags), 1, 1, 1, 1, 2, 4, byte(mss>>8), byte(mss))
	tcp[12] = 7 << 4
	return tcp
}

// mssOf reads the MSS option of a packet tcpWithMSS built, checking the
// TCP checksum.
func mssOf(t *testing.T, pkt []byte) uint16 {
	t.Helper()
	checkedTuple(t, pkt[:14+20+28])
	return binary.BigEndian.Uint16(pkt[14+20+20+6:])
}

// TestNodePortDSRClampMSS: the backend's SYN-ACK to a flow that arrived
// by DSR announces an MSS that leaves room for DSR's 28 bytes on the
// uplink (MTU 1500: 1432), so that the client's segments fit once the
// ingress node encapsulates them; a smaller MSS stays, and so does the
// MSS of a flow that came straight to this node (no DSR).
func TestNodePortDSRClampMSS(t *testing.T) {
	_, fromOutside, fromPod := dsrNode(t, dpinfo.NodePortDSR)
	for _, c := range []struct {
		what       string
		viaDSR     bool
		cport, mss uint16
		want       uint16
	}{
		{"by DSR, MSS 1460", true, 40021, 1460, 1432},
		{"by DSR, MSS 1200", true, 40022, 1200, 1200},
		{"straight to this node, MSS 1460", false, 40023, 1460, 1460},
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
		in := packet(npLocalPod, npClient, 6, tcpWithMSS(8080, c.cport, tcpSYNACK, c.mss))
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
