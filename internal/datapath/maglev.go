package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/maglev"
	"github.com/shuntnet/shunt/internal/services"
)

// Maglev tables (bpf/lib/maglev.h): every external service port with
// backends gets a table of Config.MaglevSize slots, computed by
// internal/maglev from cluster-wide data only (the port's name
// "ns/svc:port" as the seed, its backends' addresses), so every node
// computes the same one, and written as a BPF array of backend ids that
// shunt_maglev names for the port's service id. Frontends of one port (a
// NodePort on each node address, a load balancer address) share one
// array. They are written after the service maps: a table names only
// backends that exist, and a slot whose backend went before its table was
// rewritten falls back to a random backend in the datapath.

// maglevTable is one computed table and the array that holds it.
type maglevTable struct {
	key   string // the port's name and its backends: what the table is computed from
	name  string
	table *maglev.Table
	ids   []uint32 // backend id of each of table.Backends
	array *ebpf.Map
	// arrayID0 is the array's kernel id, once arrayID read it.
	arrayID0 uint32
	users    int // shunt_maglev entries pointing at it
}

// maglevEntry is what shunt_maglev holds for one frontend.
type maglevEntry struct {
	serviceID uint32
	table     *maglevTable
}

// maglevState mirrors shunt_maglev.
type maglevState struct {
	loaded     bool
	byKey      map[string]*maglevTable
	byFrontend map[services.Frontend]maglevEntry
	// warnings of the tables, by port name; read by the agent's status
	// while a sync writes them.
	mu       sync.Mutex
	warnings map[string]string
}

// maglevInnerSpec is the template of the tables' arrays, from the objects.
func maglevInnerSpec(spec *ebpf.CollectionSpec) (*ebpf.MapSpec, error) {
	outer, ok := spec.Maps["shunt_maglev"]
	if !ok || outer.InnerMap == nil {
		return nil, errors.New("the uplink object has no shunt_maglev hash of maps: rebuild it (make generate)")
	}
	return outer.InnerMap.Copy(), nil
}

func (d *Datapath) maglevOn() bool { return d.cfg.MaglevSize != 0 && d.cfg.NodePort != nil }

// checkMaglevSize refuses a table size Maglev cannot use.
func checkMaglevSize(m int) error {
	if m == 0 {
		return nil
	}
	if _, _, err := maglev.Compute(nil, m, nil); err != nil {
		return err
	}
	if m > 1<<24 {
		return fmt.Errorf("maglev table size %d: at most %d", m, 1<<24)
	}
	return nil
}

// maglevKey is what a port's table is computed from (its name and its
// backends' addresses) and the backend ids it is written with.
func (t *serviceTable) maglevKey(s services.Port) (key string, names []string) {
	names = make([]string, len(s.Backends))
	ids := make([]string, len(s.Backends))
	for i, b := range s.Backends {
		names[i] = netip.AddrPortFrom(b.IP, b.Port).String()
		ids[i] = fmt.Sprintf("%s#%d", names[i], t.backends[backendKey{b.IP, b.Port, s.Proto}])
	}
	slices.Sort(names)
	slices.Sort(ids)
	return s.Name + "\x00" + strings.Join(ids, ","), names
}

// wantsMaglev says whether a port gets a table: reached from outside,
// with backends, and without ClientIP affinity (which keeps its own
// choice, lib/nodeport.h).
func wantsMaglev(s services.Port) bool {
	return s.Kind.External() && len(s.Backends) > 0 && s.AffinityTimeout == 0
}

