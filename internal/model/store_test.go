package model

import (
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

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

func service(ns, name string) string {
	return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec: {ports: [{port: 80}]}\n"
}

func slice(ns, name, svc string) string {
	return "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: " + name + ", namespace: " + ns +
		", labels: {kubernetes.io/service-name: " + svc + "}}\naddressType: IPv4\nendpoints: []\n"
}

func sliceNames(slices []*discoveryv1.EndpointSlice) string {
	var names []string
	for _, s := range slices {
		names = append(names, s.Name)
	}
	return strings.Join(names, ",")
}

// TestStoresShareStructure: a change returns a new store and leaves the old
// one as it was; the by-service slice index follows relabels and deletes;
// cascades stay within their namespace ("shop", not "shop2").
func TestStoresShareStructure(t *testing.T) {
	base := nsShop + "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: shop2}\n" +
		service("shop", "a") + service("shop", "b") + service("shop2", "a") +
		slice("shop", "a-1", "a") + slice("shop", "a-2", "a") + slice("shop2", "a-1", "a") + pod("shop", "p", "x", "sleep")
	s, err := NewStore(parse(t, base))
	if err != nil {
		t.Fatal(err)
	}
	if got := sliceNames(s.EndpointSlicesFor("shop", "a")); got != "a-1,a-2" {
		t.Errorf("slices of shop/a: %s", got)
	}
	// a-2 moves to service b.
	s2, _, err := s.Apply(parse(t, slice("shop", "a-2", "b")))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := sliceNames(s2.EndpointSlicesFor("shop", "a")), sliceNames(s2.EndpointSlicesFor("shop", "b")); a != "a-1" || b != "a-2" {
		t.Errorf("after relabel: a has %q, b has %q", a, b)
	}
	if got := sliceNames(s.EndpointSlicesFor("shop", "a")); got != "a-1,a-2" {
		t.Errorf("the old store changed: %s", got)
	}
	// Deleting service b takes its slice, not a's.
	s3, ch, err := s2.Delete(parse(t, service("shop", "b")))
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(ch); got != "Service/shop/b=deleted EndpointSlice/shop/a-2=deleted" {
		t.Errorf("changes %s", got)
	}
	// Deleting namespace shop takes everything in it and nothing of shop2.
	s4, ch, err := s3.Delete(parse(t, nsShop))
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(ch); got != "Namespace//shop=deleted EndpointSlice/shop/a-1=deleted Pod/shop/p=deleted Service/shop/a=deleted" {
		t.Errorf("changes %s", got)
	}
	var keys []string
	for _, o := range s4.Objects() {
		keys = append(keys, o.Key())
	}
	if got := strings.Join(keys, " "); got != "EndpointSlice/shop2/a-1 Namespace//shop2 Service/shop2/a" {
		t.Errorf("left %s", got)
	}
	if len(s.Objects()) != 9 || len(s.ServicesIn("shop")) != 2 || s4.Len() != 3 {
		t.Errorf("the first store has %d objects, %d services in shop; the last %d objects", len(s.Objects()), len(s.ServicesIn("shop")), s4.Len())
	}
}
