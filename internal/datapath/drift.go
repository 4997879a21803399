package datapath

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// Drift repair: the kernel's copy of a map the agent fully determines is
// compared with the copy the datapath keeps of what it wrote (the desired
// state after the last sync); what differs is rewritten, what should not be
// there is deleted. Syncs compare desired contents with that in-memory copy
// only, so without this an entry removed or altered behind the agent's back
// (bpftool, a bug, an eviction that should not have happened) stayed wrong
// until a restart.
//
// Checked (DriftMaps): shunt_services, shunt_backends,
// shunt_lb_source_ranges, shunt_maglev and its tables (drift_nodeport.go),
// shunt_endpoints,
// shunt_ipcache, shunt_cidr_identities, shunt_policy,
// shunt_identity_endpoints, shunt_netns_pods, shunt_l7_redirect,
// shunt_masq_exclude (with masquerade), shunt_dsr_nodes (with NodePort),
// shunt_accel_config and
// shunt_flow_config. Not checked, because programs write them at run time
// (their content is state, not a decision of the agent): conntrack
// (shunt_ct, shunt_ct_new), NAT (shunt_tc_nat, shunt_masq_nat),
// shunt_affinity, shunt_revnat, the sockhash and its helpers, socket
// storage, proxy origins, counters, flows.
//
// The caller serialises VerifyMaps with the syncs that write these maps
// (the reconciler's runner), so a check never sees half a sync.

// DriftMaps are the maps VerifyMaps compares, in the order it does.
var DriftMaps = []string{
	"shunt_backends", "shunt_services", "shunt_lb_source_ranges", "shunt_maglev",
	"shunt_ipcache", "shunt_cidr_identities", "shunt_policy", "shunt_endpoints", "shunt_identity_endpoints", "shunt_netns_pods",
	"shunt_l7_redirect", "shunt_masq_exclude", "shunt_dsr_nodes", "shunt_accel_config", "shunt_flow_config",
}

// DriftEntry and DriftReport live in dpinfo, which the CLI reads without
// linking the kernel code.
type (
	DriftEntry  = dpinfo.DriftEntry
	DriftReport = dpinfo.DriftReport
)

// driftState is what the datapath wrote to maps that have no mirror of
// their own: the configuration entries, which the agent writes outside the
// reconciler's syncs (guarded by mu), and the L7 redirections.
type driftState struct {
	mu    sync.Mutex
	accel *sockopsAccelConfig // nil: never written by this agent
	flows *podtcFlowConfig
	l7    map[sockaddrL7RedirectKey]sockaddrL7RedirectValue // nil: never synced
}

// setAccel writes v (put) and records it, under the lock a check of the
// configuration entries takes: a check never sees the new value in the
// kernel with the old one on record.
func (s *driftState) setAccel(v sockopsAccelConfig, put func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := put(); err != nil {
		return err
	}
	s.accel = &v
	return nil
}

// setFlows is setAccel for the flow sampling.
func (s *driftState) setFlows(v podtcFlowConfig, put func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := put(); err != nil {
		return err
	}
	s.flows = &v
	return nil
}

// entryDiff is one key whose entry differs: want/have say what the desired
// state and the kernel hold (inWant/inHave: whether they hold it at all).
type entryDiff[K comparable, V comparable] struct {
	key            K
	want, have     V
	inWant, inHave bool
}

// desired is what a map should hold, as the datapath keeps it: n entries,
// each found by lookup and listed by each. The service mirror answers
// without building a map of 100 000 entries per check.
type desired[K comparable, V comparable] struct {
	n      int
	lookup func(K) (V, bool)
	each   func(yield func(K, V) bool)
}

func fromMap[K comparable, V comparable](m map[K]V) desired[K, V] {
	return desired[K, V]{
		n:      len(m),
		lookup: func(k K) (V, bool) { v, ok := m[k]; return v, ok },
		each: func(yield func(K, V) bool) {
			for k, v := range m {
				if !yield(k, v) {
					return
				}
			}
		},
	}
}

