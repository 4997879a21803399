package lab

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
		keys = append(keys, o.Key().String()+"@"+o.Source)
	}
	return strings.Join(keys, " ")
}

// TestObjectLog: small changes append to the journal, deletions included;
// bulk changes rewrite the snapshot; a torn last journal line is ignored.
func TestObjectLog(t *testing.T) {
	dir := t.TempDir()
	l := &objectLog{dir: dir}
	s := model.NewStore(parseAll(t, svc("a", "")+svc("b", "")))
	a := manifest.Key{Kind: "Service", Namespace: "default", Name: "a"}
	if err := l.save(s, []manifest.Key{a, {Kind: "Service", Namespace: "default", Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.snapshotPath()); !os.IsNotExist(err) {
		t.Error("two changes rewrote the snapshot; they belong in the journal")
	}
	s2, _ := s.Remove([]manifest.Key{a})
	if err := l.save(s2, []manifest.Key{a}); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(t, &objectLog{dir: dir}); got != "Service/default/b@t.yaml#2" {
		t.Errorf("after delete: %s", got)
	}

	// A bulk change: snapshot, empty journal.
	var many strings.Builder
	var changed []manifest.Key
	for i := 0; i <= bulkChange; i++ {
		many.WriteString(svc(fmt.Sprintf("s%d", i), ""))
		changed = append(changed, manifest.Key{Kind: "Service", Namespace: "default", Name: fmt.Sprintf("s%d", i)})
	}
	s3, _ := s2.Put(parseAll(t, many.String()))
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

func svc(name, clusterIP string) string {
	return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec: {clusterIP: '" + clusterIP + "', ports: [{port: 80}]}\n"
}
