package datapath

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// TestDiffEntries: the comparison itself, without a kernel: missing,
// altered and extra keys, each once, and nothing for equal entries.
func TestDiffEntries(t *testing.T) {
	want := map[string]int{"same": 1, "missing": 2, "altered": 3}
	have := map[string]int{"same": 1, "altered": 4, "extra": 5}
	got := map[string]entryDiff[string, int]{}
	for _, d := range diffEntries(want, have) {
		if _, dup := got[d.key]; dup {
			t.Errorf("key %q reported twice", d.key)
		}
		got[d.key] = d
	}
	if len(got) != 3 {
		t.Fatalf("diffs %v, want missing, altered and extra", got)
	}
	if d := got["missing"]; !d.inWant || d.inHave || d.want != 2 {
		t.Errorf("missing: %+v", d)
	}
	if d := got["altered"]; !d.inWant || !d.inHave || d.want != 3 || d.have != 4 {
		t.Errorf("altered: %+v", d)
	}
	if d := got["extra"]; d.inWant || !d.inHave || d.have != 5 {
		t.Errorf("extra: %+v", d)
	}
	if d := diffEntries(map[string]int{}, map[string]int{}); len(d) != 0 {
		t.Errorf("empty sets differ: %v", d)
	}
	if d := diffEntries(want, map[string]int{"same": 1, "missing": 2, "altered": 3}); len(d) != 0 {
		t.Errorf("equal sets differ: %v", d)
	}
}