// diffAgainst compares what read reports (every entry the kernel holds,
// once per call) with want: keys held with another value or not wanted, as
// they stream by; keys missing only when fewer wanted keys were seen than
// want has, which takes a second read. Pure, so it is tested without a
// kernel.
func diffAgainst[K comparable, V comparable](want desired[K, V], read func(func(K, V)) error) ([]entryDiff[K, V], error) {
	var out []entryDiff[K, V]
	matched := 0
	err := read(func(k K, h V) {
		w, ok := want.lookup(k)
		if !ok {
			out = append(out, entryDiff[K, V]{key: k, have: h, inHave: true})
			return
		}
		matched++
		if w != h {
			out = append(out, entryDiff[K, V]{key: k, want: w, have: h, inWant: true, inHave: true})
		}
	})
	if err != nil || matched == want.n {
		return out, err
	}
	have := map[K]struct{}{}
	if err := read(func(k K, _ V) { have[k] = struct{}{} }); err != nil {
		return nil, err
	}
	want.each(func(k K, w V) bool {
		if _, ok := have[k]; !ok {
			out = append(out, entryDiff[K, V]{key: k, want: w, inWant: true})
		}
		return true
	})
	return out, nil
}

// diffEntries compares two sets of entries: every key missing from have,
// held with another value, or held but not wanted.
func diffEntries[K comparable, V comparable](want, have map[K]V) []entryDiff[K, V] {
	out, _ := diffAgainst(fromMap(want), func(fn func(K, V)) error {
		for k, v := range have {
			fn(k, v)
		}
		return nil
	})
	return out
}

// readEntries calls fn with every entry of m, decoded (walkBytes).
func readEntries[K comparable, V any](m *ebpf.Map, fn func(K, V)) error {
	var k K
	var v V
	kb := unsafe.Slice((*byte)(unsafe.Pointer(&k)), unsafe.Sizeof(k))
	vb := unsafe.Slice((*byte)(unsafe.Pointer(&v)), unsafe.Sizeof(v))
	if len(kb) != int(m.KeySize()) || len(vb) != int(m.ValueSize()) {
		return fmt.Errorf("reading %s: key and value of %d and %d bytes, the map's are %d and %d", mapName(m), len(kb), len(vb), m.KeySize(), m.ValueSize())
	}
	return walkBytes(m, func(key, value []byte) error {
		copy(kb, key)
		copy(vb, value)
		fn(k, v)
		return nil
	})
}

// readBatch is how many entries one batch lookup reads at most.
const readBatch = 4096

// walkBytes calls fn with every entry of m, key and value as bytes, until
// fn fails. It reads in batches where the kernel supports them (hash maps,
// arrays, LPM tries through the generic batch; Linux 5.6), which walk a
// hash table bucket by bucket: a table the running programs change
// meanwhile (a full LRU evicts at every new flow) is still read through
// once. Otherwise it walks key by key, which restarts whenever its
// cursor's key goes and gives up after as many steps as the table has
// entries (ebpf.ErrIterationAborted, wrapped).
func walkBytes(m *ebpf.Map, fn func(key, value []byte) error) error {
	ks, vs := int(m.KeySize()), int(m.ValueSize())
	n := max(min(int(m.MaxEntries()), readBatch), 1)
	keys, keyBytes := byteRows(ks, n)
	values, valueBytes := byteRows(vs, n)
	var cursor ebpf.MapBatchCursor
	for first := true; ; first = false {
		got, err := m.BatchLookup(&cursor, keys, values, nil)
		if first && errors.Is(err, ebpf.ErrNotSupported) {
			break
		}
		for i := range got {
			if ferr := fn(keyBytes[i*ks:(i+1)*ks], valueBytes[i*vs:(i+1)*vs]); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", mapName(m), err)
		}
	}
	key, value := make([]byte, ks), make([]byte, vs)
	it := m.Iterate()
	for it.Next(&key, &value) {
		if err := fn(key, value); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", mapName(m), err)
	}
	return nil
}

// byteRows is a slice of n arrays of size bytes, as BatchLookup wants one
// element per entry, and the same memory as bytes.
func byteRows(size, n int) (any, []byte) {
	rows := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, reflect.TypeFor[byte]())), n, n)
	return rows.Interface(), unsafe.Slice((*byte)(rows.UnsafePointer()), size*n)
}

