package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/services"
)

const serviceAffinityFlag = uint16(uplinktcServiceFlagsSERVICE_F_AFFINITY)

// frontendFlags are the flags of a service port's slot 0 that say what
// kind of frontend it is: the uplink program translates external ones
// (lib/nodeport.h), with the Service's forwarding mode when it has one
// (lib/dsr.h dsr_wanted).
func frontendFlags(s services.Port) uint16 {
	var f uint16
	if s.Kind.External() {
		f |= uint16(uplinktcServiceFlagsSERVICE_F_EXTERNAL)
		if s.LocalOnly {
			f |= uint16(uplinktcServiceFlagsSERVICE_F_LOCAL)
		}
		switch s.Forwarding {
		case dpinfo.NodePortSNAT:
			f |= uint16(uplinktcServiceFlagsSERVICE_F_FWD_SNAT)
		case dpinfo.NodePortDSR:
			f |= uint16(uplinktcServiceFlagsSERVICE_F_FWD_DSR)
		}
	}
	return f
}

// forwardingOf is the Service's own forwarding mode a service entry's
// flags carry ("": the node's).
func forwardingOf(flags uint16) dpinfo.NodePortMode {
	switch {
	case flags&uint16(uplinktcServiceFlagsSERVICE_F_FWD_SNAT) != 0:
		return dpinfo.NodePortSNAT
	case flags&uint16(uplinktcServiceFlagsSERVICE_F_FWD_DSR) != 0:
		return dpinfo.NodePortDSR
	}
	return ""
}

