package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/services"
	"github.com/shuntnet/shunt/internal/steerroute"
)

// On a node of the overlay, the VXLAN packets that arrive at the node's
// tunnel endpoint are the VXLAN device's: the uplink program passes them
// to the stack at its first look (overlay_arrival), even where a NodePort
// claims the tunnel's own UDP port, which before took them (and broke
// the overlay). Everything else at the uplink is still tried as before:
// the same port at another address, another port at the node's address,
// TCP to the tunnel's port, an IPv4 header with options.
func TestOverlayArrivalPassesTheUplink(t *testing.T) {
	d, ns, uplink := nodePortTestNodeRouted(t, 0, dpinfo.NodePortSNAT, nil, true)
	syncNodePortPods(t, d)
	backends := []services.Backend{{IP: npLocalPod, Port: 5353}}
	udp := func(vip netip.Addr, port uint16) services.Frontend {
		return services.Frontend{VIP: vip, Port: port, Proto: 17}
	}
	if _, err := d.SyncServices([]services.Port{
		{Frontend: udp(npNode, ovPort), Kind: services.KindNodePort, Name: "on-the-tunnel-port", Backends: backends},
		{Frontend: udp(npNode, 30053), Kind: services.KindNodePort, Name: "dns", Backends: backends},
		{Frontend: udp(npLB, ovPort), Kind: services.KindLoadBalancer, Name: "lb-on-the-tunnel-port", Backends: backends},
		{Frontend: services.Frontend{VIP: npNode, Port: ovPort, Proto: 6}, Kind: services.KindNodePort, Name: "tcp-on-the-tunnel-port",
			Backends: []services.Backend{{IP: npLocalPod, Port: 8080}}},
	}); err != nil {
		t.Fatal(err)
	}
	fromUplink := func(pkt []byte) (uint32, []byte) { t.Helper(); return runFromUplink(t, d, ns, uplink, pkt) }
	otherNode := netip.MustParseAddr("192.0.2.3")

	vxlan := withChecksum(packet(otherNode, npNode, 17, udpDatagram(50123, ovPort)))
	ret, out := fromUplink(vxlan)
	if ret != tcActOK || !bytes.Equal(out, vxlan) {
		t.Errorf("VXLAN to the node's tunnel endpoint: verdict %d, changed %v; want it passed to the stack unchanged (the VXLAN device's)",
			ret, !bytes.Equal(out, vxlan))
	}

	translated := []struct {
		what string
		pkt  []byte
	}{
		{"UDP to the tunnel's port at a load balancer address", withChecksum(packet(npClient, npLB, 17, udpDatagram(50124, ovPort)))},
		{"UDP to another NodePort of the node", withChecksum(packet(npClient, npNode, 17, udpDatagram(50125, 30053)))},
		{"TCP to the tunnel's port", withChecksum(packet(npClient, npNode, 6, tcpSegment(50126, ovPort, tcpSYN)))},
		{"UDP to the tunnel's port with IPv4 options",
			withIPOptions(withChecksum(packet(npClient, npNode, 17, udpDatagram(50127, ovPort))))},
	}
	for _, c := range translated {
		ret, out := fromUplink(c.pkt)
		if dst := netip.AddrFrom4([4]byte(out[14+16 : 14+20])); ret != tcActRedirect || dst != npLocalPod {
			t.Errorf("%s: verdict %d, to %s; want it translated to the backend %s and redirected, as before", c.what, ret, dst, npLocalPod)
		}
	}
}

