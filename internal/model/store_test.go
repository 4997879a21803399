package model

import (
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/manifest"
)

func parse(t *testing.T, doc string) []manifest.Object {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

const nsShop = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n"

func pod(ns, name, label, cmd string) string {
	return "---\napiVersion: v1\nkind: Pod\nmetadata: {name: " + name + ", namespace: " + ns + ", labels: {app: " + label + "}}\nspec: {containers: [{name: c, command: [" + cmd + "]}]}\n"
}

func actions(changes []Change) string {
	var s []string
	for _, c := range changes {
		s = append(s, c.Key+"="+c.Action)
	}
	return strings.Join(s, " ")
}

func TestApplyCreatesConfiguresAndRefusesWhole(t *testing.T) {
	s, err := NewStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, ch, err := s.Apply(parse(t, nsShop+pod("shop", "a", "xx", "sleep")))
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(ch); got != "Namespace//shop=created Pod/shop/a=created" {
		t.Errorf("changes %s", got)
	}
	// Labels may change; the same object again is unchanged.
	s, ch, err = s.Apply(parse(t, pod("shop", "a", "yy", "sleep")+pod("default", "b", "xx", "sleep")))
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(ch); got != "Pod/shop/a=configured Pod/default/b=created" {
		t.Errorf("changes %s", got)
	}
	created := s.Pods()[0].CreationTimestamp
	s2, ch, _ := s.Apply(parse(t, pod("default", "b", "xx", "sleep")))
	if got := actions(ch); got != "Pod/default/b=unchanged" {
		t.Errorf("changes %s", got)
	}
	if created.IsZero() || !s2.Pods()[0].CreationTimestamp.Equal(&created) {
		t.Errorf("creation timestamp %v, then %v: set once and kept", created, s2.Pods()[0].CreationTimestamp)
	}
	// A spec change and a missing namespace: refused as a whole.
	bad := pod("shop", "a", "yy", "echo") + pod("default", "c", "xx", "sleep") + pod("nowhere", "d", "xx", "sleep")
	if _, _, err := s.Apply(parse(t, bad)); err == nil ||
		!strings.Contains(err.Error(), "Pod shop/a: spec: pod updates may not change the spec") ||
		!strings.Contains(err.Error(), `metadata.namespace: namespace "nowhere" not found`) {
		t.Errorf("error %v", err)
	}
	if n := len(s.Pods()); n != 2 {
		t.Errorf("%d pods after refused apply, want 2 (nothing half-applied)", n)
	}
}

func TestDeleteNamespaceCascades(t *testing.T) {
	s, err := NewStore(parse(t, nsShop+pod("shop", "a", "xx", "sleep")+pod("default", "b", "xx", "sleep")))
	if err != nil {
		t.Fatal(err)
	}
	s2, ch, err := s.Delete(parse(t, nsShop))
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(ch); got != "Namespace//shop=deleted Pod/shop/a=deleted" {
		t.Errorf("changes %s", got)
	}
	if len(s2.Pods()) != 1 || len(s.Pods()) != 2 {
		t.Error("delete must return a new store and leave the old one intact")
	}
	if _, _, err := s2.Delete(parse(t, pod("default", "zz", "xx", "sleep"))); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("deleting a missing pod: %v", err)
	}
	if ns := s2.Namespaces(); len(ns) != 1 || ns[0].Name != "default" {
		t.Errorf("namespaces %v, want the implicit default", ns)
	}
}

// TestSortedObjectsFollowApply: the sorted list an apply derives
// from the previous one equals sorting from scratch.
func TestSortedObjectsFollowApply(t *testing.T) {
	s, err := NewStore(parse(t, nsShop+pod("shop", "m", "a", "x")+pod("default", "b", "a", "x")))
	if err != nil {
		t.Fatal(err)
	}
	s.Objects() // computed: later stores derive theirs
	steps := []string{
		pod("shop", "a", "a", "x") + pod("shop", "z", "a", "x") + pod("default", "a", "a", "x"),
		pod("shop", "m", "b", "x") + pod("default", "c", "a", "x"),
		pod("shop", "b", "a", "x"),
	}
	for i, doc := range steps {
		next, _, err := s.Apply(parse(t, doc))
		if err != nil {
			t.Fatal(err)
		}
		got := next.Objects()
		fresh := &Store{objs: next.objs}
		want := fresh.Objects()
		if len(got) != len(want) {
			t.Fatalf("step %d: %d objects, want %d", i, len(got), len(want))
		}
		for j := range want {
			if got[j].Key() != want[j].Key() || got[j].Obj != want[j].Obj {
				t.Fatalf("step %d: object %d is %s, want %s", i, j, got[j].Key(), want[j].Key())
			}
		}
		s = next
	}
}
