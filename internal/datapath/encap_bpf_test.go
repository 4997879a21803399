package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/policy"
)

// encapTestNode makes fragNeededTunnel's namespace a node whose underlay
// (ul0, 10.77.0.1/24, forwarding as the agent sets it) knows one other
// node's MAC (10.77.0.2), not another's (10.77.0.3), and has no route to
// a third (172.31.0.2). Returns ul0's ifindex and MAC.
func encapTestNode(t *testing.T, ns string) (ifindex int, mac net.HardwareAddr) {
	t.Helper()
	err := netnsrun.Do(ns, func() error {
		for _, name := range []string{"ul1", "ul0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			ifindex, mac = l.Attrs().Index, l.Attrs().HardwareAddr
		}
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: ifindex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.ParseIP("10.77.0.2"), HardwareAddr: encapNextHopMAC}); err != nil {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv4/conf/ul0/forwarding", []byte("1"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return ifindex, mac
}

var encapNextHopMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x22}

// TestFromPodEncapInBPF runs shunt_from_pod on packets for pods of other
// nodes with the encapsulation in BPF (Config.TunnelUnderlayIfindex): the
// packet leaves with the VXLAN device's headers built by the program, to
// the next hop's MAC from the underlay's, every field checked (the outer
// IPv4 header and its checksum, no DF, TTL 64, the inner ECN bits, a
// UDP source port from the flow's hash in Linux's range, the port, a zero
// UDP checksum, the VNI carrying the sender's identity, the inner frame
// after one hop). A next hop whose MAC is not known yet is still
// encapsulated (bpf_redirect_neigh resolves it). What BPF does not build
// goes to the device untouched: a packet bigger than the tunnel's MTU
// (the device fragments the outer header), without DF or an ICMP error
// with DF (not answered with fragmentation needed, so the program's own
// check must still see it does not fit), a node not reached through the
// underlay interface.
func TestFromPodEncapInBPF(t *testing.T) {
	requireBPF(t)
	ns, vx := fragNeededTunnel(t)
	underlay, underlayMAC := encapTestNode(t, ns)
	a := netip.MustParseAddr("10.99.0.10")
	remote := map[string]netip.Addr{ // a pod on each other node
		"10.77.0.2": netip.MustParseAddr("10.98.0.20"), "10.77.0.3": netip.MustParseAddr("10.98.1.20"),
		"172.31.0.2": netip.MustParseAddr("10.98.2.20"),
	}
	state := policy.State{IPCache: []policy.PrefixIdentity{{Prefix: netip.PrefixFrom(a, 32), Identity: 300}}}
	for node, pod := range remote {
		state.IPCache = append(state.IPCache, policy.PrefixIdentity{Prefix: netip.PrefixFrom(pod, 32), Identity: 400,
			Tunnel: netip.MustParseAddr(node)})
	}
	mac := []byte{0xaa, 0, 0, 0, 0, 2} // the source MAC packet() writes
	endpoints := []Endpoint{{IP: a, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300}}
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, TunnelIfindex: vx, NodeIP: testNodeIP,
		TunnelEndpoint: netip.AddrPortFrom(netip.MustParseAddr("10.77.0.1"), ovPort), TunnelUnderlayIfindex: underlay}, nil)
	if err := d.SyncPolicy(state, endpoints); err != nil {
		t.Fatal(err)
	}
	before := counts(t, d)

	run := func(name string, pkt []byte) []byte {
		t.Helper()
		ret, out, err := testRunIn(ns, d.objs.ShuntFromPod, pkt)
		if err != nil || ret != tcActRedirect {
			t.Fatalf("%s: verdict %d, %v; want %d (redirected)", name, ret, err, tcActRedirect)
		}
		return out
	}
	// checkEncap checks out as in encapsulated to node, and returns its
	// outer UDP source port.
	checkEncap := func(name string, in, out []byte, node string, macs bool) uint16 {
		t.Helper()
		if len(out) != len(in)+VXLANOverhead {
			t.Fatalf("%s: %d bytes out of %d, want %d more (encapsulated)", name, len(out), len(in), VXLANOverhead)
		}
		if macs && (!bytes.Equal(out[0:6], encapNextHopMAC) || !bytes.Equal(out[6:12], underlayMAC)) {
			t.Errorf("%s: outer MACs % x -> % x, want the underlay's %s -> the next hop's %s", name, out[6:12], out[0:6], underlayMAC, encapNextHopMAC)
		}
		if binary.BigEndian.Uint16(out[12:]) != 0x0800 {
			t.Errorf("%s: outer EtherType %#04x, want IPv4", name, binary.BigEndian.Uint16(out[12:]))
		}
		ip := out[14:34]
		src, _ := netip.AddrFromSlice(ip[12:16])
		dst, _ := netip.AddrFromSlice(ip[16:20])
		wantTOS := in[15] & 3
		if wantTOS == 3 {
			wantTOS = 2 // CE leaves as ECT(0) (RFC 6040)
		}
		if ip[0] != 0x45 || ip[1] != wantTOS || int(binary.BigEndian.Uint16(ip[2:])) != len(out)-14 || binary.BigEndian.Uint16(ip[6:]) != 0 ||
			ip[8] != 64 || ip[9] != 17 || ipChecksum(ip) != 0 || src.String() != "10.77.0.1" || dst.String() != node {
			t.Errorf("%s: outer IPv4 header % x: want 0x45, TOS %d, length %d, no DF, TTL 64, UDP, 10.77.0.1 -> %s, a valid checksum",
				name, ip, wantTOS, len(out)-14, node)
		}
		udp := out[34:42]
		sport := binary.BigEndian.Uint16(udp[0:])
		if sport < 32768 || sport >= 61000 || binary.BigEndian.Uint16(udp[2:]) != ovPort ||
			int(binary.BigEndian.Uint16(udp[4:])) != len(out)-34 || binary.BigEndian.Uint16(udp[6:]) != 0 {
			t.Errorf("%s: outer UDP header % x: want a source port in [32768, 61000), port %d, length %d, checksum 0", name, udp, ovPort, len(out)-34)
		}
		if vxlan := out[42:50]; binary.BigEndian.Uint32(vxlan[0:]) != 0x08000000 || binary.BigEndian.Uint32(vxlan[4:]) != 300<<8 {
			t.Errorf("%s: VXLAN header % x: want the I flag and VNI 300 (the sender's identity)", name, vxlan)
		}
		inner := out[VXLANOverhead:]
		if !bytes.Equal(inner[:14], in[:14]) {
			t.Errorf("%s: inner Ethernet header % x, want the pod's % x", name, inner[:14], in[:14])
		}
		if inner[14+8] != in[14+8]-1 || ipChecksum(inner[14:34]) != 0 || !bytes.Equal(inner[34:], in[34:]) {
			t.Errorf("%s: inner packet TTL %d (sent with %d), checksum valid %v, payload unchanged %v: want one hop",
				name, inner[14+8], in[14+8], ipChecksum(inner[14:34]) == 0, bytes.Equal(inner[34:], in[34:]))
		}
		return sport
	}
	withTOS := func(pkt []byte, tos byte) []byte {
		pkt[15] = tos
		binary.BigEndian.PutUint16(pkt[14+10:], 0)
		binary.BigEndian.PutUint16(pkt[14+10:], ipChecksum(pkt[14:34]))
		return pkt
	}

	udp := packet(a, remote["10.77.0.2"], 17, udpDatagram(40000, 53))
	sport := checkEncap("UDP", udp, run("UDP", udp), "10.77.0.2", true)
	if again := checkEncap("UDP again", udp, run("UDP again", udp), "10.77.0.2", true); again != sport {
		t.Errorf("the same flow left from outer source port %d, then %d: want one port per flow", sport, again)
	}
	tcp := sizedPacket(a, remote["10.77.0.2"], 6, tcpSegment(40001, 8080, tcpACK), 1450, true)
	checkEncap("TCP, 1450 bytes, DF: fits the tunnel", tcp, run("TCP", tcp), "10.77.0.2", true)
	ce := withTOS(packet(a, remote["10.77.0.2"], 17, udpDatagram(40002, 53)), 0x03)
	checkEncap("ECN CE", ce, run("ECN CE", ce), "10.77.0.2", true)
	ect1 := withTOS(packet(a, remote["10.77.0.2"], 17, udpDatagram(40003, 53)), 0xb9)
	checkEncap("DSCP and ECT(1)", ect1, run("DSCP and ECT(1)", ect1), "10.77.0.2", true)
	noNeigh := packet(a, remote["10.77.0.3"], 17, udpDatagram(40004, 53))
	checkEncap("next hop's MAC unknown", noNeigh, run("next hop's MAC unknown", noNeigh), "10.77.0.3", false)

	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"UDP, 1500 bytes, no DF: the device fragments it", sizedPacket(a, remote["10.77.0.2"], 17, udpDatagram(40005, 53), 1500, false)},
		{"an ICMP error, 1500 bytes, DF: not answered, the device fragments it",
			sizedPacket(a, remote["10.77.0.2"], 1, icmpUnreachable(packet(remote["10.77.0.2"], a, 17, udpDatagram(53, 40007))), 1500, true)},
		{"a node not reached through the underlay interface", packet(a, remote["172.31.0.2"], 17, udpDatagram(40006, 53))},
	} {
		if out := run(c.name, c.pkt); len(out) != len(c.pkt) || out[14+8] != 63 {
			t.Errorf("%s: %d bytes out, TTL %d: want the packet as it came (%d bytes) after one hop, to the tunnel device",
				c.name, len(out), out[14+8], len(c.pkt))
		}
	}
	counterDelta(t, d, before, map[string]uint64{"to-tunnel/from-pod": 9})
}