// sideConfig reinterprets the pod object's generated struct shunt_config
// as the overlay object's: both must be the one C struct, field for field
// at the same offsets (the uplink object's type is the overlay's
// converted, so it is checked too).
func TestSideConfigIsTheSameStruct(t *testing.T) {
	pod, side := reflect.TypeOf(podtcShuntConfig{}), reflect.TypeOf(overlaytcShuntConfig{})
	if pod.Size() != side.Size() || pod.NumField() != side.NumField() {
		t.Fatalf("%s is %d bytes in %d fields, %s %d in %d: regenerate (go generate ./internal/datapath)",
			pod, pod.Size(), pod.NumField(), side, side.Size(), side.NumField())
	}
	for i := range pod.NumField() {
		p, s := pod.Field(i), side.Field(i)
		if p.Name != s.Name || p.Offset != s.Offset || p.Type.Size() != s.Type.Size() {
			t.Errorf("field %d: %s at %d (%d bytes) in %s, %s at %d (%d bytes) in %s", i, p.Name, p.Offset, p.Type.Size(), pod,
				s.Name, s.Offset, s.Type.Size(), side)
		}
	}
	want := podtcShuntConfig{TunnelPort: 0x12b5, TunnelLocalIp4: 0x01020304, NodeportMode: 2, FwdMode: 1}
	if got := sideConfig(want); got.TunnelPort != want.TunnelPort || got.TunnelLocalIp4 != want.TunnelLocalIp4 ||
		got.NodeportMode != want.NodeportMode || got.FwdMode != uint32(want.FwdMode) {
		t.Errorf("sideConfig(%+v) = %+v", want, got)
	}
}

// Every part of the uplink program on at once, as a node of the lab runs
// it with --tunnel vxlan --masquerade and NodePorts (and so as the
// NodePort benchmark's shunt-vxlan nodes do): the masquerade, NodePort
// in each mode, DSR, the proxy's steering and the overlay's endpoint.
// Each part's own tests turn on only what they test, and the verifier
// judges only the code a configuration leaves alive, so this is where a
// program too big for its stack together is caught (the first version of
// overlay_arrival was: "combined stack size of 2 calls is 528").
//
// The overlay's program for VXLAN off the wire is in the uplink program's
// slot, unless Config.OverlayDecapInDevice leaves the VXLAN device alone.
func TestUplinkLoadsWithEveryPartOn(t *testing.T) {
	for _, mode := range []dpinfo.NodePortMode{dpinfo.NodePortSNAT, dpinfo.NodePortDSR, dpinfo.NodePortHybrid} {
		for _, fallbacks := range []dpinfo.Fallbacks{nil, {dpinfo.FallbackNoGSODecap: true}} {
			for _, inDevice := range []bool{false, true} {
				t.Run(string(mode)+fmt.Sprintf("/fallbacks=%v/decap-in-device=%v", fallbacks.List(), inDevice), func(t *testing.T) {
					d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, TunnelIfindex: 1, NodeIP: npSNAT,
						TunnelEndpoint: netip.AddrPortFrom(npNode, ovPort), TunnelUnderlayIfindex: 1,
						ProxyMark:  ProxyMark{Magic: 0x5e000000, Mask: 0xff000000},
						ProxySteer: &ProxySteer{Listen: netip.AddrPortFrom(npSNAT, 15006), Routing: steerroute.Routing{Mark: 0x5f000000, Table: 0x5f, Priority: 95}},
						Masquerade: &Masquerade{Addr: npNode, Ports: dpinfo.DefaultMasqPorts},
						NodePort:   &NodePort{UplinkIfindex: 1, SNATAddr: npSNAT, Ports: npPorts, Mode: mode, DSRAddr: npNode},
						MaglevSize: 16381, Fallbacks: fallbacks, OverlayDecapInDevice: inDevice}, nil)
					var id uint32
					err := d.uplink.ShuntOverlayWire.Lookup(uint32(0), &id)
					if filled := err == nil; filled == inDevice {
						t.Errorf("the uplink's slot for the overlay's wire program filled %v (%v), want %v", filled, err, !inDevice)
					}
				})
			}
		}
	}
}

