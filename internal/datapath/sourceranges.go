package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// Load balancer source ranges (bpf/lib/source_ranges.h): for each
// frontend with loadBalancerSourceRanges, shunt_lb_source_ranges holds
// one entry per range that admits the clients in it and one with the
// frontend's service id alone that every other client matches and that
// refuses them. The entries are written with the service port, in the
// same sync, from the mirror's ranges (written.ranges).

// rangeKeyOf is the trie key of prefix p of service id: 32 bits of id,
// big endian as the trie compares bytes, then p's bits.
func rangeKeyOf(id uint32, p netip.Prefix) uplinktcLbSourceRangeKey {
	var idBytes [4]byte
	binary.BigEndian.PutUint32(idBytes[:], id)
	return uplinktcLbSourceRangeKey{Prefixlen: 32 + uint32(p.Bits()), ServiceId: binary.NativeEndian.Uint32(idBytes[:]), Addr: be32(p.Addr())}
}

func rangeOfKey(k uplinktcLbSourceRangeKey) (id uint32, p netip.Prefix) {
	var idBytes [4]byte
	binary.NativeEndian.PutUint32(idBytes[:], k.ServiceId)
	return binary.BigEndian.Uint32(idBytes[:]), netip.PrefixFrom(fromBe32(k.Addr), int(k.Prefixlen)-32)
}

// rangeEntries are the trie entries of a frontend with id and ranges:
// none without ranges; else the catch-all, refusing (admitting when a
// range is 0.0.0.0/0, whose key it is), and an admitting entry per range.
func rangeEntries(id uint32, ranges []netip.Prefix) map[uplinktcLbSourceRangeKey]uplinktcLbSourceRangeValue {
	if len(ranges) == 0 {
		return nil
	}
	out := map[uplinktcLbSourceRangeKey]uplinktcLbSourceRangeValue{
		rangeKeyOf(id, netip.PrefixFrom(netip.IPv4Unspecified(), 0)): {Allow: 0},
	}
	for _, p := range ranges {
		out[rangeKeyOf(id, p.Masked())] = uplinktcLbSourceRangeValue{Allow: 1}
	}
	return out
}

// planRanges plans the trie writes that take a frontend from (oldID,
// oldRanges) to (id, ranges): new entries before its slot 0 is written,
// stale ones after it (a moment where both admit, never one where
// neither does).
func planRanges(oldID uint32, oldRanges []netip.Prefix, id uint32, ranges []netip.Prefix, w *serviceWrites) {
	if oldID == id && slices.Equal(oldRanges, ranges) {
		return
	}
	want := rangeEntries(id, ranges)
	for k, v := range want {
		w.rangeKeys = append(w.rangeKeys, k)
		w.rangeVals = append(w.rangeVals, v)
	}
	for k := range rangeEntries(oldID, oldRanges) {
		if _, ok := want[k]; !ok {
			w.goneRanges = append(w.goneRanges, k)
		}
	}
}

// loadRanges reads the trie into the mirror's ports (byID: service id ->
// the port's frontend, as loaded) and plans the removal of entries of ids
// no port has.
func (t *serviceTable) loadRanges(m *ebpf.Map) error {
	byID := map[uint32]bool{}
	for _, w := range t.ports {
		byID[w.id] = true
	}
	ranges := map[uint32][]netip.Prefix{}
	var k uplinktcLbSourceRangeKey
	var v uplinktcLbSourceRangeValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		t.rangesHeld[k] = true
		id, p := rangeOfKey(k)
		switch {
		case !byID[id]:
			t.strayRanges = append(t.strayRanges, k)
		case v.Allow == 1:
			ranges[id] = append(ranges[id], p)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading shunt_lb_source_ranges: %w", err)
	}
	for f, w := range t.ports {
		if r := ranges[w.id]; r != nil {
			w.ranges = sortedPrefixes(r)
			t.ports[f] = w
		}
	}
	return nil
}

// sortedPrefixes sorts as services.SourceRanges does, so a mirror loaded
// from the kernel compares equal to the computed ranges.
func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return ps
}

func (k kernelServiceMaps) putRanges(keys []uplinktcLbSourceRangeKey, vals []uplinktcLbSourceRangeValue) error {
	return putAll(k.ranges, keys, vals)
}

func (k kernelServiceMaps) deleteRanges(keys []uplinktcLbSourceRangeKey) error {
	return deleteAll(k.ranges, keys)
}

// checkRangesFit refuses, before any write, a plan whose source range
// entries the trie cannot hold at their peak: the entries it holds and
// the plan's new ones, which are written before the stale ones go. The
// mirror was already planned, so it is reloaded at the next sync (the
// callers' reloadServiceTableOnError), and nothing changed in the kernel.
// A plan that fits is taken as the trie's content once flushed (a failed
// flush reloads the mirror too).
func (d *Datapath) checkRangesFit(w *serviceWrites) error {
	held := d.services.rangesHeld
	peak := len(held)
	for _, k := range w.rangeKeys {
		if !held[k] {
			peak++
		}
	}
	if peak > len(held) {
		if err := d.checkFits("shunt_lb_source_ranges", peak); err != nil {
			return err
		}
	}
	for _, k := range w.rangeKeys {
		held[k] = true
	}
	for _, k := range w.goneRanges {
		delete(held, k)
	}
	return nil
}
