package datapath

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/services"
)

// The service-table planner without the kernel: each case plans a sync (or
// a partial update) against the in-memory mirror, makes the planned writes
// one entry at a time on an in-memory copy of shunt_services and
// shunt_backends (as kube-proxy's proxiers are tested against a fake
// iptables), and checks after every single write that no service points
// at a missing slot or backend, and at the end the exact entries, the
// writes made and the mirror.

const (
	ipTCP = 6
	ipUDP = 17
)

// fakeServiceMaps is shunt_services and shunt_backends in memory.
type fakeServiceMaps struct {
	services map[sockaddrServiceKey]sockaddrServiceValue
	backends map[uint32]sockaddrBackendValue
	ranges   map[uplinktcLbSourceRangeKey]uplinktcLbSourceRangeValue
	ops      []string        // every write made, in order
	after    func(op string) // called after each single write
}

func newFakeServiceMaps() *fakeServiceMaps {
	return &fakeServiceMaps{services: map[sockaddrServiceKey]sockaddrServiceValue{}, backends: map[uint32]sockaddrBackendValue{},
		ranges: map[uplinktcLbSourceRangeKey]uplinktcLbSourceRangeValue{}}
}

func (m *fakeServiceMaps) did(op string) {
	m.ops = append(m.ops, op)
	if m.after != nil {
		m.after(op)
	}
}

func (m *fakeServiceMaps) putBackends(ids []uint32, vals []sockaddrBackendValue) error {
	for i, id := range ids {
		m.backends[id] = vals[i]
		m.did(fmt.Sprintf("put backend %d", id))
	}
	return nil
}

func (m *fakeServiceMaps) putServices(keys []sockaddrServiceKey, vals []sockaddrServiceValue) error {
	for i, k := range keys {
		m.services[k] = vals[i]
		m.did("put " + serviceSlotText(k))
	}
	return nil
}

func (m *fakeServiceMaps) deleteServices(keys []sockaddrServiceKey) error {
	for _, k := range keys {
		delete(m.services, k)
		m.did("delete " + serviceSlotText(k))
	}
	return nil
}

func (m *fakeServiceMaps) deleteBackends(ids []uint32) error {
	for _, id := range ids {
		delete(m.backends, id)
		m.did(fmt.Sprintf("delete backend %d", id))
	}
	return nil
}

func (m *fakeServiceMaps) putRanges(keys []uplinktcLbSourceRangeKey, vals []uplinktcLbSourceRangeValue) error {
	for i, k := range keys {
		m.ranges[k] = vals[i]
		m.did("put range " + rangeText(k, vals[i]))
	}
	return nil
}

func (m *fakeServiceMaps) deleteRanges(keys []uplinktcLbSourceRangeKey) error {
	for _, k := range keys {
		delete(m.ranges, k)
		m.did("delete range " + rangeText(k, uplinktcLbSourceRangeValue{}))
	}
	return nil
}

func rangeText(k uplinktcLbSourceRangeKey, v uplinktcLbSourceRangeValue) string {
	id, p := rangeOfKey(k)
	return fmt.Sprintf("%d %s allow=%d", id, p, v.Allow)
}

func serviceSlotText(k sockaddrServiceKey) string {
	return fmt.Sprintf("%s:%d/%d#%d", fromBe32(k.Vip), fromBe16(k.Port), k.Proto, k.Slot)
}

// broken says what of the maps' contents a lookup could trip over: a port
// whose slot 0 counts a slot that is missing, or a slot whose backend is.
func (m *fakeServiceMaps) broken() []string {
	var out []string
	for k, v := range m.services {
		if k.Slot != 0 {
			continue
		}
		for slot := uint16(1); slot <= v.BackendCount; slot++ {
			sk := k
			sk.Slot = slot
			sv, ok := m.services[sk]
			if !ok {
				out = append(out, fmt.Sprintf("%s counts %d backends, slot %d is missing", serviceSlotText(k), v.BackendCount, slot))
			} else if _, ok := m.backends[sv.Id]; !ok {
				out = append(out, fmt.Sprintf("%s holds backend %d, which is missing", serviceSlotText(sk), sv.Id))
			}
		}
	}
	slices.Sort(out)
	return out
}