// mapFix is the repair of one map: the entries to write and to delete.
type mapFix[K comparable, V comparable] struct {
	m    *ebpf.Map
	name string
	put  []K
	vals []V
	del  []K
}

func (f *mapFix[K, V]) puts(keep func(K) bool) error {
	var keys []K
	var vals []V
	for i, k := range f.put {
		if keep == nil || keep(k) {
			keys, vals = append(keys, k), append(vals, f.vals[i])
		}
	}
	return putAll(f.m, keys, vals)
}

func (f *mapFix[K, V]) deletes(keep func(K) bool) error {
	var keys []K
	for _, k := range f.del {
		if keep == nil || keep(k) {
			keys = append(keys, k)
		}
	}
	return deleteAll(f.m, keys)
}

// compareMap reads m, compares it with want, adds what differs to the
// report (show makes key and value readable) and returns the repair.
func compareMap[K comparable, V comparable](r *DriftReport, name string, m *ebpf.Map, want desired[K, V],
	showKey func(K) string, showVal func(K, V) string) (*mapFix[K, V], error) {
	diffs, err := diffAgainst(want, func(fn func(K, V)) error { return readEntries(m, fn) })
	if err != nil {
		return nil, err
	}
	r.Checked[name] = want.n
	fix := &mapFix[K, V]{m: m, name: name}
	slices.SortFunc(diffs, func(a, b entryDiff[K, V]) int { return strings.Compare(showKey(a.key), showKey(b.key)) })
	for _, d := range diffs {
		e := DriftEntry{Map: name, Key: showKey(d.key)}
		if d.inWant {
			e.Expected = showVal(d.key, d.want)
			fix.put, fix.vals = append(fix.put, d.key), append(fix.vals, d.want)
		} else {
			fix.del = append(fix.del, d.key)
		}
		if d.inHave {
			e.Found = showVal(d.key, d.have)
		}
		if d.inWant && d.inHave && e.Expected == e.Found {
			// Bytes the readable form leaves out (padding) differ.
			e.Expected, e.Found = fmt.Sprintf("%s (%+v)", e.Expected, d.want), fmt.Sprintf("%s (%+v)", e.Found, d.have)
		}
		r.Entries = append(r.Entries, e)
	}
	return fix, nil
}

// VerifyMaps compares every map the agent fully determines (DriftMaps)
// with what it last wrote and, with repair, rewrites entries that differ or
// are missing and deletes those that should not exist. A map whose
// in-memory copy is not loaded (no sync yet, or a failed write made it
// stale: the next sync reads the kernel again) is skipped, named in
// Skipped. The caller must not run it concurrently with a sync.
func (d *Datapath) VerifyMaps(repair bool) (DriftReport, error) {
	start := time.Now()
	r := DriftReport{Time: start.UTC(), Checked: map[string]int{}, Repaired: map[string]int{}, Skipped: map[string]string{}}
	var errs []error
	for _, step := range []func(*DriftReport, bool) error{d.verifyServices, d.verifyMaglev, d.verifyPolicy, d.verifyL7, d.verifyMasq, d.verifyDSRNodes, d.verifyConfig} {
		if err := step(&r, repair); err != nil {
			errs = append(errs, err)
		}
	}
	if !repair {
		r.Repaired = nil
	}
	r.Took = time.Since(start)
	return r, errors.Join(errs...)
}

// count records the repair of fix's entries.
func countFix[K comparable, V comparable](r *DriftReport, fix *mapFix[K, V]) {
	if n := len(fix.put) + len(fix.del); n > 0 {
		r.Repaired[fix.name] += n
	}
}

