package datapath

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/services"
)

// TestVerifyMapsNodePort: the maps of traffic from outside are checked as
// the service maps are: a Maglev table's slot rewritten, a frontend's
// shunt_maglev entry gone, an entry no frontend has, a source range's
// admitting entry gone and its catch-all turned to admit, each behind the
// datapath's back, are reported readably, repaired, counted, and a second
// check is clean; the kernel's table is the Go table again.
func TestVerifyMapsNodePort(t *testing.T) {
	const size = 1009
	d, _, _ := nodePortTestNode(t, size)
	b1, b2 := netip.MustParseAddr("10.99.0.20"), netip.MustParseAddr("10.99.0.21")
	backends := []services.Backend{{IP: b1, Port: 8080}, {IP: b2, Port: 8080}}
	nodePort := services.Port{Frontend: services.Frontend{VIP: npNode, Port: 30090, Proto: 6}, Kind: services.KindNodePort,
		Name: "default/web:http", Backends: backends}
	lb := services.Port{Frontend: services.Frontend{VIP: npLB, Port: 80, Proto: 6}, Kind: services.KindLoadBalancer,
		Name: "default/web:http", Backends: backends, SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	if _, err := d.SyncServices([]services.Port{nodePort, lb}); err != nil {
		t.Fatal(err)
	}
	r, err := d.VerifyMaps(true)
	if err != nil || r.Differs() {
		t.Fatalf("fresh maps: %+v, %v", r.Entries, err)
	}
	// Two frontends sharing one table: two entries and its slots; the
	// catch-all and one range.
	if r.Checked["shunt_maglev"] != 2+size || r.Checked["shunt_lb_source_ranges"] != 2 {
		t.Errorf("checked %v", r.Checked)
	}

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	npID, lbID := d.services.ports[nodePort.Frontend].id, d.services.ports[lb.Frontend].id
	table := d.maglev.byFrontend[nodePort.Frontend].table
	var slot7 uint32
	must(table.array.Lookup(uint32(7), &slot7))
	other := table.ids[0]
	if other == slot7 {
		other = table.ids[1]
	}
	must(table.array.Put(uint32(7), other))
	must(d.objs.ShuntMaglev.Delete(lbID))
	must(d.objs.ShuntMaglev.Put(uint32(4242), table.array))
	must(d.objs.ShuntLbSourceRanges.Delete(rangeKeyOf(lbID, netip.MustParsePrefix("192.0.2.0/24"))))
	must(d.objs.ShuntLbSourceRanges.Put(rangeKeyOf(lbID, netip.MustParsePrefix("0.0.0.0/0")), uplinktcLbSourceRangeValue{Allow: 1}))

	r, text := dryRunReport(t, d)
	for _, want := range []string{
		"shunt_maglev | table of default/web:http slot 7 | " + d.backendIDText(slot7) + " | " + d.backendIDText(other),
		"shunt_maglev | " + d.services.serviceIDText(lbID) + " | table of default/web:http (array ",
		"shunt_maglev | service 4242 |  | table of default/web:http (array ",
		"shunt_lb_source_ranges | " + d.services.serviceIDText(lbID) + " clients 192.0.2.0/24 | admit | ",
		"shunt_lb_source_ranges | " + d.services.serviceIDText(lbID) + " clients 0.0.0.0/0 | refuse | admit",
		"shunt_lb_source_ranges | service " + fmt.Sprint(lbID) + " (" + npLB.String() + ":80/TCP) clients",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if len(r.Entries) != 5 {
		t.Errorf("%d differences, want 5:\n%s", len(r.Entries), text)
	}

	r, err = d.VerifyMaps(true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Repaired["shunt_maglev"] != 3 || r.Repaired["shunt_lb_source_ranges"] != 2 {
		t.Errorf("repaired %v, want shunt_maglev 3, shunt_lb_source_ranges 2", r.Repaired)
	}
	if r, err = d.VerifyMaps(true); err != nil || r.Differs() {
		t.Errorf("after the repair: %+v, %v", r.Entries, err)
	}
	// Both frontends name the table's array again, which holds the table.
	for _, id := range []uint32{npID, lbID} {
		var inner *ebpf.Map
		if err := d.objs.ShuntMaglev.Lookup(id, &inner); err != nil {
			t.Fatalf("shunt_maglev entry of service %d: %v", id, err)
		}
		var got uint32
		must(inner.Lookup(uint32(7), &got))
		inner.Close()
		if got != slot7 {
			t.Errorf("service %d: slot 7 holds backend %d, want %d", id, got, slot7)
		}
	}
	// The next sync still writes only what changed: the mirror was right.
	if _, err := d.UpdateServices(nil, []services.Frontend{nodePort.Frontend, lb.Frontend}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*ebpf.Map{d.objs.ShuntMaglev, d.objs.ShuntLbSourceRanges} {
		if n, _ := countKeys(m); n != 0 {
			t.Errorf("%d entries left in %s after removing the frontends", n, mapName(m))
		}
	}
}