// reachable is the backends a lookup of f can pick now, and whether f is
// there at all.
func (m *fakeServiceMaps) reachable(f services.Frontend) ([]services.Backend, bool) {
	k := sockaddrServiceKey{Vip: be32(f.VIP), Port: be16(f.Port), Proto: f.Proto}
	v, ok := m.services[k]
	if !ok {
		return nil, false
	}
	var out []services.Backend
	for slot := uint16(1); slot <= v.BackendCount; slot++ {
		k.Slot = slot
		b := m.backends[m.services[k].Id]
		out = append(out, services.Backend{IP: fromBe32(b.Ip), Port: fromBe16(b.Port)})
	}
	return out, true
}

// Entries, as the tests write them.

func planFrontend(vip string, planPort uint16, proto uint8) services.Frontend {
	return services.Frontend{VIP: netip.MustParseAddr(vip), Port: planPort, Proto: proto}
}

func planBackend(addr string) services.Backend {
	ap := netip.MustParseAddrPort(addr)
	return services.Backend{IP: ap.Addr(), Port: ap.Port()}
}

func planPort(f services.Frontend, affinity uint32, backends ...string) services.Port {
	p := services.Port{Frontend: f, Name: fmt.Sprintf("test/%s", f.VIP), AffinityTimeout: affinity}
	for _, b := range backends {
		p.Backends = append(p.Backends, planBackend(b))
	}
	return p
}

func planSlotKey(f services.Frontend, slot uint16) sockaddrServiceKey {
	return sockaddrServiceKey{Vip: be32(f.VIP), Port: be16(f.Port), Proto: f.Proto, Slot: slot}
}

func planMaster(id uint32, count uint16, affinity uint32) sockaddrServiceValue {
	v := sockaddrServiceValue{Id: id, BackendCount: count}
	if affinity > 0 {
		v.Flags, v.AffinityTimeout = serviceAffinityFlag, affinity
	}
	return v
}

func planBackendVal(addr string, proto uint8) sockaddrBackendValue {
	b := planBackend(addr)
	return sockaddrBackendValue{Ip: be32(b.IP), Port: be16(b.Port), Proto: proto}
}

// contents is what the two maps hold.
type planContents struct {
	services map[sockaddrServiceKey]sockaddrServiceValue
	backends map[uint32]sockaddrBackendValue
}

// svc is the entries of one port: slot 0, then one slot per backend id.
func planEntries(f services.Frontend, id uint32, affinity uint32, backendIDs ...uint32) map[sockaddrServiceKey]sockaddrServiceValue {
	out := map[sockaddrServiceKey]sockaddrServiceValue{planSlotKey(f, 0): planMaster(id, uint16(len(backendIDs)), affinity)}
	for i, b := range backendIDs {
		out[planSlotKey(f, uint16(i+1))] = sockaddrServiceValue{Id: b}
	}
	return out
}

