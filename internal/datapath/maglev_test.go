package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/maglev"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// A new flow from outside picks the backend the Go-computed table names
// for its hash, on every frontend of the port (a NodePort and a load
// balancer address share one table), and keeps it once the table
// changes; a backend's removal moves only the flows the new table moves.
func TestNodePortMaglev(t *testing.T) {
	const size = 1009 // ≥ 100 × 10 backends: no warning
	d, ns, uplink := nodePortTestNode(t, size)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	var backends []services.Backend
	var eps []Endpoint
	var ipcache []policy.PrefixIdentity
	for i := range 10 {
		ip := netip.AddrFrom4([4]byte{10, 99, 0, byte(20 + i)})
		backends = append(backends, services.Backend{IP: ip, Port: 8080})
		eps = append(eps, Endpoint{IP: ip, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300})
		ipcache = append(ipcache, policy.PrefixIdentity{Prefix: netip.PrefixFrom(ip, 32), Identity: 300})
	}
	if err := d.SyncPolicy(policy.State{IPCache: ipcache}, eps); err != nil {
		t.Fatal(err)
	}
	const name = "default/web:http"
	port := func(vip netip.Addr, p uint16, kind services.Kind, bs []services.Backend) services.Port {
		return services.Port{Frontend: services.Frontend{VIP: vip, Port: p, Proto: 6}, Kind: kind, Name: name, Backends: bs}
	}
	nodePort := port(npNode, 30090, services.KindNodePort, backends)
	lb := port(npLB, 30090, services.KindLoadBalancer, backends)
	if _, err := d.SyncServices([]services.Port{nodePort, lb}); err != nil {
		t.Fatal(err)
	}
	if w := d.MaglevWarnings(); len(w) != 0 {
		t.Errorf("warnings at %d slots for 10 backends: %q", size, w)
	}
	expected := func(bs []services.Backend, client netip.Addr, sport uint16) netip.Addr {
		t.Helper()
		var names []string
		for _, b := range bs {
			names = append(names, netip.AddrPortFrom(b.IP, b.Port).String())
		}
		tab, _, err := maglev.Compute(names, size, []byte(name))
		if err != nil {
			t.Fatal(err)
		}
		be := tab.Backends[tab.Slots[tab.Slot(maglev.FlowHash(client.As4(), sport, 30090, 6))]]
		return netip.MustParseAddrPort(be).Addr()
	}
	run := func(pkt []byte) (uint32, tuple) {
		t.Helper()
		ret, out := runFromUplink(t, d, ns, uplink, withChecksum(pkt))
		return ret, checkedTuple(t, out)
	}
	seen := map[netip.Addr]int{}
	chosen := map[uint16]netip.Addr{}
	for sport := uint16(41000); sport < 41200; sport++ {
		want := expected(backends, npClient, sport)
		for _, vip := range []netip.Addr{npNode, npLB} {
			ret, got := run(packet(npClient, vip, 6, tcpSegment(sport, 30090, tcpSYN)))
			if ret != tcActRedirect || got.dst != want {
				t.Fatalf("client port %d to %s: verdict %d, backend %s; want redirect to %s (the Go table's)", sport, vip, ret, got.dst, want)
			}
		}
		seen[want]++
		chosen[sport] = want
	}
	if len(seen) < 8 {
		t.Errorf("200 flows went to %d of 10 backends: %v", len(seen), seen)
	}

	// The dump names each backend's share of the table, for both frontends.
	dumps, err := d.DumpMaglev()
	if err != nil {
		t.Fatal(err)
	}
	if len(dumps) != 2 {
		t.Fatalf("dump: %d tables, want 2: %+v", len(dumps), dumps)
	}
	// The kernel's arrays hold the Go table slot for slot.
	var names []string
	for _, b := range backends {
		names = append(names, netip.AddrPortFrom(b.IP, b.Port).String())
	}
	tab, _, _ := maglev.Compute(names, size, []byte(name))
	h := sha256.New()
	for _, s := range tab.Slots {
		fmt.Fprintln(h, tab.Backends[s])
	}
	want := hex.EncodeToString(h.Sum(nil)[:8])
	for _, md := range dumps {
		if md.Digest != want {
			t.Errorf("%s: the kernel's table has digest %s, the Go table %s", md.Frontend.VIP, md.Digest, want)
		}
	}
	for _, md := range dumps {
		total := 0
		for _, n := range md.Share {
			total += n
			if n < size/10 || n > size/10+1 {
				t.Errorf("%s: a backend holds %d slots, want %d or %d", md.Frontend.VIP, n, size/10, size/10+1)
			}
		}
		if md.Size != size || total != size || len(md.Share) != 10 || md.Name != name {
			t.Errorf("dump %+v: want %d slots over 10 backends, named %s", md, size, name)
		}
	}

	// One backend goes: established flows keep their backend (the flow
	// table), new flows follow the new table, and a flow the new table
	// keeps where it was stays there.
	gone := backends[3].IP
	rest := append(append([]services.Backend{}, backends[:3]...), backends[4:]...)
	nodePort.Backends, lb.Backends = rest, rest
	if _, err := d.UpdateServices([]services.Port{nodePort, lb}, nil); err != nil {
		t.Fatal(err)
	}
	for sport, was := range chosen {
		if was == gone {
			continue
		}
		if _, got := run(packet(npClient, npNode, 6, tcpSegment(sport, 30090, tcpACK))); got.dst != was {
			t.Errorf("established flow from port %d moved from %s to %s", sport, was, got.dst)
		}
	}
	moved := 0
	for sport := uint16(42000); sport < 42100; sport++ {
		want := expected(rest, npClient, sport)
		if want != expected(backends, npClient, sport) && expected(backends, npClient, sport) != gone {
			moved++
		}
		if ret, got := run(packet(npClient, npLB, 6, tcpSegment(sport, 30090, tcpSYN))); ret != tcActRedirect || got.dst != want {
			t.Errorf("new flow from port %d after the removal: backend %s, want %s", sport, got.dst, want)
		}
	}
	t.Logf("after the removal, %d of 100 new flows not on the removed backend went elsewhere than before", moved)

	// Below 100 slots per backend: the table works, with a warning.
	var many []services.Backend
	for i := range 11 {
		many = append(many, services.Backend{IP: netip.AddrFrom4([4]byte{10, 99, 1, byte(i)}), Port: 80})
	}
	crowded := services.Port{Frontend: services.Frontend{VIP: npNode, Port: 30091, Proto: 6}, Kind: services.KindNodePort, Name: "default/crowded:http", Backends: many}
	if _, err := d.UpdateServices([]services.Port{crowded}, nil); err != nil {
		t.Fatal(err)
	}
	if w := d.MaglevWarnings(); len(w) != 1 || w[0].Port != "default/crowded:http" || !strings.Contains(w[0].Message, fmt.Sprint(1100)) {
		t.Errorf("warnings %q, want one for default/crowded:http naming a size of at least 1100", w)
	}
	// Removing the frontends removes their tables, and the warning.
	if _, err := d.SyncServices(nil); err != nil {
		t.Fatal(err)
	}
	if dumps, err := d.DumpMaglev(); err != nil || len(dumps) != 0 || len(d.MaglevWarnings()) != 0 {
		t.Errorf("after removing every service: %d tables (%v), warnings %q", len(dumps), err, d.MaglevWarnings())
	}
}
