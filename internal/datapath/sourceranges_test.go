package datapath

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/services"
)

// admits is the trie lookup of bpf/lib/source_ranges.h over the fake's
// entries: the longest prefix holding (id, client) decides; none admits.
func (m *fakeServiceMaps) admits(id uint32, client netip.Addr) bool {
	best, allow := -1, true
	for k, v := range m.ranges {
		kid, p := rangeOfKey(k)
		if kid == id && p.Contains(client) && p.Bits() > best {
			best, allow = p.Bits(), v.Allow == 1
		}
	}
	return allow
}

// TestServicePlanSourceRanges: a load balancer frontend's ranges are
// written before its slot 0 publishes it, admit exactly their clients,
// follow a change (stale entries removed after slot 0) and go with the
// ranges or the port.
func TestServicePlanSourceRanges(t *testing.T) {
	lb := planFrontend("192.0.2.100", 80, ipTCP)
	backends := []services.Backend{{IP: netip.MustParseAddr("10.0.0.1"), Port: 8080}}
	port := func(ranges ...string) services.Port {
		p := services.Port{Frontend: lb, Kind: services.KindLoadBalancer, Name: "shop/web:http", Backends: backends}
		for _, r := range ranges {
			p.SourceRanges = append(p.SourceRanges, netip.MustParsePrefix(r))
		}
		return p
	}
	table, m := newServiceTable(), newFakeServiceMaps()
	inside, outside, office := netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("203.0.113.9")
	check := func(step string, want map[netip.Addr]bool, entries int) {
		t.Helper()
		id := table.ports[lb].id
		for client, ok := range want {
			if got := m.admits(id, client); got != ok {
				t.Errorf("%s: client %s admitted %v, want %v", step, client, got, ok)
			}
		}
		if len(m.ranges) != entries {
			t.Errorf("%s: %d trie entries, want %d: %v", step, len(m.ranges), entries, m.ranges)
		}
	}

	ops, _ := applyPlan(t, &table, m, planStep{sync: []services.Port{port("10.0.0.0/8", "203.0.113.9/32")}})
	master := slices.Index(ops, "put 192.0.2.100:80/6#0")
	for i, op := range ops {
		if strings.HasPrefix(op, "put range") && i > master {
			t.Errorf("%q after the slot 0 that publishes the frontend: %v", op, ops)
		}
	}
	check("new", map[netip.Addr]bool{inside: true, office: true, outside: false}, 3)

	ops, _ = applyPlan(t, &table, m, planStep{update: true, upsert: []services.Port{port("0.0.0.0/0")}})
	check("every client", map[netip.Addr]bool{inside: true, office: true, outside: true}, 1)
	if i := slices.IndexFunc(ops, func(op string) bool { return strings.HasPrefix(op, "delete range") }); i < slices.Index(ops, "put 192.0.2.100:80/6#0") {
		t.Errorf("a stale range deleted before slot 0 was written: %v", ops)
	}

	applyPlan(t, &table, m, planStep{sync: []services.Port{port("203.0.113.0/24")}})
	check("changed", map[netip.Addr]bool{inside: false, office: true, outside: false}, 2)

	applyPlan(t, &table, m, planStep{sync: []services.Port{port()}})
	check("ranges removed", map[netip.Addr]bool{inside: true, office: true, outside: true}, 0)

	applyPlan(t, &table, m, planStep{sync: []services.Port{port("10.0.0.0/8")}})
	applyPlan(t, &table, m, planStep{sync: nil})
	if len(m.ranges) != 0 {
		t.Errorf("port removed: the trie still holds %v", m.ranges)
	}
	checkMirror(t, &table, m)
}

// TestSourceRangesRefusedWhenTheTrieIsFull: a sync or update whose source
// range entries the trie cannot hold at their peak (the new ones are
// written before the stale ones go) is refused before any write, naming
// the map; what was there stays, and the next sync that fits goes through.
func TestSourceRangesRefusedWhenTheTrieIsFull(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	max := int(d.objs.ShuntLbSourceRanges.MaxEntries())
	backends := []services.Backend{{IP: netip.MustParseAddr("10.99.0.1"), Port: 8080}}
	lb := func(vip string, ranges []netip.Prefix) services.Port {
		return services.Port{Frontend: planFrontend(vip, 80, ipTCP), Kind: services.KindLoadBalancer, Name: "shop/" + vip + ":http",
			Backends: backends, SourceRanges: ranges}
	}
	hosts := func(second byte, n int) []netip.Prefix {
		out := make([]netip.Prefix, n)
		for i := range out {
			out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, second, byte(i >> 8), byte(i)}), 32)
		}
		return out
	}
	entries := func() int {
		t.Helper()
		n, err := countKeys(d.objs.ShuntLbSourceRanges)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	keep := lb("192.0.2.1", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	if _, err := d.SyncServices([]services.Port{keep}); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 2 {
		t.Fatalf("%d entries for one range, want 2 (the range and the frontend's catch-all)", n)
	}

	// More ranges than the trie holds: refused, nothing written.
	_, err := d.SyncServices([]services.Port{keep, lb("192.0.2.2", hosts(18, max))})
	if err == nil || !strings.Contains(err.Error(), "shunt_lb_source_ranges is full") {
		t.Fatalf("%d ranges: err %v, want the map named full", max, err)
	}
	if n := entries(); n != 2 {
		t.Errorf("after the refused sync the trie holds %d entries, want the 2 it had", n)
	}

	// Fits alone, but not while a change of all its ranges is written.
	half := max/2 + 100
	big := lb("192.0.2.2", hosts(18, half))
	if _, err := d.SyncServices([]services.Port{keep, big}); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 2+half+1 {
		t.Fatalf("%d entries, want %d", n, 2+half+1)
	}
	_, err = d.UpdateServices([]services.Port{lb("192.0.2.2", hosts(19, half))}, nil)
	if err == nil || !strings.Contains(err.Error(), "shunt_lb_source_ranges is full") {
		t.Fatalf("replacing %d ranges by %d others: err %v, want refused at the peak", half, half, err)
	}
	if n := entries(); n != 2+half+1 {
		t.Errorf("after the refused update the trie holds %d entries, want the %d it had", n, 2+half+1)
	}
	// Removing the big frontend first, then adding the other: both fit.
	if _, err := d.UpdateServices(nil, []services.Frontend{big.Frontend}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.UpdateServices([]services.Port{lb("192.0.2.3", hosts(19, half))}, nil); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 2+half+1 {
		t.Errorf("after the two updates the trie holds %d entries, want %d", n, 2+half+1)
	}
}