// verifyServices compares shunt_services and shunt_backends with the
// service table's mirror, and repairs in the order syncs write: backends,
// backend slots, slot 0 (which publishes the count); then removals, slot 0
// first.
func (d *Datapath) verifyServices(r *DriftReport, repair bool) error {
	t := &d.services
	if !t.loaded {
		why := "no service sync yet, or the last one failed (the next sync reads the kernel again)"
		r.Skipped["shunt_services"], r.Skipped["shunt_backends"], r.Skipped["shunt_lb_source_ranges"] = why, why, why
		return nil
	}
	// The mirror answers for each entry read: no map of the desired
	// entries is built (at 10 000 services, 210 000 of them).
	wantB := desired[uint32, sockaddrBackendValue]{
		n: len(t.keys),
		lookup: func(id uint32) (sockaddrBackendValue, bool) {
			k, ok := t.keys[id]
			return backendValue(k), ok
		},
		each: func(yield func(uint32, sockaddrBackendValue) bool) {
			for id, k := range t.keys {
				if !yield(id, backendValue(k)) {
					return
				}
			}
		},
	}
	wantS := desired[sockaddrServiceKey, sockaddrServiceValue]{
		n: t.slots,
		lookup: func(k sockaddrServiceKey) (sockaddrServiceValue, bool) {
			w, ok := t.ports[services.Frontend{VIP: fromBe32(k.Vip), Port: fromBe16(k.Port), Proto: k.Proto}]
			switch {
			case !ok || k.Pad != 0 || k.Pad2 != 0 || int(k.Slot) > len(w.backends):
				return sockaddrServiceValue{}, false
			case k.Slot == 0:
				return masterValue(w), true
			}
			return sockaddrServiceValue{Id: w.backends[k.Slot-1]}, true
		},
		each: func(yield func(sockaddrServiceKey, sockaddrServiceValue) bool) {
			for f, w := range t.ports {
				master := sockaddrServiceKey{Vip: be32(f.VIP), Port: be16(f.Port), Proto: f.Proto}
				if !yield(master, masterValue(w)) {
					return
				}
				for i, id := range w.backends {
					k := master
					k.Slot = uint16(i + 1)
					if !yield(k, sockaddrServiceValue{Id: id}) {
						return
					}
				}
			}
		},
	}
	fb, err := compareMap(r, "shunt_backends", d.sockAddr.ShuntBackends, wantB, backendKeyText, backendValueText)
	if err != nil {
		return err
	}
	fs, err := compareMap(r, "shunt_services", d.sockAddr.ShuntServices, wantS, serviceKeyText, serviceValueText)
	if err != nil {
		return err
	}
	fr, err := d.compareRanges(r)
	if err != nil {
		return err
	}
	if !repair {
		return nil
	}
	slot := func(k sockaddrServiceKey) bool { return k.Slot != 0 }
	master := func(k sockaddrServiceKey) bool { return k.Slot == 0 }
	for _, step := range []func() error{
		func() error { return fb.puts(nil) },
		func() error { return fs.puts(slot) },
		// A frontend's source ranges before the slot 0 that publishes
		// it, and removed after it goes (sourceranges.go).
		func() error { return fr.puts(nil) },
		func() error { return fs.puts(master) },
		func() error { return fs.deletes(master) },
		func() error { return fr.deletes(nil) },
		func() error { return fs.deletes(slot) },
		func() error { return fb.deletes(nil) },
	} {
		if err := step(); err != nil {
			// The kernel may not match the mirror now: the next sync
			// reads it again.
			t.loaded = false
			return fmt.Errorf("repairing the service maps: %w", err)
		}
	}
	countFix(r, fb)
	countFix(r, fs)
	countFix(r, fr)
	return nil
}

// backendValue is the shunt_backends value of a backend.
func backendValue(k backendKey) sockaddrBackendValue {
	return sockaddrBackendValue{Ip: be32(k.ip), Port: be16(k.port), Proto: k.proto}
}

// masterValue is the slot 0 value of a service port.
func masterValue(w written) sockaddrServiceValue {
	v := sockaddrServiceValue{Id: w.id, BackendCount: uint16(len(w.backends)), Flags: w.flags}
	if w.affinity > 0 {
		v.Flags, v.AffinityTimeout = v.Flags|serviceAffinityFlag, w.affinity
	}
	return v
}

// verifyMirror compares one mirrored map with its mirror.
func verifyMirror[K comparable, V comparable](r *DriftReport, mm *mirroredMap[K, V], showKey func(K) string, showVal func(K, V) string) (*mapFix[K, V], error) {
	if !mm.loaded {
		r.Skipped[mm.name] = "not written by this agent yet"
		return &mapFix[K, V]{m: mm.m, name: mm.name}, nil
	}
	return compareMap(r, mm.name, mm.m, fromMap(mm.have), showKey, showVal)
}