func mergeMaps[K comparable, V any](ms ...map[K]V) map[K]V {
	out := map[K]V{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

var (
	feWeb  = planFrontend("10.96.0.10", 80, ipTCP)
	feAPI  = planFrontend("10.96.0.11", 443, ipTCP)
	feDNS  = planFrontend("10.96.0.53", 53, ipUDP)
	feWeb2 = planFrontend("10.96.0.10", 8080, ipTCP) // the same address, another port
)

// planStep is one sync or update of a case.
type planStep struct {
	sync   []services.Port // SyncServices(sync), unless update is set
	update bool            // UpdateServices(upsert, remove)
	upsert []services.Port
	remove []services.Frontend
}

func (s planStep) plan(t *serviceTable) *serviceWrites {
	if s.update {
		return t.planUpdate(s.upsert, s.remove)
	}
	return t.planSync(s.sync)
}

// desired is what the maps must hold after the step, port by frontend.
func (s planStep) desired(before map[services.Frontend][]services.Backend) map[services.Frontend][]services.Backend {
	if !s.update {
		out := map[services.Frontend][]services.Backend{}
		for _, p := range s.sync {
			out[p.Frontend] = p.Backends
		}
		return out
	}
	out := maps.Clone(before)
	for _, p := range s.upsert {
		out[p.Frontend] = p.Backends
	}
	for _, f := range s.remove {
		delete(out, f)
	}
	return out
}

// applyPlan plans step against t and makes its writes on m one entry at a
// time, checking after each that nothing a lookup can reach is missing,
// that a port present before and after never disappears, and that it only
// ever leads to its backends of before or after. It returns the writes
// made and the plan.
func applyPlan(t *testing.T, table *serviceTable, m *fakeServiceMaps, step planStep) ([]string, *serviceWrites) {
	t.Helper()
	before := map[services.Frontend][]services.Backend{}
	for f := range table.ports {
		before[f], _ = m.reachable(f)
	}
	after := step.desired(before)
	w := step.plan(table)
	m.ops = nil
	m.after = func(op string) {
		if broken := m.broken(); len(broken) > 0 {
			t.Errorf("after %q: %s", op, strings.Join(broken, "; "))
		}
		for f, old := range before {
			now, ok := m.reachable(f)
			if _, stays := after[f]; stays && !ok {
				t.Errorf("after %q: %s, desired before and after, is gone", op, serviceSlotText(planSlotKey(f, 0)))
			}
			for _, b := range now {
				if !slices.Contains(old, b) && !slices.Contains(after[f], b) {
					t.Errorf("after %q: %s leads to %v, neither an old nor a new backend", op, serviceSlotText(planSlotKey(f, 0)), b)
				}
			}
		}
	}
	if err := w.writeTo(m); err != nil {
		t.Fatal(err)
	}
	m.after = nil
	return m.ops, w
}

// checkMirror: the mirror says what the maps hold, slot counts and
// backend references included, so the next sync diffs against the truth.
func checkMirror(t *testing.T, table *serviceTable, m *fakeServiceMaps) {
	t.Helper()
	if table.slots != len(m.services) {
		t.Errorf("mirror counts %d slots, the map holds %d", table.slots, len(m.services))
	}
	refs := map[uint32]int{}
	ports := 0
	for k, v := range m.services {
		if k.Slot != 0 {
			refs[v.Id]++
			continue
		}
		ports++
		f := services.Frontend{VIP: fromBe32(k.Vip), Port: fromBe16(k.Port), Proto: k.Proto}
		wr, ok := table.ports[f]
		if !ok || wr.id != v.Id || uint16(len(wr.backends)) != v.BackendCount || wr.affinity != v.AffinityTimeout {
			t.Errorf("%s is %+v in the map, %+v (known %v) in the mirror", serviceSlotText(k), v, wr, ok)
		}
	}
	if ports != len(table.ports) || len(table.svcIDs) != len(table.ports) {
		t.Errorf("%d ports in the map, %d in the mirror (%d service ids)", ports, len(table.ports), len(table.svcIDs))
	}
	if len(table.backends) != len(m.backends) || len(table.keys) != len(m.backends) {
		t.Errorf("%d backends in the map, %d/%d in the mirror", len(m.backends), len(table.backends), len(table.keys))
	}
	for id, v := range m.backends {
		k := backendKey{fromBe32(v.Ip), fromBe16(v.Port), v.Proto}
		if table.backends[k] != id || table.keys[id] != k || table.refs[id] != refs[id] {
			t.Errorf("backend %d (%v) used %d times: mirror has id %d, key %v, %d uses", id, k, refs[id], table.backends[k], table.keys[id], table.refs[id])
		}
	}
}

func TestServicePlan(t *testing.T) {
	for _, c := range []struct {
		name    string
		before  []planStep // applied first, under the same checks
		step    planStep
		want    planContents
		ops     []string // the writes, in order; deletes of one kind sorted
		goneUDP []string
	}{{
		name: "new service: backends, then slots, then slot 0",
		step: planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080")}},
		want: planContents{
			services: planEntries(feWeb, 1, 0, 1, 2),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP), 2: planBackendVal("10.0.0.3:8080", ipTCP)},
		},
		ops: []string{"put backend 1", "put backend 2",
			"put 10.96.0.10:80/6#1", "put 10.96.0.10:80/6#2", "put 10.96.0.10:80/6#0"},
	}, {
		name:   "unchanged: no writes",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080")}}},
		step:   planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080")}},
		want:   planContents{services: planEntries(feWeb, 1, 0, 1), backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP)}},
	}, {
		name:   "backend added: its backend, its slot, slot 0 with the new count; other slots untouched",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080")}}},
		step:   planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080", "10.0.0.4:8080")}},
		want: planContents{
			services: planEntries(feWeb, 1, 0, 1, 2, 3),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP), 2: planBackendVal("10.0.0.3:8080", ipTCP),
				3: planBackendVal("10.0.0.4:8080", ipTCP)},
		},
		ops: []string{"put backend 3", "put 10.96.0.10:80/6#3", "put 10.96.0.10:80/6#0"},
	}, {
		name:   "backend removed from the middle: the slots after it move down before the count shrinks, the last slot and the backend go after",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080", "10.0.0.4:8080")}}},
		step:   planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.4:8080")}},
		want: planContents{
			services: planEntries(feWeb, 1, 0, 1, 3),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP), 3: planBackendVal("10.0.0.4:8080", ipTCP)},
		},
		ops: []string{"put 10.96.0.10:80/6#2", "put 10.96.0.10:80/6#0", "delete 10.96.0.10:80/6#3", "delete backend 2"},
	}, {
		name:   "every backend replaced: new backends before the slots that name them, old ones deleted last, ids not reused",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080")}}},
		step:   planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.1.2:8080", "10.0.1.3:8080")}},
		want: planContents{
			services: planEntries(feWeb, 1, 0, 3, 4),
			backends: map[uint32]sockaddrBackendValue{3: planBackendVal("10.0.1.2:8080", ipTCP), 4: planBackendVal("10.0.1.3:8080", ipTCP)},
		},
		ops: []string{"put backend 3", "put backend 4", "put 10.96.0.10:80/6#1", "put 10.96.0.10:80/6#2",
			"put 10.96.0.10:80/6#0", "delete backend 1", "delete backend 2"},
	}, {
		name: "service removed: slot 0 first, then its slots, then the backends no other port uses",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080"),
			planPort(feWeb2, 0, "10.0.0.3:8080")}}},
		step: planStep{sync: []services.Port{planPort(feWeb2, 0, "10.0.0.3:8080")}},
		want: planContents{
			services: planEntries(feWeb2, 2, 0, 2),
			backends: map[uint32]sockaddrBackendValue{2: planBackendVal("10.0.0.3:8080", ipTCP)},
		},
		ops: []string{"delete 10.96.0.10:80/6#0", "delete 10.96.0.10:80/6#1", "delete 10.96.0.10:80/6#2", "delete backend 1"},
	}, {
		name: "a backend shared by two ports has one id and stays while one uses it",
		step: planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080"), planPort(feWeb2, 0, "10.0.0.2:8080", "10.0.0.3:8080")}},
		want: planContents{
			services: mergeMaps(planEntries(feWeb, 1, 0, 1), planEntries(feWeb2, 2, 0, 1, 2)),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP), 2: planBackendVal("10.0.0.3:8080", ipTCP)},
		},
		ops: []string{"put backend 1", "put backend 2", "put 10.96.0.10:80/6#1", "put 10.96.0.10:8080/6#1",
			"put 10.96.0.10:8080/6#2", "put 10.96.0.10:80/6#0", "put 10.96.0.10:8080/6#0"},
	}, {
		name: "session affinity: the flag and the timeout in slot 0",
		step: planStep{sync: []services.Port{planPort(feWeb, 10800, "10.0.0.2:8080")}},
		want: planContents{
			services: planEntries(feWeb, 1, 10800, 1),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP)},
		},
		ops: []string{"put backend 1", "put 10.96.0.10:80/6#1", "put 10.96.0.10:80/6#0"},
	}, {
		name:   "affinity timeout changed: slot 0 alone is rewritten, the service keeps its id (affinity entries stay valid)",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 10800, "10.0.0.2:8080")}}},
		step:   planStep{sync: []services.Port{planPort(feWeb, 60, "10.0.0.2:8080")}},
		want: planContents{
			services: planEntries(feWeb, 1, 60, 1),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP)},
		},
		ops: []string{"put 10.96.0.10:80/6#0"},
	}, {
		name:   "affinity off: flag and timeout cleared",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 10800, "10.0.0.2:8080")}}},
		step:   planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080")}},
		want: planContents{
			services: planEntries(feWeb, 1, 0, 1),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP)},
		},
		ops: []string{"put 10.96.0.10:80/6#0"},
	}, {
		name: "no endpoints: slot 0 with no backends (connects are refused), nothing else",
		step: planStep{sync: []services.Port{planPort(feWeb, 0)}},
		want: planContents{services: planEntries(feWeb, 1, 0), backends: map[uint32]sockaddrBackendValue{}},
		ops:  []string{"put 10.96.0.10:80/6#0"},
	}, {
		name:   "last endpoint gone: the count drops to 0 before its slot and backend go",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080")}}},
		step:   planStep{sync: []services.Port{planPort(feWeb, 0)}},
		want:   planContents{services: planEntries(feWeb, 1, 0), backends: map[uint32]sockaddrBackendValue{}},
		ops:    []string{"put 10.96.0.10:80/6#0", "delete 10.96.0.10:80/6#1", "delete backend 1"},
	}, {
		name:    "UDP backend gone: reported, so connected sockets to it can be destroyed",
		before:  []planStep{{sync: []services.Port{planPort(feDNS, 0, "10.0.0.5:53", "10.0.0.6:53")}}},
		step:    planStep{sync: []services.Port{planPort(feDNS, 0, "10.0.0.6:53")}},
		want:    planContents{services: planEntries(feDNS, 1, 0, 2), backends: map[uint32]sockaddrBackendValue{2: planBackendVal("10.0.0.6:53", ipUDP)}},
		ops:     []string{"put 10.96.0.53:53/17#1", "put 10.96.0.53:53/17#0", "delete 10.96.0.53:53/17#2", "delete backend 1"},
		goneUDP: []string{"10.0.0.5:53"},
	}, {
		name: "the same address and port under TCP and UDP are two backends",
		step: planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:53"), planPort(planFrontend("10.96.0.10", 80, ipUDP), 0, "10.0.0.2:53")}},
		want: planContents{
			services: mergeMaps(planEntries(feWeb, 1, 0, 1), planEntries(planFrontend("10.96.0.10", 80, ipUDP), 2, 0, 2)),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:53", ipTCP), 2: planBackendVal("10.0.0.2:53", ipUDP)},
		},
		ops: []string{"put backend 1", "put backend 2", "put 10.96.0.10:80/6#1", "put 10.96.0.10:80/17#1",
			"put 10.96.0.10:80/6#0", "put 10.96.0.10:80/17#0"},
	}, {
		name: "partial update: the upserted and removed ports only, the other port untouched",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080"), planPort(feAPI, 0, "10.0.0.7:8443"),
			planPort(feDNS, 0, "10.0.0.5:53")}}},
		step: planStep{update: true, upsert: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080")},
			remove: []services.Frontend{feDNS}},
		want: planContents{
			services: mergeMaps(planEntries(feWeb, 1, 0, 1, 4), planEntries(feAPI, 2, 0, 2)),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP), 2: planBackendVal("10.0.0.7:8443", ipTCP),
				4: planBackendVal("10.0.0.3:8080", ipTCP)},
		},
		ops: []string{"put backend 4", "put 10.96.0.10:80/6#2", "put 10.96.0.10:80/6#0",
			"delete 10.96.0.53:53/17#0", "delete 10.96.0.53:53/17#1", "delete backend 3"},
		goneUDP: []string{"10.0.0.5:53"},
	}, {
		name:   "partial update of a new port: ids after every id handed out before",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080")}}, {sync: nil}},
		step:   planStep{update: true, upsert: []services.Port{planPort(feAPI, 0, "10.0.0.7:8443")}},
		want: planContents{
			services: planEntries(feAPI, 2, 0, 2),
			backends: map[uint32]sockaddrBackendValue{2: planBackendVal("10.0.0.7:8443", ipTCP)},
		},
		ops: []string{"put backend 2", "put 10.96.0.11:443/6#1", "put 10.96.0.11:443/6#0"},
	}, {
		name:   "removing a port that is not there writes nothing",
		before: []planStep{{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080")}}},
		step:   planStep{update: true, remove: []services.Frontend{feAPI}},
		want:   planContents{services: planEntries(feWeb, 1, 0, 1), backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP)}},
	}} {
		t.Run(c.name, func(t *testing.T) {
			table := newServiceTable()
			m := newFakeServiceMaps()
			for _, s := range c.before {
				applyPlan(t, &table, m, s)
			}
			if t.Failed() {
				t.Fatal("setting up failed")
			}
			ops, w := applyPlan(t, &table, m, c.step)
			if !maps.Equal(m.services, c.want.services) {
				t.Errorf("shunt_services:\n%s\nwant:\n%s", serviceEntriesText(m.services), serviceEntriesText(c.want.services))
			}
			if !maps.Equal(m.backends, c.want.backends) {
				t.Errorf("shunt_backends %v, want %v", m.backends, c.want.backends)
			}
			if got := sortDeleteRuns(ops); !slices.Equal(got, c.ops) {
				t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(c.ops, "\n  "))
			}
			var gone []string
			for _, a := range w.goneUDP {
				gone = append(gone, a.String())
			}
			if !slices.Equal(gone, c.goneUDP) {
				t.Errorf("gone UDP backends %v, want %v", gone, c.goneUDP)
			}
			checkMirror(t, &table, m)
		})
	}
}

