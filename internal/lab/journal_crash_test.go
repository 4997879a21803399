package lab

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// crashDir is a directory for the crash tests: in memory when it can be,
// since load fsyncs the journal it cuts and these tests load thousands of
// times.
func crashDir(t *testing.T) string {
	t.Helper()
	if d, err := os.MkdirTemp("/dev/shm", "shunt-journal-test-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return t.TempDir()
}

// stateOf is the objects load returns, in full (sources and content).
func stateOf(l *objectLog) (string, error) {
	stored, err := l.load()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, so := range stored {
		fmt.Fprintf(&b, "%s %s\n", so.Source, so.Object)
	}
	return b.String(), nil
}

func serviceKey(name string) manifest.Key {
	return manifest.Key{Kind: manifest.KindService, Namespace: "default", Name: name}
}

// crashJournal writes a snapshot and then several multi-object batches
// (creations, updates, deletions) through save, and returns the snapshot,
// the journal, where each record ends in it, and the state after each
// number of batches.
func crashJournal(t *testing.T) (snap, journal []byte, ends []int, states []string) {
	t.Helper()
	dir := crashDir(t)
	l := &objectLog{dir: dir}
	store := model.NewStore(parseAll(t, svc("s0", "")+svc("s1", "")))
	if err := l.snapshot(store); err != nil {
		t.Fatal(err)
	}
	type op struct{ put, remove []string }
	batches := []op{
		{put: []string{svc("a", ""), svc("b", ""), svc("c", "")}},
		{put: []string{svc("a", "10.0.0.1"), svc("d", "")}, remove: []string{"b"}},
		{put: []string{svc("e", ""), svc("f", ""), svc("g", ""), svc("h", "")}},
		{put: []string{svc("e", "10.0.0.5"), svc("s0", "10.0.0.9")}, remove: []string{"c", "d"}},
		{put: []string{svc("f", "10.0.0.6"), svc("g", "10.0.0.7"), svc("i", "")}, remove: []string{"s1"}},
	}
	st, err := stateOf(&objectLog{dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	states = append(states, st)
	for _, b := range batches {
		var changes []model.Change
		if len(b.put) > 0 {
			store, changes = store.Put(parseAll(t, strings.Join(b.put, "")))
		}
		var keys []manifest.Key
		for _, c := range changes {
			keys = append(keys, c.Key)
		}
		for _, name := range b.remove {
			keys = append(keys, serviceKey(name))
		}
		store, _ = store.Remove(keys[len(keys)-len(b.remove):])
		if err := l.save(store, keys); err != nil {
			t.Fatal(err)
		}
		if l.rewrite || l.journal == 0 {
			t.Fatal("a small batch rewrote the snapshot; the test wants them in the journal")
		}
		st, err := stateOf(&objectLog{dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if st == states[len(states)-1] {
			t.Fatalf("batch %d changed nothing", len(states))
		}
		states = append(states, st)
		ends = append(ends, int(l.size))
	}
	snap, _ = os.ReadFile(l.snapshotPath())
	journal, _ = os.ReadFile(l.journalPath())
	if len(journal) != ends[len(ends)-1] {
		t.Fatalf("journal of %d bytes, records end at %v", len(journal), ends)
	}
	return snap, journal, ends, states
}

// writeLab puts a snapshot and a journal in a fresh state directory.
func writeLab(t *testing.T, dir string, snap, journal []byte) *objectLog {
	t.Helper()
	l := &objectLog{dir: dir}
	if err := os.WriteFile(l.snapshotPath(), snap, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.journalPath(), journal, 0o600); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestJournalCrashAtEveryByte: a journal cut at any byte (a crash in the
// middle of a write) loads as exactly the batches wholly before the cut,
// never a part of one, and is cut back to them, so that the next append
// follows a whole record.
func TestJournalCrashAtEveryByte(t *testing.T) {
	snap, journal, ends, states := crashJournal(t)
	dir := crashDir(t)
	for cut := 0; cut <= len(journal); cut++ {
		l := writeLab(t, dir, snap, journal[:cut])
		whole := 0
		for whole < len(ends) && ends[whole] <= cut {
			whole++
		}
		got, err := stateOf(l)
		if err != nil {
			t.Fatalf("cut at byte %d: %v", cut, err)
		}
		if got != states[whole] {
			t.Fatalf("cut at byte %d: the state is not that after %d whole batches:\n%s\nwant:\n%s", cut, whole, got, states[whole])
		}
		goodEnd := 0
		if whole > 0 {
			goodEnd = ends[whole-1]
		}
		if fi, _ := os.Stat(l.journalPath()); fi.Size() != int64(goodEnd) {
			t.Fatalf("cut at byte %d: the journal holds %d bytes after load, want %d (the whole records)", cut, fi.Size(), goodEnd)
		}
		if (l.droppedTail != "") != (cut != goodEnd) {
			t.Fatalf("cut at byte %d: droppedTail %q", cut, l.droppedTail)
		}
	}
	t.Logf("%d cuts of a journal of %d batches (%d bytes, records ending at %v) over a snapshot", len(journal)+1, len(ends), len(journal), ends)
}

// TestJournalDamage: a damaged byte in the last record drops that record
// (it may be a write that never finished); in any earlier record it is
// refused, naming the file and the record's offset, since the records after
// it were acknowledged. A damaged snapshot is refused too.
func TestJournalDamage(t *testing.T) {
	snap, journal, ends, states := crashJournal(t)
	dir := crashDir(t)
	for i := range journal {
		rec := 0
		for ends[rec] <= i {
			rec++
		}
		start := 0
		if rec > 0 {
			start = ends[rec-1]
		}
		bad := bytes.Clone(journal)
		bad[i] ^= 0xff
		l := writeLab(t, dir, snap, bad)
		got, err := stateOf(l)
		if rec == len(ends)-1 {
			if err != nil || got != states[rec] {
				t.Fatalf("byte %d of the last record damaged: want the state before it, got %v:\n%s", i, err, got)
			}
			continue
		}
		want := fmt.Sprintf("%s: the record at byte offset %d is damaged", l.journalPath(), start)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "truncate -s") {
			t.Fatalf("byte %d of record %d (at %d) damaged: want an error %q, got %v", i, rec, start, want, err)
		}
	}
	for i := range snap {
		bad := bytes.Clone(snap)
		bad[i] ^= 0xff
		l := writeLab(t, dir, bad, journal)
		_, err := stateOf(l)
		if err == nil || !strings.Contains(err.Error(), l.snapshotPath()+" is damaged at byte offset") {
			t.Fatalf("byte %d of the snapshot damaged: want it refused, got %v", i, err)
		}
	}
	l := writeLab(t, dir, nil, journal)
	if _, err := stateOf(l); err == nil || !strings.Contains(err.Error(), l.snapshotPath()+" is damaged at byte offset 0") {
		t.Fatalf("empty snapshot: want it refused, got %v", err)
	}
	t.Logf("%d journal bytes and %d snapshot bytes damaged one at a time", len(journal), len(snap))
}

// TestJournalOutlivesSnapshot: a crash after the snapshot's rename but
// before the journal's removal leaves the old journal beside the new
// snapshot; its records are in the snapshot and must not be replayed over
// it. A journal whose snapshot is gone is refused.
func TestJournalOutlivesSnapshot(t *testing.T) {
	dir := crashDir(t)
	l := &objectLog{dir: dir}
	store := model.NewStore(parseAll(t, svc("a", "")+svc("b", "")))
	if err := l.save(store, []manifest.Key{serviceKey("a"), serviceKey("b")}); err != nil {
		t.Fatal(err)
	}
	store, _ = store.Put(parseAll(t, svc("c", "")))
	if err := l.save(store, []manifest.Key{serviceKey("c")}); err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(l.journalPath())
	if _, err := os.ReadFile(l.snapshotPath()); !os.IsNotExist(err) {
		t.Fatal("small changes wrote a snapshot")
	}
	withoutSnapshot := writeLab(t, crashDir(t), nil, old)
	os.Remove(withoutSnapshot.snapshotPath())
	if got := keysOf(t, withoutSnapshot); got != "Service/default/a@t.yaml#1 Service/default/b@t.yaml#2 Service/default/c@t.yaml#1" {
		t.Fatalf("journal alone: %s", got)
	}

	store, _ = store.Remove([]manifest.Key{serviceKey("a")})
	if err := l.snapshot(store); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(l.journalPath(), old, 0o600) // the removal was lost
	if got := keysOf(t, &objectLog{dir: dir}); got != "Service/default/b@t.yaml#2 Service/default/c@t.yaml#1" {
		t.Errorf("the old journal was replayed over the newer snapshot: %s", got)
	}
	store, _ = store.Put(parseAll(t, svc("d", "")))
	if err := l.save(store, []manifest.Key{serviceKey("d")}); err != nil {
		t.Fatal(err)
	}
	snap, _ := os.ReadFile(l.snapshotPath())
	journal, _ := os.ReadFile(l.journalPath())
	os.Remove(l.snapshotPath())
	if _, err := (&objectLog{dir: dir}).load(); err == nil || !strings.Contains(err.Error(), "changes are missing") {
		t.Errorf("a journal whose snapshot is gone: %v", err)
	}
	os.WriteFile(l.snapshotPath(), snap, 0o600)
	if got := keysOf(t, &objectLog{dir: dir}); got != "Service/default/b@t.yaml#2 Service/default/c@t.yaml#1 Service/default/d@t.yaml#1" || len(journal) == 0 {
		t.Errorf("after the snapshot and one more batch: %s", got)
	}
}

// TestJournalOldFormat: a lab written by an older version (a bare JSON
// array, one journal line per object) loads, and the next save migrates it.
func TestJournalOldFormat(t *testing.T) {
	dir := crashDir(t)
	l := &objectLog{dir: dir}
	obj := func(name, ip string) string {
		return fmt.Sprintf(`{"key":"Service/default/%s","source":"t.yaml","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"%s","namespace":"default"},"spec":{"clusterIP":"%s","ports":[{"port":80}]}}}`, name, name, ip)
	}
	os.WriteFile(l.snapshotPath(), []byte("["+obj("a", "")+",\n"+obj("b", "")+"]\n"), 0o600)
	os.WriteFile(l.journalPath(), []byte(obj("a", "10.0.0.1")+"\n"+`{"key":"Service/default/b"}`+"\n"+obj("c", "")+"\n"+`{"key":"Service/default/torn","obj`), 0o600)
	before := keysOf(t, l)
	if before != "Service/default/a@t.yaml Service/default/c@t.yaml" || !l.rewrite {
		t.Fatalf("old format: %s (rewrite %v)", before, l.rewrite)
	}
	full, _ := stateOf(l)
	stored, _ := l.load()
	objs, err := decodeObjects(stored)
	if err != nil {
		t.Fatal(err)
	}
	store := model.NewStore(objs)
	store, _ = store.Put(parseAll(t, svc("d", "")))
	if err := l.save(store, []manifest.Key{serviceKey("d")}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.journalPath()); !os.IsNotExist(err) {
		t.Error("the old journal was kept after the migrating snapshot")
	}
	if data, _ := os.ReadFile(l.snapshotPath()); !bytes.HasPrefix(data, []byte(snapshotMagic)) {
		t.Errorf("snapshot not rewritten in the new format: %.60s", data)
	}
	after, _ := stateOf(&objectLog{dir: dir})
	if got := keysOf(t, &objectLog{dir: dir}); got != "Service/default/a@t.yaml Service/default/c@t.yaml Service/default/d@t.yaml#1" || !strings.Contains(after, `"clusterIP":"10.0.0.1"`) {
		t.Errorf("after migration: %s\n%s\nbefore:\n%s", got, after, full)
	}
}

// TestPodRecordsDamaged: pods.json is written atomically, and a truncated
// or garbage one stops the start with an error naming the file and the fix.
func TestPodRecordsDamaged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.json")
	pods := map[string]*PodRecord{"default/a": {Namespace: "default", Name: "a", ContainerID: "c1"}}
	good, err := atomicfile.WriteJSON(path, pods, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := loadPodRecords(path, nil); err != nil || got["default/a"].ContainerID != "c1" {
		t.Fatalf("read back: %v, %v", got, err)
	}
	for _, bad := range [][]byte{nil, good[:len(good)/2], []byte("\x00\x00\x00"), []byte("garbage")} {
		os.WriteFile(path, bad, 0o600)
		if _, _, err := loadPodRecords(path, nil); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "shunt lab down") {
			t.Errorf("pods.json holding %q: want an error naming the file and the fix, got %v", bad, err)
		}
	}
}
