package agent

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

func keysOf(t *testing.T, l *objectLog) string {
	t.Helper()
	stored, err := l.load()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(stored)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key()+"@"+o.Source)
	}
	return strings.Join(keys, " ")
}

// TestObjectLog: small changes append to the journal, deletions included;
// bulk changes rewrite the snapshot; a torn last journal line is ignored.
func TestObjectLog(t *testing.T) {
	dir := t.TempDir()
	l := &objectLog{dir: dir}
	s, err := model.NewStore(parseAll(t, svc("a", "")+svc("b", "")))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.save(s, []string{"Service/default/a", "Service/default/b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.snapshotPath()); !os.IsNotExist(err) {
		t.Error("two changes rewrote the snapshot; they belong in the journal")
	}
	s2, _, err := s.Delete(parseAll(t, svc("a", "")))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.save(s2, []string{"Service/default/a"}); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(t, &objectLog{dir: dir}); got != "Service/default/b@t.yaml#2" {
		t.Errorf("after delete: %s", got)
	}

	// A bulk change: snapshot, empty journal.
	var many strings.Builder
	var changed []string
	for i := 0; i <= bulkChange; i++ {
		many.WriteString(svc(fmt.Sprintf("s%d", i), ""))
		changed = append(changed, fmt.Sprintf("Service/default/s%d", i))
	}
	s3, _, err := s2.Apply(parseAll(t, many.String()))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.save(s3, changed); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.journalPath()); !os.IsNotExist(err) || l.journal != 0 {
		t.Errorf("bulk change left a journal (%d entries)", l.journal)
	}
	if n := len(strings.Fields(keysOf(t, &objectLog{dir: dir}))); n != bulkChange+2 {
		t.Errorf("%d objects after snapshot, want %d", n, bulkChange+2)
	}

	// A crash in the middle of an append leaves a torn line: ignored.
	f, _ := os.OpenFile(l.journalPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	f.WriteString(`{"key":"Service/default/torn","obj`)
	f.Close()
	if n := len(strings.Fields(keysOf(t, &objectLog{dir: dir}))); n != bulkChange+2 {
		t.Errorf("torn journal line changed the objects: %d", n)
	}
}

func parseAll(t *testing.T, doc string) []manifest.Object {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestStateRoundTrip: settings, ClusterIPs of older versions and pods
// survive save/load; an unchanged state is not written again.
func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st := &State{Mode: "redirect", PodCIDR: "10.1.0.0/24", ClusterIPs: map[string]string{"default/a": "10.96.0.2"},
		Pods: map[string]*PodRecord{"default/p": {Name: "p", IP: "10.1.0.2"}}}
	written, err := st.save(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := st.save(dir, written); err != nil || &again[0] != &written[0] {
		t.Errorf("unchanged state written again (%v)", err)
	}
	got, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode != "redirect" || got.ClusterIPs["default/a"] != "10.96.0.2" || got.Pods["default/p"].IP != "10.1.0.2" {
		t.Errorf("state after load: %+v", got)
	}
	if fresh, err := loadState(t.TempDir()); err != nil || len(fresh.Pods) != 0 {
		t.Errorf("empty dir: %+v %v", fresh, err)
	}
}
