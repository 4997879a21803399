package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// ServicePort is the desired state of one service port: what a connect to
// VIP:Port/Proto may be translated to.
type ServicePort struct {
	Name            string // "ns/svc:port", for dumps and errors
	VIP             netip.Addr
	Port            uint16
	Proto           uint8  // 6 TCP, 17 UDP
	AffinityTimeout uint32 // seconds; 0: no session affinity
	Backends        []Backend
}

// Backend is one endpoint address of a service port.
type Backend struct {
	IP   netip.Addr
	Port uint16
}

const serviceAffinityFlag = 1 // SERVICE_F_AFFINITY

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

// SyncServices makes shunt_services and shunt_backends hold exactly the
// desired service ports. The order of writes keeps every service usable
// throughout: backends first, then each service's backend slots, then its
// slot 0 (which publishes the new count), then stale slots, services and
// backends are deleted. Service and backend ids are kept across syncs (and
// agent restarts) so affinity entries stay valid.
func (d *Datapath) SyncServices(desired []ServicePort) error {
	svcMap, beMap := d.sock.ShuntServices, d.sock.ShuntBackends

	haveSvc := map[socklbServiceKey]socklbServiceValue{}
	var sk socklbServiceKey
	var sv socklbServiceValue
	it := svcMap.Iterate()
	for it.Next(&sk, &sv) {
		haveSvc[sk] = sv
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading shunt_services: %w", err)
	}
	haveBe := map[uint32]socklbBackendValue{}
	beIDs := map[backendKey]uint32{}
	var id uint32
	var bv socklbBackendValue
	it = beMap.Iterate()
	for it.Next(&id, &bv) {
		haveBe[id] = bv
		beIDs[backendKey{fromBe32(bv.Ip), fromBe16(bv.Port), bv.Proto}] = id
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading shunt_backends: %w", err)
	}

	// Refuse up front what does not fit, so a full map never leaves a
	// half-written state: existing services keep working.
	slots, backends := 0, map[backendKey]bool{}
	for _, s := range desired {
		slots += 1 + len(s.Backends)
		for _, b := range s.Backends {
			backends[backendKey{b.IP, b.Port, s.Proto}] = true
		}
	}
	if max := int(svcMap.MaxEntries()); slots > max {
		return fmt.Errorf("services need %d entries in shunt_services, which holds %d: remove services or endpoints", slots, max)
	}
	if max := int(beMap.MaxEntries()); len(backends) > max {
		return fmt.Errorf("services need %d backends in shunt_backends, which holds %d", len(backends), max)
	}

	// Backends: keep ids, allocate new ones from the lowest free.
	usedIDs := map[uint32]bool{}
	for _, id := range beIDs {
		usedIDs[id] = true
	}
	nextID := uint32(1)
	allocate := func(used map[uint32]bool) uint32 {
		for used[nextID] {
			nextID++
		}
		used[nextID] = true
		return nextID
	}
	wantBe := map[uint32]bool{}
	for _, k := range sortedBackendKeys(backends) {
		id, ok := beIDs[k]
		if !ok {
			id = allocate(usedIDs)
			beIDs[k] = id
			v := socklbBackendValue{Ip: be32(k.ip), Port: be16(k.port), Proto: k.proto}
			if err := beMap.Put(id, v); err != nil {
				return fmt.Errorf("writing shunt_backends: %w", err)
			}
		}
		wantBe[id] = true
	}

	// Services: keep ids of existing ones.
	svcIDs := map[uint32]bool{}
	for k, v := range haveSvc {
		if k.Slot == 0 {
			svcIDs[v.Id] = true
		}
	}
	nextID = 1
	wantSvc := map[socklbServiceKey]bool{}
	for _, s := range desired {
		if !s.VIP.Is4() {
			return fmt.Errorf("service %s: only IPv4 is supported", s.Name)
		}
		if len(s.Backends) > 0xffff {
			return fmt.Errorf("service %s: %d backends, at most 65535", s.Name, len(s.Backends))
		}
		master := socklbServiceKey{Vip: be32(s.VIP), Port: be16(s.Port), Proto: s.Proto}
		val, exists := haveSvc[master]
		if !exists {
			val.Id = allocate(svcIDs)
		}
		// Backend slots first.
		for i, b := range s.Backends {
			k := master
			k.Slot = uint16(i + 1)
			v := socklbServiceValue{Id: beIDs[backendKey{b.IP, b.Port, s.Proto}]}
			wantSvc[k] = true
			if old, ok := haveSvc[k]; ok && old == v {
				continue
			}
			if err := svcMap.Put(k, v); err != nil {
				return fmt.Errorf("writing shunt_services for %s: %w", s.Name, err)
			}
		}
		// Then the entry that publishes them.
		nv := socklbServiceValue{Id: val.Id, BackendCount: uint16(len(s.Backends))}
		if s.AffinityTimeout > 0 {
			nv.Flags, nv.AffinityTimeout = serviceAffinityFlag, s.AffinityTimeout
		}
		wantSvc[master] = true
		if !exists || val != nv {
			if err := svcMap.Put(master, nv); err != nil {
				return fmt.Errorf("writing shunt_services for %s: %w", s.Name, err)
			}
		}
	}
	// Stale service entries: slot 0 first, so a removed service stops
	// being found before its slots go.
	stale := make([]socklbServiceKey, 0)
	for k := range haveSvc {
		if !wantSvc[k] {
			stale = append(stale, k)
		}
	}
	sort.Slice(stale, func(i, j int) bool { return stale[i].Slot < stale[j].Slot })
	for _, k := range stale {
		if err := svcMap.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from shunt_services: %w", err)
		}
	}
	for id := range haveBe {
		if !wantBe[id] {
			if err := beMap.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("deleting from shunt_backends: %w", err)
			}
		}
	}
	return nil
}