// TestNodePortEncapInBPF: a flow from outside to a NodePort whose backend
// is on another node, SNATed, leaves the uplink program encapsulated in
// BPF, back out of the uplink: to the backend's node (its MAC), from this
// node's tunnel endpoint, the VNI the remote-node identity (the node's own
// traffic), the inner packet translated as the device path sends it.
func TestNodePortEncapInBPF(t *testing.T) {
	d, ns, uplink := nodePortTestNodeRouted(t, 0, dpinfo.NodePortSNAT, nil, true,
		func(c *Config) { c.TunnelUnderlayIfindex = c.NodePort.UplinkIfindex })
	syncNodePortPods(t, d)
	if _, err := d.SyncServices(dsrTestPorts()); err != nil {
		t.Fatal(err)
	}
	before := counts(t, d)
	in := withChecksum(packet(npClient, npNode, 17, udpDatagram(40001, 30054)))
	ret, out := runFromUplink(t, d, ns, uplink, in)
	if ret != tcActRedirect || len(out) != len(in)+VXLANOverhead {
		t.Fatalf("verdict %d, %d bytes out of %d; want redirected, %d bytes more (encapsulated)", ret, len(out), len(in), VXLANOverhead)
	}
	if !bytes.Equal(out[0:6], []byte{2, 0, 0, 0, 0, 2}) {
		t.Errorf("outer destination MAC % x, want the other node's 02:00:00:00:00:02", out[0:6])
	}
	ip := out[14:34]
	if src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])); src != npNode || dst != npOtherNode ||
		ip[9] != 17 || ipChecksum(ip) != 0 || binary.BigEndian.Uint16(out[36:]) != ovPort {
		t.Errorf("outer header % x: want UDP to port %d, %s -> %s, a valid checksum", out[14:42], ovPort, npNode, npOtherNode)
	}
	if vni := binary.BigEndian.Uint32(out[46:]) >> 8; vni != uint32(podtcShuntIdentitySHUNT_ID_REMOTE_NODE) {
		t.Errorf("VNI %d, want the remote-node identity %d", vni, podtcShuntIdentitySHUNT_ID_REMOTE_NODE)
	}
	if got := checkedTuple(t, out[VXLANOverhead:]); got.src != npSNAT || got.dst != npRemotePod {
		t.Errorf("inner packet %+v; want SNAT from %s to %s", got, npSNAT, npRemotePod)
	}
	counterDelta(t, d, before, map[string]uint64{"to-tunnel/from-uplink": 1})
}