// sortedDeletes sorts each run of deletes of one kind (slot 0s, slots,
// backends): their order within the run is a map's.
func sortDeleteRuns(ops []string) []string {
	out := slices.Clone(ops)
	kind := func(op string) string {
		switch {
		case !strings.HasPrefix(op, "delete "):
			return ""
		case strings.HasPrefix(op, "delete backend"):
			return "backend"
		case strings.HasSuffix(op, "#0"):
			return "slot 0"
		}
		return "slot"
	}
	for i := 0; i < len(out); {
		j := i + 1
		for j < len(out) && kind(out[i]) != "" && kind(out[j]) == kind(out[i]) {
			j++
		}
		slices.Sort(out[i:j])
		i = j
	}
	return out
}

func serviceEntriesText(m map[sockaddrServiceKey]sockaddrServiceValue) string {
	var lines []string
	for k, v := range m {
		lines = append(lines, fmt.Sprintf("  %s = %+v", serviceSlotText(k), v))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestServicePlanRawEntries: the keys and values are in the byte order the
// BPF programs compare (address and port as on the wire), checked against
// literal numbers rather than the helpers that write them.
func TestServicePlanRawEntries(t *testing.T) {
	table := newServiceTable()
	m := newFakeServiceMaps()
	applyPlan(t, &table, m, planStep{sync: []services.Port{planPort(feWeb, 10800, "10.0.0.2:8080")}})
	// 10.96.0.10 is the bytes 0a 60 00 0a, port 80 the bytes 00 50, read
	// as little-endian numbers (the objects are bpfel).
	wantServices := map[sockaddrServiceKey]sockaddrServiceValue{
		{Vip: 0x0a00600a, Port: 0x5000, Proto: 6, Slot: 0}: {Id: 1, BackendCount: 1, Flags: 1, AffinityTimeout: 10800},
		{Vip: 0x0a00600a, Port: 0x5000, Proto: 6, Slot: 1}: {Id: 1},
	}
	// 10.0.0.2:8080: 0a 00 00 02, 1f 90.
	wantBackends := map[uint32]sockaddrBackendValue{1: {Ip: 0x0200000a, Port: 0x901f, Proto: 6}}
	if !maps.Equal(m.services, wantServices) || !maps.Equal(m.backends, wantBackends) {
		t.Errorf("shunt_services %+v\nshunt_backends %+v", m.services, m.backends)
	}
}

// TestServicePlanFromCompute: the plan of what services.Ports makes of a
// Service and its EndpointSlices: ready endpoints only, a terminating one
// leaves the table (established connections keep it; new ones do not get
// it) while another is ready; with none ready, the terminating ones still
// serving (as kube-proxy); with none serving, the port stays with no
// backends.
func TestServicePlanFromCompute(t *testing.T) {
	svcObj := parseManifest[*corev1.Service](t, `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports: [{name: http, port: 80, targetPort: 8080}]
`)
	slice := func(conditions ...string) *discoveryv1.EndpointSlice {
		doc := `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
`
		for i, cond := range conditions {
			doc += fmt.Sprintf("- {addresses: [10.0.0.%d], conditions: %s}\n", i+2, cond)
		}
		return parseManifest[*discoveryv1.EndpointSlice](t, doc)
	}
	vip := netip.MustParseAddr("10.96.0.10")
	const ready, terminating, notReady = "{ready: true}", "{ready: false, serving: true, terminating: true}", "{ready: false}"
	const notServing = "{ready: false, serving: false, terminating: true}"

	table := newServiceTable()
	m := newFakeServiceMaps()
	steps := []struct {
		slice *discoveryv1.EndpointSlice
		want  planContents
		ops   []string
	}{{
		slice: slice(ready, ready, terminating),
		want: planContents{services: planEntries(feWeb, 1, 600, 1, 2),
			backends: map[uint32]sockaddrBackendValue{1: planBackendVal("10.0.0.2:8080", ipTCP), 2: planBackendVal("10.0.0.3:8080", ipTCP)}},
		ops: []string{"put backend 1", "put backend 2", "put 10.96.0.10:80/6#1", "put 10.96.0.10:80/6#2", "put 10.96.0.10:80/6#0"},
	}, {
		slice: slice(terminating, ready, terminating),
		want: planContents{services: planEntries(feWeb, 1, 600, 2),
			backends: map[uint32]sockaddrBackendValue{2: planBackendVal("10.0.0.3:8080", ipTCP)}},
		ops: []string{"put 10.96.0.10:80/6#1", "put 10.96.0.10:80/6#0", "delete 10.96.0.10:80/6#2", "delete backend 1"},
	}, {
		slice: slice(terminating, notReady, terminating),
		want: planContents{services: planEntries(feWeb, 1, 600, 3, 4),
			backends: map[uint32]sockaddrBackendValue{3: planBackendVal("10.0.0.2:8080", ipTCP), 4: planBackendVal("10.0.0.4:8080", ipTCP)}},
		ops: []string{"put backend 3", "put backend 4", "put 10.96.0.10:80/6#1", "put 10.96.0.10:80/6#2", "put 10.96.0.10:80/6#0", "delete backend 2"},
	}, {
		slice: slice(notServing, notReady, notServing),
		want:  planContents{services: planEntries(feWeb, 1, 600), backends: map[uint32]sockaddrBackendValue{}},
		ops:   []string{"put 10.96.0.10:80/6#0", "delete 10.96.0.10:80/6#1", "delete 10.96.0.10:80/6#2", "delete backend 3", "delete backend 4"},
	}, {
		slice: slice(ready, notReady, ready),
		want: planContents{services: planEntries(feWeb, 1, 600, 5, 6),
			backends: map[uint32]sockaddrBackendValue{5: planBackendVal("10.0.0.2:8080", ipTCP), 6: planBackendVal("10.0.0.4:8080", ipTCP)}},
		ops: []string{"put backend 5", "put backend 6", "put 10.96.0.10:80/6#1", "put 10.96.0.10:80/6#2", "put 10.96.0.10:80/6#0"},
	}}
	for i, s := range steps {
		desired := services.Ports(svcObj, vip, []*discoveryv1.EndpointSlice{s.slice})
		ops, _ := applyPlan(t, &table, m, planStep{sync: desired})
		if !maps.Equal(m.services, s.want.services) || !maps.Equal(m.backends, s.want.backends) {
			t.Errorf("step %d: shunt_services:\n%s\nshunt_backends %v\nwant:\n%s\n%v", i, serviceEntriesText(m.services), m.backends,
				serviceEntriesText(s.want.services), s.want.backends)
		}
		if got := sortDeleteRuns(ops); !slices.Equal(got, s.ops) {
			t.Errorf("step %d: writes %q, want %q", i, got, s.ops)
		}
		checkMirror(t, &table, m)
	}
}

func parseManifest[T any](t *testing.T, doc string) T {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return objs[0].Obj.(T)
}

// TestServicePlanSlots: the capacity each plan needs is counted before
// anything is planned, and what the maps cannot hold is refused.
func TestServicePlanSlots(t *testing.T) {
	if n, err := syncSlots([]services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080"), planPort(feAPI, 0)}); n != 4 || err != nil {
		t.Errorf("sync slots %d, %v: want 3 + 1", n, err)
	}
	if _, err := syncSlots([]services.Port{planPort(planFrontend("fd00::10", 80, ipTCP), 0)}); err == nil || !strings.Contains(err.Error(), "only IPv4") {
		t.Errorf("IPv6 frontend: %v", err)
	}
	many := planPort(feWeb, 0)
	many.Backends = make([]services.Backend, 0x10000)
	if _, err := syncSlots([]services.Port{many}); err == nil || !strings.Contains(err.Error(), "at most 65535") {
		t.Errorf("65536 backends: %v", err)
	}

	table := newServiceTable()
	m := newFakeServiceMaps()
	applyPlan(t, &table, m, planStep{sync: []services.Port{planPort(feWeb, 0, "10.0.0.2:8080", "10.0.0.3:8080"), planPort(feDNS, 0, "10.0.0.5:53")}})
	if table.slots != 5 {
		t.Fatalf("mirror counts %d slots, want 3 + 2", table.slots)
	}
	// web shrinks to 1 backend (-1), dns goes (-2), api comes with 2 (+3).
	n, err := table.updateSlots([]services.Port{planPort(feWeb, 0, "10.0.0.2:8080"), planPort(feAPI, 0, "10.0.0.7:8443", "10.0.0.8:8443")},
		[]services.Frontend{feDNS, feWeb2})
	if n != 5 || err != nil {
		t.Errorf("update slots %d, %v: want 5 - 1 - 2 + 3 = 5", n, err)
	}
	if table.slots != 5 || len(table.ports) != 2 {
		t.Errorf("counting changed the mirror: %d slots, %d ports", table.slots, len(table.ports))
	}
}