// syncMaglev makes shunt_maglev hold the tables of the given ports (all
// of them when full: entries of other frontends are removed) and drops
// the entries of removed frontends. Call it after the service maps were
// written: it reads the service and backend ids from their mirror.
func (d *Datapath) syncMaglev(ports []services.Port, removed []services.Frontend, full bool) error {
	if !d.maglevOn() {
		return nil
	}
	st := &d.maglev
	if !st.loaded || full {
		if err := d.loadMaglev(ports); err != nil {
			return err
		}
	}
	for _, f := range removed {
		if err := d.dropMaglev(f); err != nil {
			return err
		}
	}
	for _, s := range ports {
		if !wantsMaglev(s) {
			if err := d.dropMaglev(s.Frontend); err != nil {
				return err
			}
			continue
		}
		if err := d.putMaglev(s); err != nil {
			return err
		}
	}
	return nil
}

// checkMaglevFits refuses, before anything is written, a change that
// needs more tables than shunt_maglev holds.
func (d *Datapath) checkMaglevFits(ports []services.Port, removed []services.Frontend, full bool) error {
	if !d.maglevOn() {
		return nil
	}
	have := map[services.Frontend]bool{}
	if !full {
		for f := range d.maglev.byFrontend {
			have[f] = true
		}
		for _, f := range removed {
			delete(have, f)
		}
	}
	for _, s := range ports {
		have[s.Frontend] = wantsMaglev(s)
	}
	need := 0
	for _, want := range have {
		if want {
			need++
		}
	}
	return d.checkFits("shunt_maglev", need)
}

// loadMaglev starts a full sync: an agent's first one adopts nothing of
// what an earlier agent wrote (its arrays are rewritten: computing them
// again is what makes them this build's), and entries of frontends not in
// ports are deleted.
func (d *Datapath) loadMaglev(ports []services.Port) error {
	st := &d.maglev
	if st.byKey == nil {
		st.byKey, st.byFrontend = map[string]*maglevTable{}, map[services.Frontend]maglevEntry{}
		st.mu.Lock()
		st.warnings = map[string]string{}
		st.mu.Unlock()
	}
	want := map[uint32]bool{}
	for _, s := range ports {
		if wantsMaglev(s) {
			if w, ok := d.services.ports[s.Frontend]; ok {
				want[w.id] = true
			}
		}
	}
	for f := range st.byFrontend {
		if w, ok := d.services.ports[f]; !ok || !want[w.id] {
			if err := d.dropMaglev(f); err != nil {
				return err
			}
		}
	}
	if !st.loaded {
		var id uint32
		var stale []uint32
		it := d.objs.ShuntMaglev.Iterate()
		var inner uint32
		for it.Next(&id, &inner) {
			if !want[id] {
				stale = append(stale, id)
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("reading shunt_maglev: %w", err)
		}
		for _, id := range stale {
			if err := d.objs.ShuntMaglev.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("deleting from shunt_maglev: %w", err)
			}
		}
	}
	st.loaded = true
	return nil
}

// putMaglev points the port's service id at its table, computing and
// writing the table unless another frontend of the port has it.
func (d *Datapath) putMaglev(s services.Port) error {
	st := &d.maglev
	w, ok := d.services.ports[s.Frontend]
	if !ok {
		return fmt.Errorf("maglev: service %s has no service id", s.Name)
	}
	key, names := d.services.maglevKey(s)
	old, had := st.byFrontend[s.Frontend]
	if had && old.serviceID == w.id && old.table.key == key {
		return nil
	}
	t := st.byKey[key]
	if t == nil {
		var err error
		if t, err = d.newMaglevTable(s, key, names); err != nil {
			return err
		}
		st.byKey[key] = t
	}
	if err := d.objs.ShuntMaglev.Put(w.id, t.array); err != nil {
		if t.users == 0 {
			d.closeMaglevTable(t)
		}
		return fmt.Errorf("writing shunt_maglev (max %d entries): %w", d.objs.ShuntMaglev.MaxEntries(), err)
	}
	t.users++
	if had {
		if old.serviceID != w.id {
			if err := d.objs.ShuntMaglev.Delete(old.serviceID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("deleting from shunt_maglev: %w", err)
			}
		}
		d.unuseMaglevTable(old.table)
	}
	st.byFrontend[s.Frontend] = maglevEntry{serviceID: w.id, table: t}
	return nil
}

