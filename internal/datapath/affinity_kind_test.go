package datapath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// TestAffinityClientKinds: the uplink keys ClientIP affinity by the
// client's address, the socket layer by the client's network namespace
// cookie, each with a kind of its own: a fresh socket-layer entry whose
// cookie equals the outside client's address (as a number) for the same
// frontend, pointing at a backend of another Service, is not the
// client's; the client's flow gets its own frontend's backend and an
// entry of the address kind.
func TestAffinityClientKinds(t *testing.T) {
	d, ns, uplink := nodePortTestNode(t, 0)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	foreign := netip.MustParseAddr("10.99.0.77")
	if err := d.SyncPolicy(policy.State{IPCache: []policy.PrefixIdentity{{Prefix: netip.PrefixFrom(npLocalPod, 32), Identity: 300}}},
		[]Endpoint{{IP: npLocalPod, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300}}); err != nil {
		t.Fatal(err)
	}
	nodePort := services.Port{Frontend: services.Frontend{VIP: npNode, Port: 30100, Proto: 6}, Kind: services.KindNodePort,
		Name: "default/sticky:http", AffinityTimeout: 600, Backends: []services.Backend{{IP: npLocalPod, Port: 8080}}}
	other := services.Port{Frontend: services.Frontend{VIP: netip.MustParseAddr("10.96.0.77"), Port: 80, Proto: 6},
		Name: "default/other:http", Backends: []services.Backend{{IP: foreign, Port: 9999}}}
	if _, err := d.SyncServices([]services.Port{nodePort, other}); err != nil {
		t.Fatal(err)
	}
	serviceID := d.services.ports[nodePort.Frontend].id
	foreignID := d.services.backends[backendKey{foreign, 9999, 6}]
	collide := sockaddrAffinityKey{ClientCookie: uint64(be32(npClient)), ServiceId: serviceID,
		ClientKind: uint32(sockaddrAffinityClientKindAFFINITY_CLIENT_NETNS)}
	if err := d.sockAddr.ShuntAffinity.Put(collide, sockaddrAffinityValue{LastUsedNs: uint64(monotonicNow()), BackendId: foreignID}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		ret, out := runFromUplink(t, d, ns, uplink, withChecksum(packet(npClient, npNode, 6, tcpSegment(uint16(41000+i), 30100, tcpSYN))))
		if got := checkedTuple(t, out); ret != tcActRedirect || got.dst != npLocalPod || got.dport != 8080 {
			t.Errorf("flow %d: verdict %d, %+v; want the NodePort's backend %s:8080, not the netns entry's %s", i, ret, got, npLocalPod, foreign)
		}
	}
	own := collide
	own.ClientKind = uint32(sockaddrAffinityClientKindAFFINITY_CLIENT_ADDR)
	var v sockaddrAffinityValue
	if err := d.sockAddr.ShuntAffinity.Lookup(own, &v); err != nil || v.BackendId != d.services.backends[backendKey{npLocalPod, 8080, 6}] {
		t.Errorf("the client's address-kind entry: %+v, %v; want its backend", v, err)
	}
	if err := d.sockAddr.ShuntAffinity.Lookup(collide, &v); err != nil || v.BackendId != foreignID {
		t.Errorf("the netns-kind entry changed: %+v, %v", v, err)
	}
}
