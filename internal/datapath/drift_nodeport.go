package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/services"
)

// Drift checks of the maps of traffic from outside: shunt_lb_source_ranges
// (compared with the service mirror's ranges, repaired with the service
// maps: admitting entries before slot 0, removals after) and shunt_maglev
// with its tables (each frontend's entry names the array of its table;
// each array holds the table the Go code computed, slot for slot).

// wantRanges are the source range entries the service mirror calls for.
func (t *serviceTable) wantRanges() map[uplinktcLbSourceRangeKey]uplinktcLbSourceRangeValue {
	out := map[uplinktcLbSourceRangeKey]uplinktcLbSourceRangeValue{}
	for _, w := range t.ports {
		for k, v := range rangeEntries(w.id, w.ranges) {
			out[k] = v
		}
	}
	return out
}

// serviceIDText names a service id by its frontend, as the mirror knows it.
func (t *serviceTable) serviceIDText(id uint32) string {
	for f, w := range t.ports {
		if w.id == id {
			return fmt.Sprintf("service %d (%s)", id, frontendText(f))
		}
	}
	return fmt.Sprintf("service %d", id)
}

func frontendText(f services.Frontend) string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(f.VIP, f.Port), dpinfo.ProtoName(f.Proto))
}

// compareRanges compares shunt_lb_source_ranges with the mirror.
func (d *Datapath) compareRanges(r *DriftReport) (*mapFix[uplinktcLbSourceRangeKey, uplinktcLbSourceRangeValue], error) {
	t := &d.services
	return compareMap(r, "shunt_lb_source_ranges", d.objs.ShuntLbSourceRanges, fromMap(t.wantRanges()),
		func(k uplinktcLbSourceRangeKey) string {
			id, p := rangeOfKey(k)
			return t.serviceIDText(id) + " clients " + p.String()
		},
		func(_ uplinktcLbSourceRangeKey, v uplinktcLbSourceRangeValue) string {
			if v.Allow == 1 {
				return "admit"
			}
			return "refuse"
		})
}

// verifyMaglev compares shunt_maglev (service id -> the array of its
// frontend's table) and every table's array with what the datapath wrote,
// and repairs both: a tampered slot is written again, an entry naming
// another array (or none) is pointed at its table's, one of no frontend
// deleted. Checked counts the outer entries and the slots of each table.
func (d *Datapath) verifyMaglev(r *DriftReport, repair bool) error {
	if !d.maglevOn() {
		return nil
	}
	st := &d.maglev
	if !st.loaded {
		r.Skipped["shunt_maglev"] = "no service sync yet"
		return nil
	}
	const name = "shunt_maglev"
	want := map[uint32]uint32{} // service id -> array id
	tables := map[uint32]*maglevTable{}
	byArray := map[uint32]*maglevTable{}
	for _, e := range st.byFrontend {
		id, err := e.table.arrayID()
		if err != nil {
			return err
		}
		want[e.serviceID], tables[e.serviceID], byArray[id] = id, e.table, e.table
	}
	fix, err := compareMap(r, name, d.objs.ShuntMaglev, fromMap(want), d.services.serviceIDText,
		func(_, array uint32) string {
			if t := byArray[array]; t != nil {
				return fmt.Sprintf("table of %s (array %d)", t.name, array)
			}
			return fmt.Sprintf("array %d", array)
		})
	if err != nil {
		return err
	}
	// Each table once, however many frontends share it.
	seen := map[*maglevTable]bool{}
	var slotFixes []*mapFix[uint32, uint32]
	for _, e := range st.byFrontend {
		t := e.table
		if seen[t] {
			continue
		}
		seen[t] = true
		slots := map[uint32]uint32{}
		for i, b := range t.table.Slots {
			slots[uint32(i)] = t.ids[b]
		}
		diffs, err := diffAgainst(fromMap(slots), func(fn func(uint32, uint32)) error { return readEntries(t.array, fn) })
		if err != nil {
			return err
		}
		r.Checked[name] += len(slots)
		sf := &mapFix[uint32, uint32]{m: t.array, name: name}
		for _, df := range diffs {
			e := DriftEntry{Map: name, Key: fmt.Sprintf("table of %s slot %d", t.name, df.key), Expected: d.backendIDText(df.want)}
			if df.inHave {
				e.Found = d.backendIDText(df.have)
			}
			if df.inWant { // an array holds every slot: nothing to delete
				sf.put, sf.vals = append(sf.put, df.key), append(sf.vals, df.want)
			}
			r.Entries = append(r.Entries, e)
		}
		slotFixes = append(slotFixes, sf)
	}
	if !repair {
		return nil
	}
	// Tables first, then the entries that name them.
	var errs []error
	for _, sf := range slotFixes {
		errs = append(errs, sf.puts(nil))
	}
	for _, id := range fix.put {
		// The outer map takes the array itself (its fd), not its id.
		errs = append(errs, d.objs.ShuntMaglev.Put(id, tables[id].array))
	}
	errs = append(errs, fix.deletes(nil))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("repairing shunt_maglev: %w", err)
	}
	countFix(r, fix)
	for _, sf := range slotFixes {
		countFix(r, sf)
	}
	return nil
}

// backendIDText names a backend id by its address, as the mirror knows it.
func (d *Datapath) backendIDText(id uint32) string {
	if k, ok := d.services.keys[id]; ok {
		return fmt.Sprintf("backend %d (%s)", id, netip.AddrPortFrom(k.ip, k.port))
	}
	return fmt.Sprintf("backend %d", id)
}

// arrayID is the kernel's id of the table's array, what shunt_maglev
// holds for it (read once).
func (t *maglevTable) arrayID() (uint32, error) {
	if t.arrayID0 != 0 {
		return t.arrayID0, nil
	}
	info, err := t.array.Info()
	if err != nil {
		return 0, fmt.Errorf("reading the id of the Maglev table of %s: %w", t.name, err)
	}
	id, ok := info.ID()
	if !ok {
		return 0, fmt.Errorf("reading the id of the Maglev table of %s: the kernel does not report map ids (Linux 4.13 has them)", t.name)
	}
	t.arrayID0 = uint32(id)
	return t.arrayID0, nil
}
