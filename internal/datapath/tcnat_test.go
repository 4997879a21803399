package datapath

import (
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"

	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// tcpPacket builds Ethernet + IPv4 + a 20-byte TCP header (SYN) with valid
// checksums.
func tcpPacket(src netip.Addr, sport uint16, dst netip.Addr, dport uint16) []byte {
	var b bytes.Buffer
	b.Write([]byte{0xaa, 0, 0, 0, 0, 1, 0xaa, 0, 0, 0, 0, 2, 0x08, 0x00})
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 40)
	ip[8], ip[9] = 64, 6
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	tcp[12], tcp[13] = 5<<4, 0x02
	binary.BigEndian.PutUint16(tcp[16:], l4Checksum(ip, tcp))
	b.Write(ip)
	b.Write(tcp)
	return b.Bytes()
}

// l4Checksum computes the TCP/UDP checksum over the pseudo-header; over a
// segment that already holds its checksum the result is 0 when valid.
func l4Checksum(ip, seg []byte) uint16 {
	pseudo := append(append([]byte{}, ip[12:20]...), 0, ip[9], byte(len(seg)>>8), byte(len(seg)))
	return ipChecksum(append(pseudo, seg...))
}

type flow struct {
	src, dst     netip.Addr
	sport, dport uint16
}

func parseFlow(t *testing.T, pkt []byte) flow {
	t.Helper()
	ip, tcp := pkt[14:34], pkt[34:54]
	if ipChecksum(ip) != 0 {
		t.Error("IPv4 checksum invalid after translation")
	}
	if l4Checksum(ip, tcp) != 0 {
		t.Error("TCP checksum invalid after translation")
	}
	return flow{netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])),
		binary.BigEndian.Uint16(tcp[0:]), binary.BigEndian.Uint16(tcp[2:])}
}