// newMaglevTable computes a port's table and writes it into a new array.
func (d *Datapath) newMaglevTable(s services.Port, key string, names []string) (*maglevTable, error) {
	tab, warning, err := maglev.Compute(names, d.cfg.MaglevSize, []byte(s.Name))
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", s.Name, err)
	}
	d.maglev.mu.Lock()
	if warning != "" {
		d.maglev.warnings[s.Name] = warning + " (shuntd --maglev-table-size)"
	} else {
		delete(d.maglev.warnings, s.Name)
	}
	d.maglev.mu.Unlock()
	byName := map[string]uint32{}
	for _, b := range s.Backends {
		id, ok := d.services.backends[backendKey{b.IP, b.Port, s.Proto}]
		if !ok {
			return nil, fmt.Errorf("maglev: backend %s of %s has no backend id", netip.AddrPortFrom(b.IP, b.Port), s.Name)
		}
		byName[netip.AddrPortFrom(b.IP, b.Port).String()] = id
	}
	t := &maglevTable{key: key, name: s.Name, table: tab, ids: make([]uint32, len(tab.Backends))}
	for i, n := range tab.Backends {
		t.ids[i] = byName[n]
	}
	spec := d.maglevInner.Copy()
	spec.MaxEntries = uint32(d.cfg.MaglevSize)
	spec.Name = "shunt_maglev_in"
	array, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("creating the Maglev table of %s (%d slots): %w", s.Name, d.cfg.MaglevSize, err)
	}
	keys := make([]uint32, len(tab.Slots))
	vals := make([]uint32, len(tab.Slots))
	for i, b := range tab.Slots {
		keys[i], vals[i] = uint32(i), t.ids[b]
	}
	if err := putAll(array, keys, vals); err != nil {
		array.Close()
		return nil, fmt.Errorf("writing the Maglev table of %s: %w", s.Name, err)
	}
	t.array = array
	return t, nil
}

// dropMaglev deletes a frontend's entry.
func (d *Datapath) dropMaglev(f services.Frontend) error {
	st := &d.maglev
	e, ok := st.byFrontend[f]
	if !ok {
		return nil
	}
	if err := d.objs.ShuntMaglev.Delete(e.serviceID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting from shunt_maglev: %w", err)
	}
	delete(st.byFrontend, f)
	d.unuseMaglevTable(e.table)
	return nil
}

func (d *Datapath) unuseMaglevTable(t *maglevTable) {
	if t.users--; t.users <= 0 {
		d.closeMaglevTable(t)
	}
}

// closeMaglevTable forgets a table no entry points at; the kernel frees
// its array once the last program run using it ends.
func (d *Datapath) closeMaglevTable(t *maglevTable) {
	if d.maglev.byKey[t.key] == t {
		delete(d.maglev.byKey, t.key)
	}
	still := false
	for _, o := range d.maglev.byKey {
		still = still || o.name == t.name
	}
	if !still {
		d.maglev.mu.Lock()
		delete(d.maglev.warnings, t.name)
		d.maglev.mu.Unlock()
	}
	if t.array != nil {
		t.array.Close()
	}
}

// MaglevWarning says that the table of one service port ("ns/svc:port")
// is below 100 slots per backend (maglev.MinSlotsPerBackend): flows spread
// less evenly over its backends and more of them move when one changes.
type MaglevWarning struct {
	Port    string
	Message string
}

// MaglevWarnings are the warnings of the tables held now, sorted by port.
func (d *Datapath) MaglevWarnings() []MaglevWarning {
	d.maglev.mu.Lock()
	defer d.maglev.mu.Unlock()
	out := make([]MaglevWarning, 0, len(d.maglev.warnings))
	for _, p := range slices.Sorted(maps.Keys(d.maglev.warnings)) {
		out = append(out, MaglevWarning{Port: p, Message: d.maglev.warnings[p]})
	}
	return out
}