// verifyPolicy compares the endpoint, ipcache and policy maps with their
// mirrors; repairs write every map's missing entries first, then delete
// what should not be there.
func (d *Datapath) verifyPolicy(r *DriftReport, repair bool) error {
	p := &d.pol
	ip, err := verifyMirror(r, &p.ipcache, prefixKeyText, prefixValueText)
	if err != nil {
		return err
	}
	cidr, err := verifyMirror(r, &p.cidrs, prefixKeyText, prefixValueText)
	if err != nil {
		return err
	}
	pol, err := verifyMirror(r, &p.policy, policyKeyText, policyValueText)
	if err != nil {
		return err
	}
	ep, err := verifyMirror(r, &p.endpoints, func(k podtcEndpointKey) string { return fromBe32(k.Ip4).String() }, endpointValueText)
	if err != nil {
		return err
	}
	id, err := verifyMirror(r, &p.identities, func(k uint32) string { return fmt.Sprintf("identity %d", k) },
		func(_ uint32, v podtcIdentityEndpoint) string {
			return fmt.Sprintf("endpoint %s, flags %s", fromBe32(v.Ip), orDash(flagsText(v.Flags, endpointFlagNames)))
		})
	if err != nil {
		return err
	}
	netns, err := verifyMirror(r, &p.netnsPods, func(k uint64) string { return fmt.Sprintf("netns cookie %d", k) },
		func(_ uint64, v uint32) string { return "pod " + fromBe32(v).String() })
	if err != nil {
		return err
	}
	if !repair {
		return nil
	}
	err = errors.Join(ip.puts(nil), cidr.puts(nil), pol.puts(nil), ep.puts(nil), id.puts(nil), netns.puts(nil))
	if err == nil {
		err = errors.Join(netns.deletes(nil), id.deletes(nil), ep.deletes(nil), pol.deletes(nil), cidr.deletes(nil), ip.deletes(nil))
	}
	if err != nil {
		return fmt.Errorf("repairing the policy maps: %w", err)
	}
	countFix(r, ip)
	countFix(r, cidr)
	countFix(r, pol)
	countFix(r, ep)
	countFix(r, id)
	countFix(r, netns)
	return nil
}

// verifyL7 compares shunt_l7_redirect with the last SyncL7Redirects.
func (d *Datapath) verifyL7(r *DriftReport, repair bool) error {
	want := d.drift.l7
	if want == nil {
		r.Skipped["shunt_l7_redirect"] = "not written by this agent yet"
		return nil
	}
	fix, err := compareMap(r, "shunt_l7_redirect", d.sockAddr.ShuntL7Redirect, fromMap(want),
		func(k sockaddrL7RedirectKey) string {
			return fmt.Sprintf("%s:%d/%s", fromBe32(k.Ip), fromBe16(k.Port), dpinfo.ProtoName(k.Proto))
		},
		func(_ sockaddrL7RedirectKey, v sockaddrL7RedirectValue) string {
			return fmt.Sprintf("proxy %s:%d", fromBe32(v.ProxyIp), fromBe16(v.ProxyPort))
		})
	if err != nil || !repair {
		return err
	}
	if err := errors.Join(fix.puts(nil), fix.deletes(nil)); err != nil {
		return fmt.Errorf("repairing shunt_l7_redirect: %w", err)
	}
	countFix(r, fix)
	return nil
}

// verifyMasq compares shunt_masq_exclude with its mirror (with masquerade).
func (d *Datapath) verifyMasq(r *DriftReport, repair bool) error {
	if d.cfg.Masquerade == nil {
		return nil
	}
	fix, err := verifyMirror(r, &d.masqExclude, prefixKeyText, func(podtcIpcacheKey, uplinktcMasqExcludeValue) string { return "excluded" })
	if err != nil || !repair {
		return err
	}
	if err := errors.Join(fix.puts(nil), fix.deletes(nil)); err != nil {
		return fmt.Errorf("repairing shunt_masq_exclude: %w", err)
	}
	countFix(r, fix)
	return nil
}