// TestTCServiceFallback: a packet to a VIP that no socket hook translated
// is sent to a backend, the reply comes back from the VIP, and a service
// without backends drops.
func TestTCServiceFallback(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	client, backend := netip.MustParseAddr("10.99.0.10"), netip.MustParseAddr("10.99.0.11")
	vip, empty := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.96.0.11")
	if err := d.SyncPolicy(policy.State{}, []Endpoint{
		{IP: client, Ifindex: 1, PodMAC: mac, NodeMAC: mac},
		{IP: backend, Ifindex: 1, PodMAC: mac, NodeMAC: mac}, // test runs arrive on lo
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SyncServices([]services.Port{
		{Frontend: services.Frontend{VIP: vip, Port: 80, Proto: 6}, Name: "web", Backends: []services.Backend{{IP: backend, Port: 8080}}},
		{Frontend: services.Frontend{VIP: empty, Port: 80, Proto: 6}, Name: "empty"},
	}); err != nil {
		t.Fatal(err)
	}
	run := func(pkt []byte) (uint32, []byte) {
		t.Helper()
		ret, out, err := d.objs.ShuntFromPod.Test(pkt)
		if err != nil {
			t.Fatal(err)
		}
		return ret, out
	}

	for i := 0; i < 2; i++ { // the second packet of the flow uses the flow entry
		ret, out := run(tcpPacket(client, 40000, vip, 80))
		if ret != tcActRedirect {
			t.Fatalf("packet %d to the VIP: verdict %d, want redirect", i, ret)
		}
		if got, want := parseFlow(t, out), (flow{client, backend, 40000, 8080}); got != want {
			t.Errorf("packet %d to the VIP translated to %+v, want %+v", i, got, want)
		}
	}
	ret, out := run(tcpPacket(backend, 8080, client, 40000))
	if ret != tcActRedirect {
		t.Fatalf("reply: verdict %d, want redirect", ret)
	}
	if got, want := parseFlow(t, out), (flow{vip, client, 80, 40000}); got != want {
		t.Errorf("reply translated to %+v, want %+v", got, want)
	}
	// Traffic straight to the backend is left alone.
	_, out = run(tcpPacket(client, 40001, backend, 8080))
	if got, want := parseFlow(t, out), (flow{client, backend, 40001, 8080}); got != want {
		t.Errorf("direct traffic changed: %+v", got)
	}
	if ret, _ := run(tcpPacket(client, 40002, empty, 80)); ret != tcActShot {
		t.Errorf("service without backends: verdict %d, want drop", ret)
	}
}

func TestSyncServicesKeepsIDsAndRemovesStale(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	vip := netip.MustParseAddr("10.96.0.20")
	b1, b2 := services.Backend{IP: netip.MustParseAddr("10.99.0.1"), Port: 80}, services.Backend{IP: netip.MustParseAddr("10.99.0.2"), Port: 80}
	if _, err := d.SyncServices([]services.Port{{Frontend: services.Frontend{VIP: vip, Port: 80, Proto: 6}, Name: "a", Backends: []services.Backend{b1, b2}}}); err != nil {
		t.Fatal(err)
	}
	before, _ := d.DumpServices()
	if _, err := d.SyncServices([]services.Port{{Frontend: services.Frontend{VIP: vip, Port: 80, Proto: 6}, Name: "a", Backends: []services.Backend{b2}, AffinityTimeout: 5}}); err != nil {
		t.Fatal(err)
	}
	after, _ := d.DumpServices()
	if len(after) != 1 || after[0].ID != before[0].ID || len(after[0].Backends) != 1 ||
		after[0].Backends[0].IP != b2.IP || after[0].Backends[0].ID != before[0].Backends[1].ID || after[0].AffinityTimeout != 5 {
		t.Errorf("before %+v\nafter %+v: ids must be kept, backend b1 removed", before, after)
	}
	var n int
	var id uint32
	var v sockaddrBackendValue
	for it := d.sockAddr.ShuntBackends.Iterate(); it.Next(&id, &v); {
		n++
	}
	if n != 1 {
		t.Errorf("%d backends left, want 1", n)
	}
	if _, err := d.SyncServices(nil); err != nil {
		t.Fatal(err)
	}
	if all, _ := d.DumpServices(); len(all) != 0 {
		t.Errorf("services left after removing all: %+v", all)
	}
}

// TestSyncServicesRefusesWhatDoesNotFit: a table larger than the map is
// refused before anything is written, and the services already there stay.
func TestSyncServicesRefusesWhatDoesNotFit(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	keep := services.Port{Frontend: services.Frontend{VIP: netip.MustParseAddr("10.96.0.30"), Port: 80, Proto: 6}, Name: "keep",
		Backends: []services.Backend{{IP: netip.MustParseAddr("10.99.0.1"), Port: 80}}}
	if _, err := d.SyncServices([]services.Port{keep}); err != nil {
		t.Fatal(err)
	}
	max := int(d.sockAddr.ShuntServices.MaxEntries())
	backends := make([]services.Backend, 0xffff)
	for i := range backends {
		backends[i] = services.Backend{IP: netip.AddrFrom4([4]byte{10, 98, byte(i >> 8), byte(i)}), Port: 80}
	}
	var huge []services.Port
	for i := 0; i*0x10000 <= max; i++ {
		huge = append(huge, services.Port{Frontend: services.Frontend{VIP: netip.AddrFrom4([4]byte{10, 97, 0, byte(i)}), Port: 80, Proto: 6}, Name: "big", Backends: backends})
	}
	_, err := d.SyncServices(append(huge, keep))
	if err == nil || !strings.Contains(err.Error(), "shunt_services is full") {
		t.Fatalf("oversized table: err %v, want a message naming the map and its size", err)
	}
	dump, _ := d.DumpServices()
	if len(dump) != 1 || dump[0].VIP != keep.VIP || len(dump[0].Backends) != 1 {
		t.Errorf("after the refused sync the map holds %+v, want only the kept service", dump)
	}
}

// TestUpdateServicesTouchesOnlyWhatChanged: a partial update rewrites one
// port, removes another, keeps ids, and collects the backends nobody uses.
func TestUpdateServicesTouchesOnlyWhatChanged(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	ip := netip.MustParseAddr
	a := services.Port{Frontend: services.Frontend{VIP: ip("10.96.0.1"), Port: 80, Proto: 6}, Name: "a", Backends: []services.Backend{{IP: ip("10.99.0.1"), Port: 8080}}}
	b := services.Port{Frontend: services.Frontend{VIP: ip("10.96.0.2"), Port: 80, Proto: 6}, Name: "b", Backends: []services.Backend{{IP: ip("10.99.0.2"), Port: 8080}}}
	if _, err := d.SyncServices([]services.Port{a, b}); err != nil {
		t.Fatal(err)
	}
	before, _ := d.DumpServices()
	b.Backends = []services.Backend{{IP: ip("10.99.0.3"), Port: 8080}}
	if _, err := d.UpdateServices([]services.Port{b}, []services.Frontend{a.Frontend}); err != nil {
		t.Fatal(err)
	}
	after, err := d.DumpServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != 1 || after[0].VIP != b.VIP || len(after[0].Backends) != 1 || after[0].Backends[0].IP != ip("10.99.0.3") {
		t.Fatalf("after the update: %+v", after)
	}
	for _, s := range before {
		if s.VIP == b.VIP && s.ID != after[0].ID {
			t.Errorf("service id changed %d -> %d", s.ID, after[0].ID)
		}
	}
	var id uint32
	var v sockaddrBackendValue
	n := 0
	it := d.sockAddr.ShuntBackends.Iterate()
	for it.Next(&id, &v) {
		n++
		if fromBe32(v.Ip) != ip("10.99.0.3") {
			t.Errorf("unused backend %s left in shunt_backends", fromBe32(v.Ip))
		}
	}
	if n != 1 {
		t.Errorf("%d backends, want 1", n)
	}
	// The same through a full sync gives the same table.
	if _, err := d.SyncServices([]services.Port{b}); err != nil {
		t.Fatal(err)
	}
	if again, _ := d.DumpServices(); len(again) != 1 || again[0].ID != after[0].ID {
		t.Errorf("full sync after update: %+v", again)
	}
}

// TestServiceWritesInBatches: a sync large enough for batch system calls
// writes and removes everything, reports the UDP backends no service uses
// any more (not the TCP ones, not the ones still used), and tolerates an
// entry that is already gone from the kernel.
func TestServiceWritesInBatches(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	var ports []services.Port
	for i := range 40 {
		p := services.Port{Frontend: services.Frontend{VIP: netip.AddrFrom4([4]byte{10, 96, 1, byte(i)}), Port: 53, Proto: 17}, Name: fmt.Sprint("s", i)}
		for j := range 10 {
			p.Backends = append(p.Backends, services.Backend{IP: netip.AddrFrom4([4]byte{10, 99, byte(i), byte(j)}), Port: 5353})
		}
		ports = append(ports, p)
	}
	tcp := ports[0]
	tcp.Proto = 6
	if gone, err := d.SyncServices(append(ports, tcp)); err != nil || len(gone) != 0 {
		t.Fatalf("first sync: gone %v, %v", gone, err)
	}
	if dump, _ := d.DumpServices(); len(dump) != 41 {
		t.Fatalf("%d service ports written, want 41", len(dump))
	}
	// Someone removed one slot behind our back: the removal still succeeds.
	k := sockaddrServiceKey{Vip: be32(ports[5].VIP), Port: be16(53), Proto: 17, Slot: 3}
	if err := d.sockAddr.ShuntServices.Delete(k); err != nil {
		t.Fatal(err)
	}
	var remove []services.Frontend
	for _, p := range ports[:20] {
		remove = append(remove, p.Frontend)
	}
	gone, err := d.UpdateServices(nil, remove)
	if err != nil {
		t.Fatal(err)
	}
	// s0's backends are still used by the TCP port, but as TCP backends:
	// the UDP ones of s0..s19 are all gone.
	if len(gone) != 200 {
		t.Errorf("%d UDP backends reported gone, want 200", len(gone))
	}
	if dump, _ := d.DumpServices(); len(dump) != 21 {
		t.Errorf("%d service ports left, want 21", len(dump))
	}
	var id uint32
	var v sockaddrBackendValue
	n := 0
	for it := d.sockAddr.ShuntBackends.Iterate(); it.Next(&id, &v); {
		n++
	}
	if n != 210 { // s20..s39 UDP, s0 TCP
		t.Errorf("%d backends left, want 210", n)
	}
	// The slot count kept for capacity checks matches the kernel's map
	// (the entry deleted behind our back aside).
	var sk sockaddrServiceKey
	var sv sockaddrServiceValue
	entries := 0
	for it := d.sockAddr.ShuntServices.Iterate(); it.Next(&sk, &sv); {
		entries++
	}
	if d.services.slots != entries || entries != 21*11 {
		t.Errorf("slot count %d, shunt_services holds %d, want %d", d.services.slots, entries, 21*11)
	}
}