// TestVerifyMapsRepairs: entries of the service, backend, policy, ipcache
// and endpoint maps deleted, altered or added behind the datapath's back
// are reported readably, repaired, counted, and a second check is clean.
func TestVerifyMapsRepairs(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	vip, b1, b2 := netip.MustParseAddr("10.96.7.1"), netip.MustParseAddr("10.99.7.2"), netip.MustParseAddr("10.99.7.3")
	port := services.Port{Frontend: services.Frontend{VIP: vip, Port: 80, Proto: 6}, Name: "default/web:http",
		Backends: []services.Backend{{IP: b1, Port: 8080}, {IP: b2, Port: 8080}}}
	if _, err := d.SyncServices([]services.Port{port}); err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	state := policy.State{
		IPCache: []policy.PrefixIdentity{{Prefix: netip.PrefixFrom(b1, 32), Identity: 300}, {Prefix: netip.PrefixFrom(b2, 32), Identity: 301}},
		Entries: []policy.Entry{{Key: policy.Key{Endpoint: b1, Identity: 301, Proto: 6, Port: 8080, PortBits: 16}, Verdict: policy.VerdictAllow, RuleID: 1}},
	}
	eps := []Endpoint{{IP: b1, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300, IngressIsolated: true},
		{IP: b2, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 301}}
	if err := d.SyncPolicy(state, eps); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncL7Redirects(nil); err != nil {
		t.Fatal(err)
	}
	if err := d.SetFlowMode(FlowModeDefault); err != nil {
		t.Fatal(err)
	}
	r, err := d.VerifyMaps(true)
	if err != nil || r.Differs() {
		t.Fatalf("fresh maps: %+v, %v", r.Entries, err)
	}
	if r.Checked["shunt_services"] != 3 || r.Checked["shunt_backends"] != 2 || r.Checked["shunt_policy"] != 1 {
		t.Errorf("checked %v", r.Checked)
	}

	// Tamper: a backend slot gone, a backend pointed elsewhere, a policy
	// entry gone, an ipcache identity changed, an endpoint gone, an extra
	// service that nobody asked for, flow sampling switched.
	master := sockaddrServiceKey{Vip: be32(vip), Port: be16(80), Proto: 6}
	slot1 := master
	slot1.Slot = 1
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(d.sockAddr.ShuntServices.Delete(slot1))
	var id uint32
	for i, k := range d.services.keys {
		if k.ip == b2 {
			id = i
		}
	}
	must(d.sockAddr.ShuntBackends.Put(id, sockaddrBackendValue{Ip: be32(netip.MustParseAddr("10.99.7.99")), Port: be16(8080), Proto: 6}))
	must(d.objs.ShuntPolicy.Delete(policyKey(state.Entries[0].Key)))
	must(d.objs.ShuntIpcache.Put(ipcacheKey(netip.PrefixFrom(b2, 32)), podtcIpcacheValue{Identity: 999}))
	must(d.objs.ShuntEndpoints.Delete(endpointKey(b1)))
	extra := sockaddrServiceKey{Vip: be32(netip.MustParseAddr("10.96.7.66")), Port: be16(80), Proto: 6}
	must(d.sockAddr.ShuntServices.Put(extra, sockaddrServiceValue{Id: 77}))
	must(d.objs.ShuntFlowConfig.Put(uint32(0), podtcFlowConfig{Mode: uint32(FlowModeAll)}))

	r, text := dryRunReport(t, d)
	for _, want := range []string{
		"shunt_services | 10.96.7.1:80/TCP slot 1 | backend ",
		"shunt_services | 10.96.7.66:80/TCP slot 0 |  | service 77, 0 backends",
		"shunt_backends | backend ",
		"| 10.99.7.3:8080/TCP | 10.99.7.99:8080/TCP",
		"shunt_policy | 10.99.7.2 ingress from identity 301 8080/TCP | allow (rule 1) | ",
		"shunt_ipcache | 10.99.7.3/32 | identity 301 | identity 999",
		"shunt_endpoints | 10.99.7.2 | ifindex 1, identity 300, flags ingress-isolated",
		"shunt_flow_config | 0 | sampling default | sampling all",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if len(r.Entries) != 7 || r.Repaired != nil {
		t.Errorf("%d differences (want 7), repaired %v:\n%s", len(r.Entries), r.Repaired, text)
	}
	// A dry run changed nothing.
	if again, _ := d.VerifyMaps(false); len(again.Entries) != 7 {
		t.Errorf("after a dry run: %d differences", len(again.Entries))
	}

	r, err = d.VerifyMaps(true)
	if err != nil {
		t.Fatal(err)
	}
	wantRepaired := map[string]int{"shunt_services": 2, "shunt_backends": 1, "shunt_policy": 1, "shunt_ipcache": 1,
		"shunt_endpoints": 1, "shunt_flow_config": 1}
	for m, n := range wantRepaired {
		if r.Repaired[m] != n {
			t.Errorf("repaired %v, want %v", r.Repaired, wantRepaired)
			break
		}
	}
	if r, err = d.VerifyMaps(true); err != nil || r.Differs() {
		t.Errorf("after the repair: %+v, %v", r.Entries, err)
	}
	dump, err := d.DumpServices()
	if err != nil || len(dump) != 1 || len(dump[0].Backends) != 2 ||
		!slices.ContainsFunc(dump[0].Backends, func(b BackendDump) bool { return b.IP == b2 }) {
		t.Errorf("services after the repair: %+v, %v", dump, err)
	}
	// The next sync still writes only what changed: the mirror was right.
	if _, err := d.UpdateServices(nil, []services.Frontend{port.Frontend}); err != nil {
		t.Fatal(err)
	}
	if n, _ := countKeys(d.sockAddr.ShuntServices); n != 0 {
		t.Errorf("%d shunt_services entries left after removing the only service", n)
	}
}

// dryRunReport checks d's maps without repairing them: the report, and its
// entries one a line as "map | key | expected | found".
func dryRunReport(t *testing.T, d *Datapath) (DriftReport, string) {
	t.Helper()
	r, err := d.VerifyMaps(false)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range r.Entries {
		lines = append(lines, e.Map+" | "+e.Key+" | "+e.Expected+" | "+e.Found)
	}
	return r, strings.Join(lines, "\n")
}

// BenchmarkVerifyMaps: one check of the service maps at 10 000 services of
// 10 backends each (110 000 shunt_services and 100 000 shunt_backends
// entries), nothing to repair.
func BenchmarkVerifyMaps(b *testing.B) {
	d := openTestDatapath(&testing.T{}, ModeRedirectPeer)
	var ports []services.Port
	for i := range 10000 {
		p := services.Port{Frontend: services.Frontend{VIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: 6}}
		for j := range 10 {
			n := i*10 + j
			p.Backends = append(p.Backends, services.Backend{IP: netip.AddrFrom4([4]byte{10, 200, byte(n >> 8), byte(n)}), Port: uint16(8000 + n>>16)})
		}
		ports = append(ports, p)
	}
	if _, err := d.SyncServices(ports); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r, err := d.VerifyMaps(true)
		if err != nil || r.Differs() {
			b.Fatalf("%v %d", err, len(r.Entries))
		}
	}
}

// TestDriftMapsAreDesiredState: every map drift checks compare is one the
// datapath describes, and none is one the programs insert into (runtime
// state: conntrack, NAT, affinity, ...), which a check would "repair"
// away.
func TestDriftMapsAreDesiredState(t *testing.T) {
	for _, name := range DriftMaps {
		md, ok := describe(name)
		if !ok {
			t.Errorf("%s: not in mapTable", name)
			continue
		}
		if md.insertFailed != "" {
			t.Errorf("%s: programs insert into it (%s): runtime state, not the agent's to compare", name, md.insertFailed)
		}
	}
}