// vxlanFrame is the overlay's frame from node outer to the node at npNode
// as a Linux VXLAN device sends it (no UDP checksum), its VNI vni,
// carrying inner (an Ethernet frame).
func vxlanFrame(outer netip.Addr, vni uint32, inner []byte) []byte {
	vx := make([]byte, 8)
	vx[0] = 0x08
	binary.BigEndian.PutUint32(vx[4:], vni<<8)
	l4 := append(udpDatagramLen(50123, ovPort, len(vx)+len(inner)), append(vx, inner...)...)
	return packet(outer, npNode, 17, l4)
}

// runFromUplinkOut is runFromUplink for a packet that may change length:
// the packet as the program left it, whatever its length.
func runFromUplinkOut(t *testing.T, d *Datapath, ns string, uplink int, pkt []byte) (uint32, []byte) {
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
	return ret, opts.DataOut
}

// The uplink hands the overlay's VXLAN packets to the overlay program
// (shunt_overlay_wire), which takes a plain one off the wire: the outer
// headers go, the inner packet is judged as from the overlay (the VNI
// the sender's identity, the outer source its node) and handed to the
// pod, its MACs the pod's. Anything else is left whole for the VXLAN
// device; a forged one is dropped as tunnel-spoofed, as the device's
// path drops it.
func TestOverlayWire(t *testing.T) {
	d, ns, uplink := nodePortTestNodeRouted(t, 0, dpinfo.NodePortSNAT, nil, true)
	syncNodePortPods(t, d) // npRemotePod (identity 301) behind npOtherNode, npLocalPod (300) here
	fromUplink := func(pkt []byte) (uint32, []byte) { t.Helper(); return runFromUplinkOut(t, d, ns, uplink, pkt) }
	syn := func(dst netip.Addr, port uint16) []byte {
		return withChecksum(packet(npRemotePod, dst, 6, tcpSegment(40000, port, tcpSYN)))
	}

	inner := syn(npLocalPod, 8080)
	// With and without a UDP checksum (Linux sends one by default; it is
	// not checked here).
	for i, pkt := range [][]byte{vxlanFrame(npOtherNode, 301, inner), withChecksum(vxlanFrame(npOtherNode, 301, inner))} {
		before := counts(t, d)
		ret, out := fromUplink(pkt)
		if ret != tcActRedirect || len(out) != len(inner) {
			t.Fatalf("packet %d, a plain VXLAN packet for the local pod: verdict %d, %d bytes out; want redirected to the pod, %d bytes (decapsulated)",
				i, ret, len(out), len(inner))
		}
		if tp := checkedTuple(t, out); tp.src != npRemotePod || tp.dst != npLocalPod || tp.dport != 8080 || out[14+8] != 63 {
			t.Errorf("packet %d decapsulated: %+v, TTL %d; want %s -> %s:8080, TTL 63 (one hop)", i, tp, out[14+8], npRemotePod, npLocalPod)
		}
		if want := []byte{2, 0, 0, 0, 0, 0x0b}; !bytes.Equal(out[0:6], want) {
			t.Errorf("packet %d: destination MAC %x, want the pod's %x", i, out[0:6], want)
		}
		counterDelta(t, d, before, map[string]uint64{"forwarded/from-overlay": 1}, "forwarded/from-overlay")
	}

	flagsWith := func(pkt []byte, off int, b byte) []byte { pkt = bytes.Clone(pkt); pkt[off] = b; return pkt }
	const udpOff, vxOff, innerIPOff = 14 + 20, 14 + 20 + 8, 14 + 20 + 8 + 8 + 14
	plain := vxlanFrame(npOtherNode, 301, inner)
	left := []struct {
		what string
		pkt  []byte
	}{
		{"a wrong outer header checksum", flagsWith(plain, 14+10, plain[14+10]^0xff)},
		{"VXLAN-GBP flags", flagsWith(plain, vxOff, 0x88)},
		{"ECN congestion on the outer header", flagsWith(plain, 14+1, 0x03)},
		{"for no pod of the node", vxlanFrame(npOtherNode, 301, syn(npSNAT, 8080))},
		{"inner TTL 1", vxlanFrame(npOtherNode, 301, flagsWith(inner, 14+8, 1))},
		{"an inner fragment", vxlanFrame(npOtherNode, 301, flagsWith(inner, 14+6, 0x20))},
	}
	for _, c := range left {
		ret, out := fromUplink(c.pkt)
		if ret != tcActOK || !bytes.Equal(out, c.pkt) {
			t.Errorf("%s: verdict %d, %d bytes (changed %v); want passed whole to the VXLAN device", c.what, ret, len(out), !bytes.Equal(out, c.pkt))
		}
	}

	// A port the node proxy takes: the steered packet must reach the
	// node's stack through the VXLAN device.
	if err := d.SyncL7Redirects([]L7Redirect{{Dest: netip.AddrPortFrom(npLocalPod, 8080), Proxy: netip.AddrPortFrom(npSNAT, 15001)}}); err != nil {
		t.Fatal(err)
	}
	if ret, out := fromUplink(plain); ret != tcActOK || !bytes.Equal(out, plain) {
		t.Errorf("to a port the node proxy takes: verdict %d, changed %v; want passed whole to the VXLAN device", ret, !bytes.Equal(out, plain))
	}
	if err := d.SyncL7Redirects(nil); err != nil {
		t.Fatal(err)
	}

	// A NodePort flow this node SNATed to a backend on the other node:
	// the backend's reply comes back through the overlay, is taken off
	// the wire and sent back to the client as from the NodePort.
	if _, err := d.SyncServices([]services.Port{{Frontend: services.Frontend{VIP: npNode, Port: 30081, Proto: 6},
		Kind: services.KindNodePort, Name: "remote", Backends: []services.Backend{{IP: npRemotePod, Port: 8080}}}}); err != nil {
		t.Fatal(err)
	}
	_, out := fromUplink(withChecksum(packet(npClient, npNode, 6, tcpSegment(40001, 30081, tcpSYN))))
	snat := checkedTuple(t, out)
	if snat.src != npSNAT || snat.dst != npRemotePod {
		t.Fatalf("the client's SYN to the NodePort left as %+v; want SNATed from %s to %s", snat, npSNAT, npRemotePod)
	}
	reply := withChecksum(packet(npRemotePod, npSNAT, 6, tcpSegment(8080, snat.sport, tcpSYNACK)))
	before := counts(t, d)
	ret, out := fromUplink(vxlanFrame(npOtherNode, 301, reply))
	if ret != tcActRedirect || len(out) != len(reply) {
		t.Fatalf("the backend's reply through the overlay: verdict %d, %d bytes; want redirected out, %d bytes (decapsulated)", ret, len(out), len(reply))
	}
	if got, want := checkedTuple(t, out), (tuple{npNode, npClient, 30081, 40001}); got != want {
		t.Errorf("the backend's reply left as %+v, want %+v", got, want)
	}
	counterDelta(t, d, before, map[string]uint64{"nodeport-reply/from-overlay": 1}, "nodeport-reply/from-overlay")
	// Not a reply this node SNATed: left to the VXLAN device.
	stray := vxlanFrame(npOtherNode, 301, withChecksum(packet(npRemotePod, npSNAT, 6, tcpSegment(8080, snat.sport+7, tcpSYNACK))))
	if ret, out := fromUplink(stray); ret != tcActOK || !bytes.Equal(out, stray) {
		t.Errorf("to the node's SNAT address with no reply entry: verdict %d, changed %v; want passed whole", ret, !bytes.Equal(out, stray))
	}

	// Forged: the inner source's node is not the outer source.
	before = counts(t, d)
	if ret, _ := fromUplink(vxlanFrame(netip.MustParseAddr("192.0.2.99"), 301, syn(npLocalPod, 8081))); ret != tcActShot {
		t.Errorf("from a node that does not host the inner source: verdict %d, want dropped", ret)
	}
	counterDelta(t, d, before, map[string]uint64{"tunnel-spoofed/from-overlay": 1}, "tunnel-spoofed/from-overlay")
}