// verifyConfig compares the configuration entries (socket acceleration,
// flow sampling) with what SetAccel and SetFlowMode wrote last.
func (d *Datapath) verifyConfig(r *DriftReport, repair bool) error {
	s := &d.drift
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.accel != nil {
		fix, err := compareMap(r, "shunt_accel_config", d.sockOps.ShuntAccelConfig, fromMap(map[uint32]sockopsAccelConfig{0: *s.accel}),
			func(uint32) string { return "0" },
			func(_ uint32, v sockopsAccelConfig) string {
				return fmt.Sprintf("enabled %t, node processes %t, node netns cookie %d", v.Enabled != 0, v.NodeProcesses != 0, v.HostNetnsCookie)
			})
		if err == nil && repair {
			fix.del = nil // an array's entries always exist
			if err = fix.puts(nil); err == nil {
				countFix(r, fix)
			}
		}
		errs = append(errs, err)
	} else {
		r.Skipped["shunt_accel_config"] = "not written by this agent yet"
	}
	if s.flows != nil {
		fix, err := compareMap(r, "shunt_flow_config", d.objs.ShuntFlowConfig, fromMap(map[uint32]podtcFlowConfig{0: *s.flows}),
			func(uint32) string { return "0" },
			func(_ uint32, v podtcFlowConfig) string { return "sampling " + FlowMode(v.Mode).String() })
		if err == nil && repair {
			fix.del = nil
			if err = fix.puts(nil); err == nil {
				countFix(r, fix)
			}
		}
		errs = append(errs, err)
	} else {
		r.Skipped["shunt_flow_config"] = "not written by this agent yet"
	}
	return errors.Join(errs...)
}

// Readable keys and values, as `shunt map dump` shows them.

func serviceKeyText(k sockaddrServiceKey) string {
	return fmt.Sprintf("%s:%d/%s slot %d", fromBe32(k.Vip), fromBe16(k.Port), dpinfo.ProtoName(k.Proto), k.Slot)
}

func serviceValueText(k sockaddrServiceKey, v sockaddrServiceValue) string {
	if k.Slot != 0 {
		s := fmt.Sprintf("backend %d", v.Id)
		if v.BackendCount != 0 || v.Flags != 0 || v.AffinityTimeout != 0 {
			s += fmt.Sprintf(" (service fields %d backends, flags %#x, affinity %ds)", v.BackendCount, v.Flags, v.AffinityTimeout)
		}
		return s
	}
	s := fmt.Sprintf("service %d, %d backends", v.Id, v.BackendCount)
	if v.Flags&serviceAffinityFlag != 0 {
		s += fmt.Sprintf(", affinity %ds", v.AffinityTimeout)
	}
	return s
}

func backendKeyText(id uint32) string { return fmt.Sprintf("backend %d", id) }

func backendValueText(_ uint32, v sockaddrBackendValue) string {
	return fmt.Sprintf("%s:%d/%s", fromBe32(v.Ip), fromBe16(v.Port), dpinfo.ProtoName(v.Proto))
}

func prefixKeyText(k podtcIpcacheKey) string { return fromIpcacheKey(k).String() }

func prefixValueText(_ podtcIpcacheKey, v podtcIpcacheValue) string {
	s := fmt.Sprintf("identity %d", v.Identity)
	if v.TunnelIp4 != 0 {
		s += ", tunnel " + fromBe32(v.TunnelIp4).String()
	}
	return s
}

func policyKeyText(k podtcPolicyKey) string {
	pk := fromPolicyKey(k)
	dir := "ingress from"
	if pk.Egress {
		dir = "egress to"
	}
	return fmt.Sprintf("%s %s identity %d %s", pk.Endpoint, dir, pk.Identity, PortsText(pk))
}

func policyValueText(_ podtcPolicyKey, v podtcPolicyValue) string {
	s := fmt.Sprintf("%s (rule %d)", policy.Verdict(v.Verdict), v.RuleId)
	if v.ProxyPort != 0 {
		s += fmt.Sprintf(", proxy port %d", fromBe16(v.ProxyPort))
	}
	return s
}

func endpointValueText(_ podtcEndpointKey, v podtcEndpointInfo) string {
	return fmt.Sprintf("ifindex %d, identity %d, flags %s, pod MAC %s, node MAC %s, netns cookie %d", v.Ifindex, v.Identity,
		orDash(flagsText(v.Flags, endpointFlagNames)), macText(v.PodMac[:]), macText(v.NodeMac[:]), v.NetnsCookie)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