// be32 keeps an IPv4 address as the bytes on the wire (network order) in a
// native uint32, which is how the BPF side compares it.
func be32(ip netip.Addr) uint32 {
	b := ip.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func fromBe32(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// be16 converts a port to network order as stored in a native uint16.
func be16(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func fromBe16(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

type backendKey struct {
	ip    netip.Addr
	port  uint16
	proto uint8
}

// written is what the kernel holds for one service port.
type written struct {
	id       uint32         // service id (slot 0)
	affinity uint32         // seconds, 0: none
	flags    uint16         // frontendFlags
	backends []uint32       // backend ids, slot order
	ranges   []netip.Prefix // load balancer source ranges (sourceranges.go)
}

// serviceTable mirrors shunt_services and shunt_backends in memory, so a
// sync compares against it instead of reading 100k entries back from the
// kernel, and writes only the service ports that changed (kube-proxy's
// partial sync). It is loaded from the kernel once (adopting what an
// earlier agent wrote) and again after any failed write.
type serviceTable struct {
	loaded   bool
	ports    map[services.Frontend]written
	backends map[backendKey]uint32
	keys     map[uint32]backendKey // backend id -> its key
	refs     map[uint32]int        // backend id -> slots using it
	svcIDs   map[uint32]bool
	// strayRanges are source range entries of no port, found when the
	// mirror was loaded: the next sync deletes them.
	strayRanges []uplinktcLbSourceRangeKey
	// rangesHeld are the source range entries the kernel holds (strays
	// included), kept in step by each flush, so a sync's peak (new entries
	// are written before stale ones go) is checked before any write.
	rangesHeld map[uplinktcLbSourceRangeKey]bool
	// slots counts the shunt_services entries ports hold (1 + backends
	// each), kept in step so a partial update checks capacity in O(1).
	slots int
	// Next ids to hand out: above every id in use, so allocation is O(1)
	// (ids are 32 bits; they are not worth recycling).
	nextBackend, nextService uint32
}

// newServiceTable is the mirror of empty maps.
func newServiceTable() serviceTable {
	return serviceTable{ports: map[services.Frontend]written{}, backends: map[backendKey]uint32{}, rangesHeld: map[uplinktcLbSourceRangeKey]bool{},
		keys: map[uint32]backendKey{}, refs: map[uint32]int{}, svcIDs: map[uint32]bool{}, nextBackend: 1, nextService: 1}
}

func (d *Datapath) loadServiceTable() error {
	t := &d.services
	*t = newServiceTable()
	var id uint32
	var bv sockaddrBackendValue
	it := d.sockAddr.ShuntBackends.Iterate()
	for it.Next(&id, &bv) {
		k := backendKey{fromBe32(bv.Ip), fromBe16(bv.Port), bv.Proto}
		t.backends[k], t.keys[id] = id, k
		t.refs[id] += 0
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading shunt_backends: %w", err)
	}
	slots := map[sockaddrServiceKey]sockaddrServiceValue{}
	var sk sockaddrServiceKey
	var sv sockaddrServiceValue
	it = d.sockAddr.ShuntServices.Iterate()
	for it.Next(&sk, &sv) {
		slots[sk] = sv
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading shunt_services: %w", err)
	}
	for k, v := range slots {
		if k.Slot != 0 {
			continue
		}
		w := written{id: v.Id, flags: v.Flags &^ serviceAffinityFlag}
		if v.Flags&serviceAffinityFlag != 0 {
			w.affinity = v.AffinityTimeout
		}
		for i := uint16(1); i <= v.BackendCount; i++ {
			sk := k
			sk.Slot = i
			w.backends = append(w.backends, slots[sk].Id)
			t.refs[slots[sk].Id]++
		}
		t.ports[services.Frontend{VIP: fromBe32(k.Vip), Port: fromBe16(k.Port), Proto: k.Proto}] = w
		t.slots += 1 + len(w.backends)
		t.svcIDs[v.Id] = true
	}
	if err := t.loadRanges(d.objs.ShuntLbSourceRanges); err != nil {
		return err
	}
	for id := range t.refs {
		t.nextBackend = max(t.nextBackend, id+1)
	}
	for id := range t.svcIDs {
		t.nextService = max(t.nextService, id+1)
	}
	t.loaded = true
	return nil
}

// SyncServices makes shunt_services and shunt_backends hold exactly the
// desired service ports, writing only what changed. The order of writes
// keeps every service usable throughout: a port's backends first, then its
// backend slots, then its slot 0 (which publishes the new count), then its
// stale slots; removed services go slot 0 first; unused backends last.
// Service and backend ids are kept across syncs and agent restarts, so
// affinity entries stay valid. goneUDP are the UDP backends no service
// uses any more: connected sockets still point at them (DestroyUDPSockets).
func (d *Datapath) SyncServices(desired []services.Port) (goneUDP []netip.AddrPort, err error) {
	if err := d.useServiceTable(); err != nil {
		return nil, err
	}
	defer d.reloadServiceTableOnError(&err)

	// Refuse up front what does not fit, so a full map never leaves a
	// half-written state: existing services keep working.
	slots, err := syncSlots(desired)
	if err != nil {
		return nil, err
	}
	if err := d.checkSlots(slots); err != nil {
		return nil, err
	}
	if err := d.checkMaglevFits(desired, nil, true); err != nil {
		return nil, err
	}
	w := d.services.planSync(desired)
	if err := d.checkRangesFit(w); err != nil {
		return nil, err
	}
	gone, err := d.flushServices(w)
	if err != nil {
		return nil, err
	}
	return gone, d.syncMaglev(desired, nil, true)
}

// syncSlots is the number of shunt_services entries desired needs, or why
// the maps cannot hold it.
func syncSlots(desired []services.Port) (int, error) {
	slots := 0
	for _, s := range desired {
		if err := checkServicePort(s); err != nil {
			return 0, err
		}
		slots += 1 + len(s.Backends)
	}
	return slots, nil
}

// planSync plans the writes that make the maps hold exactly desired, and
// makes the mirror what they will hold. It touches no map: SyncServices
// flushes the plan.
func (t *serviceTable) planSync(desired []services.Port) *serviceWrites {
	want := make(map[services.Frontend]bool, len(desired))
	for _, s := range desired {
		want[s.Frontend] = true
	}
	w := serviceWrites{goneRanges: t.strayRanges}
	t.strayRanges = nil
	for _, s := range desired {
		t.syncServicePort(s, &w)
	}
	for f, wr := range t.ports {
		if !want[f] {
			t.deleteServicePort(f, wr, &w)
		}
	}
	t.collectBackends(nil, &w)
	return &w
}

// UpdateServices writes the given service ports and removes the given
// frontends, leaving every other port alone: what a change to a few of many
// services needs, at a cost that does not grow with the table. The same
// write order as SyncServices applies; a change that does not fit is
// refused before any write. goneUDP as for SyncServices.
func (d *Datapath) UpdateServices(upsert []services.Port, remove []services.Frontend) (goneUDP []netip.AddrPort, err error) {
	if err := d.useServiceTable(); err != nil {
		return nil, err
	}
	defer d.reloadServiceTableOnError(&err)
	slots, err := d.services.updateSlots(upsert, remove)
	if err != nil {
		return nil, err
	}
	if err := d.checkSlots(slots); err != nil {
		return nil, err
	}
	if err := d.checkMaglevFits(upsert, remove, false); err != nil {
		return nil, err
	}
	w := d.services.planUpdate(upsert, remove)
	if err := d.checkRangesFit(w); err != nil {
		return nil, err
	}
	gone, err := d.flushServices(w)
	if err != nil {
		return nil, err
	}
	return gone, d.syncMaglev(upsert, remove, false)
}

// updateSlots is the number of shunt_services entries the table holds
// after the update, or why the maps cannot hold a port of it.
func (t *serviceTable) updateSlots(upsert []services.Port, remove []services.Frontend) (int, error) {
	slots := t.slots
	for _, f := range remove {
		if w, ok := t.ports[f]; ok {
			slots -= 1 + len(w.backends)
		}
	}
	for _, s := range upsert {
		if err := checkServicePort(s); err != nil {
			return 0, err
		}
		if w, ok := t.ports[s.Frontend]; ok {
			slots -= 1 + len(w.backends)
		}
		slots += 1 + len(s.Backends)
	}
	return slots, nil
}

// planUpdate plans the writes of UpdateServices and makes the mirror what
// the maps will hold, touching no map.
func (t *serviceTable) planUpdate(upsert []services.Port, remove []services.Frontend) *serviceWrites {
	w := serviceWrites{goneRanges: t.strayRanges}
	t.strayRanges = nil
	var candidates []uint32 // backends that may have lost their last user
	for _, s := range upsert {
		candidates = append(candidates, t.ports[s.Frontend].backends...)
		t.syncServicePort(s, &w)
	}
	for _, f := range remove {
		if wr, ok := t.ports[f]; ok {
			candidates = append(candidates, wr.backends...)
			t.deleteServicePort(f, wr, &w)
		}
	}
	t.collectBackends(candidates, &w) // nil (nothing replaced or removed): every backend
	return &w
}

// checkSlots refuses a table of slots entries that shunt_services cannot
// hold, before anything is written.
func (d *Datapath) checkSlots(slots int) error {
	return d.checkFits("shunt_services", slots)
}

// flushServices makes the planned writes and reports the UDP backends
// that are gone.
func (d *Datapath) flushServices(w *serviceWrites) ([]netip.AddrPort, error) {
	if err := d.flush(w); err != nil {
		return nil, err
	}
	return w.goneUDP, nil
}

// useServiceTable loads the in-memory mirror if it is not loaded.
func (d *Datapath) useServiceTable() error {
	if d.services.loaded {
		return nil
	}
	return d.loadServiceTable()
}

// reloadServiceTableOnError marks the mirror stale after a failed write:
// it may not match the kernel any more, so the next sync reloads it.
func (d *Datapath) reloadServiceTableOnError(err *error) {
	if *err != nil {
		d.services.loaded = false
	}
}

// checkServicePort refuses what the maps cannot hold.
func checkServicePort(s services.Port) error {
	if !s.VIP.Is4() {
		return fmt.Errorf("service %s: only IPv4 is supported", s.Name)
	}
	if len(s.Backends) > 0xffff {
		return fmt.Errorf("service %s: %d backends, at most 65535", s.Name, len(s.Backends))
	}
	return nil
}

// serviceWrites are the map writes of one sync, grouped so that every
// service stays usable while they are made: new backends, then backend
// slots, then slot 0 of each changed port (which publishes its new count),
// then slot 0 of removed ports (no new lookups), then stale slots, then
// unused backends. Each group is one batch system call when it is large:
// a full load of 10 000 services writes ~120 000 entries.
type serviceWrites struct {
	backendIDs   []uint32
	backendVals  []sockaddrBackendValue
	slotKeys     []sockaddrServiceKey
	slotVals     []sockaddrServiceValue
	masterKeys   []sockaddrServiceKey
	masterVals   []sockaddrServiceValue
	goneMasters  []sockaddrServiceKey
	goneSlots    []sockaddrServiceKey
	goneBackends []uint32
	goneUDP      []netip.AddrPort // addresses of the gone UDP backends
	// Source range entries (sourceranges.go): new ones before slot 0,
	// stale ones after.
	rangeKeys  []uplinktcLbSourceRangeKey
	rangeVals  []uplinktcLbSourceRangeValue
	goneRanges []uplinktcLbSourceRangeKey
}

// serviceMaps is where planned writes go: shunt_services and
// shunt_backends, or a test's copy of them in memory.
type serviceMaps interface {
	putBackends(ids []uint32, vals []sockaddrBackendValue) error
	putServices(keys []sockaddrServiceKey, vals []sockaddrServiceValue) error
	deleteServices(keys []sockaddrServiceKey) error
	deleteBackends(ids []uint32) error
	putRanges(keys []uplinktcLbSourceRangeKey, vals []uplinktcLbSourceRangeValue) error
	deleteRanges(keys []uplinktcLbSourceRangeKey) error
}

// writeTo makes the writes in their order, stopping at the first failure.
func (w *serviceWrites) writeTo(m serviceMaps) error {
	for _, step := range []func() error{
		func() error { return m.putBackends(w.backendIDs, w.backendVals) },
		func() error { return m.putServices(w.slotKeys, w.slotVals) },
		func() error { return m.putRanges(w.rangeKeys, w.rangeVals) },
		func() error { return m.putServices(w.masterKeys, w.masterVals) },
		func() error { return m.deleteServices(w.goneMasters) },
		func() error { return m.deleteRanges(w.goneRanges) },
		func() error { return m.deleteServices(w.goneSlots) },
		func() error { return m.deleteBackends(w.goneBackends) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// kernelServiceMaps are the kernel's shunt_services, shunt_backends and
// shunt_lb_source_ranges.
type kernelServiceMaps struct{ services, backends, ranges *ebpf.Map }

func (k kernelServiceMaps) putBackends(ids []uint32, vals []sockaddrBackendValue) error {
	return putAll(k.backends, ids, vals)
}

func (k kernelServiceMaps) putServices(keys []sockaddrServiceKey, vals []sockaddrServiceValue) error {
	return putAll(k.services, keys, vals)
}

func (k kernelServiceMaps) deleteServices(keys []sockaddrServiceKey) error {
	return deleteAll(k.services, keys)
}

func (k kernelServiceMaps) deleteBackends(ids []uint32) error {
	return deleteAll(k.backends, ids)
}

// flush makes the writes in their order. The mirror was updated while
// they were planned; if a write fails, the caller reloads it.
func (d *Datapath) flush(w *serviceWrites) error {
	return w.writeTo(kernelServiceMaps{services: d.sockAddr.ShuntServices, backends: d.sockAddr.ShuntBackends, ranges: d.objs.ShuntLbSourceRanges})
}

// batchMin is the size from which a batch system call beats one call per
// entry.
const batchMin = 8

func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil {
		return info.Name
	}
	return "map"
}

// putAll writes keys[i] = vals[i].
func putAll[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	if len(keys) >= batchMin {
		_, err := m.BatchUpdate(keys, vals, nil)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			if err != nil {
				return fmt.Errorf("writing %s (max %d entries): %w", mapName(m), m.MaxEntries(), err)
			}
			return nil
		}
	}
	for i := range keys {
		if err := m.Put(keys[i], vals[i]); err != nil {
			return fmt.Errorf("writing %s (max %d entries): %w", mapName(m), m.MaxEntries(), err)
		}
	}
	return nil
}

// deleteAll deletes keys; keys already gone are not an error.
func deleteAll[K any](m *ebpf.Map, keys []K) error {
	for len(keys) >= batchMin {
		n, err := m.BatchDelete(keys, nil)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ebpf.ErrKeyNotExist):
			keys = keys[n+1:] // the kernel stops at the missing key
			continue
		case errors.Is(err, ebpf.ErrNotSupported):
		default:
			return fmt.Errorf("deleting from %s: %w", mapName(m), err)
		}
		break
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from %s: %w", mapName(m), err)
		}
	}
	return nil
}

// collectBackends plans the deletion of backends no service port uses any
// more: among candidates, or all of them when candidates is nil.
func (t *serviceTable) collectBackends(candidates []uint32, w *serviceWrites) {
	if candidates == nil {
		for _, id := range t.backends {
			candidates = append(candidates, id)
		}
	}
	for _, id := range candidates {
		k, known := t.keys[id]
		if !known || t.refs[id] > 0 {
			continue
		}
		w.goneBackends = append(w.goneBackends, id)
		if k.proto == 17 {
			w.goneUDP = append(w.goneUDP, netip.AddrPortFrom(k.ip, k.port))
		}
		delete(t.backends, k)
		delete(t.keys, id)
		delete(t.refs, id)
	}
}

// syncServicePort plans the writes that make one port what s says.
func (t *serviceTable) syncServicePort(s services.Port, w *serviceWrites) {
	f := s.Frontend
	old, exists := t.ports[f]
	ids := make([]uint32, len(s.Backends))
	for i, b := range s.Backends {
		k := backendKey{b.IP, b.Port, s.Proto}
		id, ok := t.backends[k]
		if !ok {
			id = t.nextBackend
			t.nextBackend++
			w.backendIDs = append(w.backendIDs, id)
			w.backendVals = append(w.backendVals, sockaddrBackendValue{Ip: be32(b.IP), Port: be16(b.Port), Proto: s.Proto})
			t.backends[k], t.keys[id] = id, k
			t.refs[id] = 0
		}
		ids[i] = id
	}
	flags := frontendFlags(s)
	if exists && old.affinity == s.AffinityTimeout && old.flags == flags && slices.Equal(old.backends, ids) && slices.Equal(old.ranges, s.SourceRanges) {
		return // unchanged: the common case of a partial sync
	}
	wr := written{id: old.id, affinity: s.AffinityTimeout, flags: flags, backends: ids, ranges: slices.Clone(s.SourceRanges)}
	if !exists {
		wr.id = t.nextService
		t.nextService++
		t.svcIDs[wr.id] = true
	}
	planRanges(old.id, old.ranges, wr.id, wr.ranges, w)
	master := sockaddrServiceKey{Vip: be32(s.VIP), Port: be16(s.Port), Proto: s.Proto}
	for i, id := range ids {
		if i < len(old.backends) && old.backends[i] == id {
			continue
		}
		k := master
		k.Slot = uint16(i + 1)
		w.slotKeys = append(w.slotKeys, k)
		w.slotVals = append(w.slotVals, sockaddrServiceValue{Id: id})
	}
	mv := masterValue(wr)
	w.masterKeys = append(w.masterKeys, master)
	w.masterVals = append(w.masterVals, mv)
	for i := len(ids); i < len(old.backends); i++ {
		k := master
		k.Slot = uint16(i + 1)
		w.goneSlots = append(w.goneSlots, k)
	}
	for _, id := range ids {
		t.refs[id]++
	}
	for _, id := range old.backends {
		t.refs[id]--
	}
	t.slots += len(wr.backends) - len(old.backends)
	if !exists {
		t.slots++
	}
	t.ports[f] = wr
}

// deleteServicePort plans the removal of one port: slot 0 first, so no
// new lookup finds it, then its slots.
func (t *serviceTable) deleteServicePort(f services.Frontend, wr written, w *serviceWrites) {
	master := sockaddrServiceKey{Vip: be32(f.VIP), Port: be16(f.Port), Proto: f.Proto}
	w.goneMasters = append(w.goneMasters, master)
	for slot := 1; slot <= len(wr.backends); slot++ {
		k := master
		k.Slot = uint16(slot)
		w.goneSlots = append(w.goneSlots, k)
	}
	for _, id := range wr.backends {
		t.refs[id]--
	}
	planRanges(wr.id, wr.ranges, 0, nil, w)
	delete(t.svcIDs, wr.id)
	t.slots -= 1 + len(wr.backends)
	delete(t.ports, f)
}

// sockHooks are the socket-layer programs and where they attach.
func (d *Datapath) sockHooks() []struct {
	name string
	prog *ebpf.Program
	at   ebpf.AttachType
} {
	return []struct {
		name string
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{"connect4", d.sockAddr.ShuntConnect4, ebpf.AttachCGroupInet4Connect},
		{"sendmsg4", d.sockAddr.ShuntSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"recvmsg4", d.sockAddr.ShuntRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"getpeername4", d.sockAddr.ShuntGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"connect6", d.sockAddr.ShuntConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg6", d.sockAddr.ShuntSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg6", d.sockAddr.ShuntRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername6", d.sockAddr.ShuntGetpeername6, ebpf.AttachCgroupInet6GetPeername},
		{"sockops", d.sockOps.ShuntSockops, ebpf.AttachCGroupSockOps},
	}
}

// AttachSocketLB attaches the service hooks to a cgroup (the cgroup v2 root,
// so pods and the node's own processes are covered) with pinned links; links
// pinned by an earlier agent are adopted and switched to this agent's programs.
func (d *Datapath) AttachSocketLB(cgroupPath string) error {
	// A cgroup link stays valid as long as its cgroup exists.
	always := func(link.Link) bool { return true }
	for _, h := range d.sockHooks() {
		attach := func() (link.Link, error) {
			l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: h.at, Program: h.prog})
			if err != nil {
				return nil, fmt.Errorf("attaching %s to cgroup %s: %w", h.name, cgroupPath, err)
			}
			return l, nil
		}
		if err := attachPinned(filepath.Join(d.cfg.PinDir, "links", "sock-"+h.name), h.prog, always, attach); err != nil {
			return err
		}
	}
	return nil
}

// ServiceDump is one service port as the kernel's maps hold it.
type ServiceDump struct {
	VIP             netip.Addr
	Port            uint16
	Proto           uint8
	ID              uint32
	AffinityTimeout uint32
	Backends        []BackendDump // in slot order
}

// BackendDump is one backend slot, with the backend's id.
type BackendDump struct {
	ID   uint32
	IP   netip.Addr
	Port uint16
}

// DumpServices decodes shunt_services and shunt_backends.
func (d *Datapath) DumpServices() ([]ServiceDump, error) {
	entries := map[sockaddrServiceKey]sockaddrServiceValue{}
	var k sockaddrServiceKey
	var v sockaddrServiceValue
	it := d.sockAddr.ShuntServices.Iterate()
	for it.Next(&k, &v) {
		entries[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading shunt_services: %w", err)
	}
	var out []ServiceDump
	for k, v := range entries {
		if k.Slot != 0 {
			continue
		}
		s := ServiceDump{VIP: fromBe32(k.Vip), Port: fromBe16(k.Port), Proto: k.Proto, ID: v.Id}
		if v.Flags&serviceAffinityFlag != 0 {
			s.AffinityTimeout = v.AffinityTimeout
		}
		for slot := uint16(1); slot <= v.BackendCount; slot++ {
			sk := k
			sk.Slot = slot
			bd := BackendDump{ID: entries[sk].Id}
			var bv sockaddrBackendValue
			if err := d.sockAddr.ShuntBackends.Lookup(bd.ID, &bv); err == nil {
				bd.IP, bd.Port = fromBe32(bv.Ip), fromBe16(bv.Port)
			}
			s.Backends = append(s.Backends, bd)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].VIP != out[j].VIP {
			return out[i].VIP.Less(out[j].VIP)
		}
		if out[i].Port != out[j].Port {
			return out[i].Port < out[j].Port
		}
		return out[i].Proto < out[j].Proto
	})
	return out, nil
}
