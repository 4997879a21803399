package datapath

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// TestConntrackMaxResizesPinnedTables: a restart with another
// --conntrack-max replaces the pinned connection tables with ones of the
// new size that hold every entry of the old (shrinking and growing), and
// FinishResize then carries over what the old programs wrote after Open
// without overwriting what the new ones wrote; a restart at the same size
// replaces nothing.
func TestConntrackMaxResizesPinnedTables(t *testing.T) {
	requireBPF(t)
	pinDir := testPinDir(t)
	open := func(max int) *Datapath {
		t.Helper()
		d, err := Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, ConntrackMax: max}))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// The pod programs' object pins every connection table but the
	// masquerade's (the uplink's object, loaded only with masquerade).
	tables := []string{"shunt_ct", "shunt_ct_new", "shunt_nodeport_nat", "shunt_tc_nat"}
	entryOf := func(m *ebpf.Map, i uint32) (key, value []byte) {
		key, value = make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		binary.LittleEndian.PutUint32(key, i)
		binary.LittleEndian.PutUint32(value, i^0x5a5a5a5a)
		return key, value
	}
	pinned := func(name string) *ebpf.Map {
		t.Helper()
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	const first = 1000
	d := open(0)
	for _, name := range tables {
		m := pinned(name)
		if want := sizeOf(name, DefaultConntrackMax); m.MaxEntries() != want {
			t.Errorf("%s has %d entries by default, want %d", name, m.MaxEntries(), want)
		}
		for i := range uint32(first) {
			k, v := entryOf(m, i)
			if err := m.Put(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	d.Close()

	// The previous agent's programs keep the old tables: so does the test.
	old := map[string]*ebpf.Map{}
	for _, name := range tables {
		old[name] = pinned(name)
	}
	d = open(8192)
	if notes := d.ResizeNotes(); len(notes) != len(tables) {
		t.Errorf("resize notes %q: want one per table of %v", notes, tables)
	}
	for _, name := range tables {
		m := pinned(name)
		if want := sizeOf(name, 8192); m.MaxEntries() != want {
			t.Errorf("%s pinned with %d entries after --conntrack-max 8192, want %d", name, m.MaxEntries(), want)
		}
		checkEntries(t, m, name, 0, first, entryOf)
		// Written by the old programs after Open: carried over by
		// FinishResize. Entry 0, rewritten by the new programs, stays theirs.
		for i := uint32(first); i < first+10; i++ {
			k, v := entryOf(old[name], i)
			if err := old[name].Put(k, v); err != nil {
				t.Fatal(err)
			}
		}
		k, _ := entryOf(m, 0)
		if err := m.Put(k, bytes.Repeat([]byte{7}, int(m.ValueSize()))); err != nil {
			t.Fatal(err)
		}
	}
	copied, err := d.FinishResize()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range tables {
		if copied[name] != 10 {
			t.Errorf("FinishResize copied %d entries of %s, want the 10 the old programs wrote", copied[name], name)
		}
		m := pinned(name)
		checkEntries(t, m, name, 1, first+10, entryOf)
		k, _ := entryOf(m, 0)
		if v, err := m.LookupBytes(k); err != nil || !bytes.Equal(v, bytes.Repeat([]byte{7}, int(m.ValueSize()))) {
			t.Errorf("%s: the new programs' entry 0 was overwritten by the old table's (%x, %v)", name, v, err)
		}
	}
	d.Close()
	if _, err := os.Stat(filepath.Join(pinDir, "shunt_ct_resizing")); !os.IsNotExist(err) {
		t.Errorf("the temporary pin is left: %v", err)
	}

	d = open(0) // back to the default: the tables grow again
	for _, name := range tables {
		checkEntries(t, pinned(name), name, 1, first+10, entryOf)
	}
	d.Close()
	d = open(DefaultConntrackMax) // the same size, said explicitly
	if notes := d.ResizeNotes(); len(notes) != 0 {
		t.Errorf("a restart at the same size resized %q", notes)
	}
	d.Close()
}

// sizeOf is the entries of connection table name at --conntrack-max max.
func sizeOf(name string, max uint32) uint32 {
	for _, t := range connTables {
		if t.name == name {
			return max / t.divisor
		}
	}
	return 0
}

func checkEntries(t *testing.T, m *ebpf.Map, name string, from, to uint32, entryOf func(*ebpf.Map, uint32) ([]byte, []byte)) {
	t.Helper()
	missing := 0
	for i := from; i < to; i++ {
		k, want := entryOf(m, i)
		if got, err := m.LookupBytes(k); err != nil || !bytes.Equal(got, want) {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%s: %d of entries %d-%d missing or changed", name, missing, from, to-1)
	}
}

// TestConntrackMaxRefusesOutOfBounds: a size the tables cannot take is
// refused before anything is loaded or pinned, with the bounds.
func TestConntrackMaxRefusesOutOfBounds(t *testing.T) {
	requireBPF(t)
	pinDir := testPinDir(t)
	for _, n := range []int{100, -1, MaxConntrackMax + 1} {
		_, err := Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer, ConntrackMax: n}))
		if err == nil || !strings.Contains(err.Error(), "--conntrack-max") || !strings.Contains(err.Error(), "4096") {
			t.Errorf("ConntrackMax %d: %v; want a refusal naming --conntrack-max and its bounds", n, err)
		}
	}
	if entries, _ := os.ReadDir(pinDir); len(entries) != 0 {
		t.Errorf("a refused size left pins: %v", entries)
	}
}

// TestCopyEntriesWhileTheTableChurns: a resize reads a table the running
// programs keep changing; a full LRU evicts an entry at every new flow.
// The copy reads it through once (batches walk it bucket by bucket) where
// a key-by-key walk restarts at each evicted cursor and may give up,
// which would stop the agent from starting.
func TestCopyEntriesWhileTheTableChurns(t *testing.T) {
	requireBPF(t)
	const size = 8192
	spec := &ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 16, ValueSize: 24, MaxEntries: size}
	from, err := ebpf.NewMap(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer from.Close()
	to, err := ebpf.NewMap(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer to.Close()
	key, value := make([]byte, 16), make([]byte, 24)
	put := func(i uint64) error {
		binary.LittleEndian.PutUint64(key, i)
		return from.Put(key, value)
	}
	for i := range uint64(size) {
		if err := put(i); err != nil {
			t.Fatal(err)
		}
	}
	stop, done := make(chan struct{}), make(chan uint64)
	go func() {
		i := uint64(size)
		for ; ; i++ {
			select {
			case <-stop:
				done <- i - size
				return
			default:
			}
			if put(i) != nil {
				done <- 0
				return
			}
		}
	}()
	var copied int
	for range 5 {
		n, err := copyEntries(from, to, ebpf.UpdateAny)
		if err != nil {
			close(stop)
			<-done
			t.Fatalf("copying a table that churns: %v", err)
		}
		copied = n
	}
	close(stop)
	churned := <-done
	if copied < size/2 {
		t.Errorf("copied %d of %d entries while %d new ones churned the table: want most of them", copied, size, churned)
	}
	t.Logf("last copy took %d of %d entries while %d new entries went in", copied, size, churned)
}
