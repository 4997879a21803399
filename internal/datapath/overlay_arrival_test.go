package datapath

import (
	"bytes"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/services"
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
func TestUplinkLoadsWithEveryPartOn(t *testing.T) {
	for _, mode := range []dpinfo.NodePortMode{dpinfo.NodePortSNAT, dpinfo.NodePortDSR, dpinfo.NodePortHybrid} {
		for _, fallbacks := range []dpinfo.Fallbacks{nil, {dpinfo.FallbackNoGSODecap: true}} {
			t.Run(string(mode)+fmt.Sprintf("/fallbacks=%v", fallbacks.List()), func(t *testing.T) {
				openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, TunnelIfindex: 1, NodeIP: npSNAT,
					TunnelEndpoint: netip.AddrPortFrom(npNode, ovPort),
					ProxyMark:      ProxyMark{Magic: 0x5e000000, Mask: 0xff000000},
					ProxySteer:     &ProxySteer{Listen: netip.AddrPortFrom(npSNAT, 15006), Mark: 0x5f000000, Table: 0x5f, Priority: 95},
					Masquerade:     &Masquerade{Addr: npNode, Ports: dpinfo.DefaultMasqPorts},
					NodePort:       &NodePort{UplinkIfindex: 1, SNATAddr: npSNAT, Ports: npPorts, Mode: mode, DSRAddr: npNode},
					MaglevSize:     16381, Fallbacks: fallbacks}, nil)
			})
		}
	}
}