// MaglevDump is one frontend's table as the datapath holds it.
type MaglevDump struct {
	Frontend  services.Frontend
	Name      string
	ServiceID uint32
	Size      int
	// Share is each backend's number of slots, by backend address.
	Share map[netip.AddrPort]int
	// Digest is the start of the SHA-256 of the table's backend addresses
	// in slot order: the same on every node that holds the same table,
	// whatever its backend ids.
	Digest string
}

// DumpMaglev reads shunt_maglev and each table from the kernel, naming the
// backends through shunt_backends.
func (d *Datapath) DumpMaglev() ([]MaglevDump, error) {
	names := map[uint32]services.Frontend{}
	for f, w := range d.services.ports {
		names[w.id] = f
	}
	var out []MaglevDump
	var id uint32
	var innerID uint32
	it := d.objs.ShuntMaglev.Iterate()
	for it.Next(&id, &innerID) {
		array, err := ebpf.NewMapFromID(ebpf.MapID(innerID))
		if err != nil {
			continue // replaced meanwhile
		}
		md := MaglevDump{Frontend: names[id], ServiceID: id, Size: int(array.MaxEntries()), Share: map[netip.AddrPort]int{}}
		if e, ok := d.maglev.byFrontend[md.Frontend]; ok {
			md.Name = e.table.name
		}
		var slot, backend uint32
		slots := make([]uint32, md.Size)
		ai := array.Iterate()
		for ai.Next(&slot, &backend) {
			if int(slot) < len(slots) {
				slots[slot] = backend
			}
		}
		err = ai.Err()
		array.Close()
		if err != nil {
			return nil, fmt.Errorf("reading a Maglev table of shunt_maglev: %w", err)
		}
		addrs := map[uint32]netip.AddrPort{}
		h := sha256.New()
		for _, bid := range slots {
			ap, ok := addrs[bid]
			if !ok {
				var bv sockaddrBackendValue
				if err := d.sockAddr.ShuntBackends.Lookup(bid, &bv); err == nil {
					ap = netip.AddrPortFrom(fromBe32(bv.Ip), fromBe16(bv.Port))
				}
				addrs[bid] = ap
			}
			md.Share[ap]++
			fmt.Fprintln(h, ap)
		}
		md.Digest = hex.EncodeToString(h.Sum(nil)[:8])
		out = append(out, md)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading shunt_maglev: %w", err)
	}
	slices.SortFunc(out, func(a, b MaglevDump) int { return int(a.ServiceID) - int(b.ServiceID) })
	return out, nil
}

// maglevRows decodes shunt_maglev for `map dump`: one row per frontend,
// its backends with their slots and share of the table.
func (d *Datapath) maglevRows() ([]Row, error) {
	dumps, err := d.DumpMaglev()
	if err != nil {
		return nil, err
	}
	rows := make([]Row, 0, len(dumps))
	for _, md := range dumps {
		backends := slices.SortedFunc(maps.Keys(md.Share), func(a, b netip.AddrPort) int { return a.Compare(b) })
		shares := make([]string, len(backends))
		for i, b := range backends {
			shares[i] = fmt.Sprintf("%s %d (%.1f%%)", b, md.Share[b], 100*float64(md.Share[b])/float64(md.Size))
		}
		r := Row{"serviceId": md.ServiceID, "slots": md.Size, "backends": strings.Join(shares, ", "), "digest": md.Digest}
		if md.Frontend.VIP.IsValid() {
			r["frontend"] = fmt.Sprintf("%s:%d/%s", md.Frontend.VIP, md.Frontend.Port, dpinfo.ProtoName(md.Frontend.Proto))
		}
		if md.Name != "" {
			r["service"] = md.Name
		}
		rows = append(rows, r)
	}
	return rows, nil
}
