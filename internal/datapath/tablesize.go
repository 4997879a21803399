package datapath

// The connection tables' size (Config.ConntrackMax, shuntd --conntrack-max)
// and what a restart with another size does to the tables already pinned.
//
// The tables are LRU hashes: full, they evict their least recently used
// entry, so their size is how many connections a node keeps at once. The
// objects' built-in 131 072 entries are 65 536 NodePort or masqueraded
// flows (two entries each): half of what kube-proxy gives nf_conntrack at
// least (--conntrack-min 131072, 32 768 per core above that), and a
// fraction of Cilium's 524 288 (--bpf-ct-global-tcp-max). A load balancing
// node needs more; a small node may want less (an LRU hash preallocates
// every entry).
//
// Cilium, when a pinned table's size no longer matches, unpins it and
// starts an empty one ("expect map data loss"): every connection through
// the node breaks. Here the new table takes the old one's entries before
// any new program uses it, and, once the agent's programs replaced the old
// ones everywhere (FinishResize), what the old programs wrote in between.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

const (
	// DefaultConntrackMax is the entries of each connection table when
	// Config.ConntrackMax is 0: the objects' own size.
	DefaultConntrackMax = 131072
	// MinConntrackMax and MaxConntrackMax bound Config.ConntrackMax: below,
	// shunt_ct_new (a quarter) could not hold a burst of handshakes; above,
	// the five tables would preallocate several GiB.
	MinConntrackMax = 4096
	MaxConntrackMax = 1 << 24
)

// connTable is one LRU table sized by ConntrackMax: divisor 1 takes the
// size itself, 4 a quarter of it.
type connTable struct {
	name    string
	divisor uint32
}

// connTables are the tables a node's connections fill. shunt_ct_new, the
// table of connections not assured yet, stays a quarter of shunt_ct as in
// the objects (lib/conntrack.h: a SYN flood churns only it). The NAT
// tables hold two entries per translated flow.
var connTables = []connTable{
	{"shunt_ct", 1}, {"shunt_ct_new", 4},
	{"shunt_nodeport_nat", 1}, {"shunt_masq_nat", 1}, {"shunt_tc_nat", 1},
}

// isConnTable says whether the map of that name is a connection table,
// whose size may change between two starts.
func isConnTable(name string) bool {
	for _, t := range connTables {
		if t.name == name {
			return true
		}
	}
	return false
}

// CheckConntrackMax refuses a size out of bounds (0 is the default),
// saying which are.
func CheckConntrackMax(n int) error {
	if n != 0 && (n < MinConntrackMax || n > MaxConntrackMax) {
		return fmt.Errorf("--conntrack-max %d: give the entries of each connection table, from %d to %d (default %d: %d NodePort or masqueraded flows, two entries each)",
			n, MinConntrackMax, MaxConntrackMax, DefaultConntrackMax, DefaultConntrackMax/2)
	}
	return nil
}

// sizeConnTables gives every object's copy of the connection tables the
// size asked for (each object that uses a table must ask for the same
// size, or adopting its pin would be refused); 0 keeps the objects' own.
func sizeConnTables(specs []*ebpf.CollectionSpec, n int) {
	if n == 0 {
		return
	}
	for _, t := range connTables {
		for _, s := range specs {
			if ms, ok := s.Maps[t.name]; ok {
				ms.MaxEntries = uint32(n) / t.divisor
			}
		}
	}
}

// resizedTable is a connection table pinned at another size, replaced by
// one of the size asked for: old stays open until FinishResize.
type resizedTable struct {
	name     string
	old, new *ebpf.Map
	copied   int // entries the new table took from the old when it was made
}