func sortedBackendKeys(m map[backendKey]bool) []backendKey {
	keys := make([]backendKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.ip != b.ip {
			return a.ip.Less(b.ip)
		}
		if a.port != b.port {
			return a.port < b.port
		}
		return a.proto < b.proto
	})
	return keys
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
		{"connect4", d.sock.ShuntConnect4, ebpf.AttachCGroupInet4Connect},
		{"sendmsg4", d.sock.ShuntSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"recvmsg4", d.sock.ShuntRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"getpeername4", d.sock.ShuntGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"connect6", d.sock.ShuntConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg6", d.sock.ShuntSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg6", d.sock.ShuntRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername6", d.sock.ShuntGetpeername6, ebpf.AttachCgroupInet6GetPeername},
	}
}

// AttachSocketLB attaches the service hooks to a cgroup (the cgroup v2 root,
// so pods and the node's own processes are covered) with pinned links; links
// pinned by an earlier agent are adopted and switched to this agent's programs.
func (d *Datapath) AttachSocketLB(cgroupPath string) error {
	for _, h := range d.sockHooks() {
		pin := filepath.Join(d.cfg.PinDir, "links", "sock-"+h.name)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			err := l.Update(h.prog)
			l.Close()
			if err != nil {
				return fmt.Errorf("updating %s program: %w", h.name, err)
			}
			continue
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: h.at, Program: h.prog})
		if err != nil {
			return fmt.Errorf("attaching %s to cgroup %s: %w", h.name, cgroupPath, err)
		}
		err = l.Pin(pin)
		l.Close()
		if err != nil {
			return fmt.Errorf("pinning %s link: %w", h.name, err)
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
	entries := map[socklbServiceKey]socklbServiceValue{}
	var k socklbServiceKey
	var v socklbServiceValue
	it := d.sock.ShuntServices.Iterate()
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
			var bv socklbBackendValue
			if err := d.sock.ShuntBackends.Lookup(bd.ID, &bv); err == nil {
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
