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