// resizePinned replaces every connection table pinned under pinDir at a
// size other than its spec's with a new table of that size, holding the
// old one's entries, under the same pin: the objects then load on it. A
// table that shrinks keeps what fits (its LRU evicts the rest). The old
// tables stay open in the result, for FinishResize.
func resizePinned(pinDir string, specs []*ebpf.CollectionSpec) (_ []resizedTable, err error) {
	var out []resizedTable
	defer func() {
		if err != nil {
			closeResized(out)
		}
	}()
	for _, t := range connTables {
		ms := specOf(specs, t.name)
		if ms == nil {
			continue
		}
		pin := filepath.Join(pinDir, t.name)
		old, err := ebpf.LoadPinnedMap(pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("opening pinned %s to check its size: %w", t.name, err)
		}
		if old.MaxEntries() == ms.MaxEntries {
			old.Close()
			continue
		}
		r, err := replacePinned(t.name, pin, old, ms)
		if err != nil {
			old.Close()
			return nil, fmt.Errorf("resizing pinned %s from %d to %d entries: %w; the pinned table is unchanged", t.name, old.MaxEntries(), ms.MaxEntries, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// replacePinned makes a table of spec ms, copies old's entries into it
// and renames it over old's pin (bpffs renames atomically: the pin always
// names one of the two).
func replacePinned(name, pin string, old *ebpf.Map, ms *ebpf.MapSpec) (resizedTable, error) {
	spec := ms.Copy()
	spec.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return resizedTable{}, err
	}
	copied, err := copyEntries(old, m, ebpf.UpdateAny)
	if err == nil {
		tmp := pin + "_resizing" // bpffs refuses names with a dot
		os.Remove(tmp)
		if err = m.Pin(tmp); err == nil {
			if err = os.Rename(tmp, pin); err != nil {
				os.Remove(tmp)
			}
		}
	}
	if err != nil {
		m.Close()
		return resizedTable{}, err
	}
	return resizedTable{name: name, old: old, new: m, copied: copied}, nil
}

// copyEntries writes every entry of from into to with flags, and counts
// those written. An entry to already holds (UpdateNoExist) is not counted.
// A full LRU table takes every write. from is read with walkBytes: in
// batches, through once even while the running programs churn it; a
// key-by-key walk (a kernel without batches) that gives up keeps what it
// copied.
func copyEntries(from, to *ebpf.Map, flags ebpf.MapUpdateFlags) (int, error) {
	n := 0
	err := walkBytes(from, func(key, value []byte) error {
		err := to.Update(key, value, flags)
		switch {
		case err == nil:
			n++
		case flags == ebpf.UpdateNoExist && errors.Is(err, ebpf.ErrKeyExist):
		default:
			return fmt.Errorf("copying an entry: %w", err)
		}
		return nil
	})
	if errors.Is(err, ebpf.ErrIterationAborted) {
		err = nil
	}
	return n, err
}

func specOf(specs []*ebpf.CollectionSpec, name string) *ebpf.MapSpec {
	for _, s := range specs {
		if ms, ok := s.Maps[name]; ok {
			return ms
		}
	}
	return nil
}

func closeResized(rs []resizedTable) {
	for _, r := range rs {
		r.old.Close()
		r.new.Close()
	}
}

// ResizeNotes says, for the log, which connection tables this datapath
// found pinned at another size and how many entries the new ones took.
func (d *Datapath) ResizeNotes() []string {
	var notes []string
	for _, r := range d.resized {
		notes = append(notes, fmt.Sprintf("%s: pinned with %d entries, now %d (--conntrack-max); %d entries carried over",
			r.name, r.old.MaxEntries(), r.new.MaxEntries(), r.copied))
	}
	return notes
}

// FinishResize copies into the resized tables what the previous agent's
// programs wrote to the old ones after Open copied them (connections they
// opened until this agent's programs replaced them), then lets the old
// tables go. Call it once this agent's programs are attached everywhere
// (the agent: after its first sync). An entry the new table already holds
// is newer and kept. One the new programs deleted meanwhile (a connection
// promoted out of shunt_ct_new) comes back from the old table: a stale
// copy that lookups reach only after the live one, and that ages out as
// any. It returns the entries copied, by table.
func (d *Datapath) FinishResize() (map[string]int, error) {
	rs := d.resized
	d.resized = nil
	defer closeResized(rs)
	copied := map[string]int{}
	var errs []error
	for _, r := range rs {
		n, err := copyEntries(r.old, r.new, ebpf.UpdateNoExist)
		copied[r.name] = n
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.name, err))
		}
	}
	return copied, errors.Join(errs...)
}
