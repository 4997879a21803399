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
		s = append(s, c.Key.String()+"="+string(c.Action))
	}
	return strings.Join(s, " ")
}

// TestPutAndRemove: the store stores what it is given and says what
// changed; equal objects are unchanged; removing a missing key is no change.
func TestPutAndRemove(t *testing.T) {
	s, ch := New().Put(parse(t, nsShop+pod("shop", "a", "xx", "sleep")))
	if got := actions(ch); got != "Namespace//shop=created Pod/shop/a=created" {
		t.Errorf("changes %s", got)
	}
	s, ch = s.Put(parse(t, pod("shop", "a", "yy", "sleep")+pod("default", "b", "xx", "sleep")))
	if got := actions(ch); got != "Pod/shop/a=configured Pod/default/b=created" {
		t.Errorf("changes %s", got)
	}
	s2, ch := s.Put(parse(t, pod("default", "b", "xx", "sleep")))
	if got := actions(ch); got != "Pod/default/b=unchanged" {
		t.Errorf("changes %s", got)
	}
	s3, ch := s2.Remove([]manifest.Key{{Kind: "Pod", Namespace: "default", Name: "b"}, {Kind: "Pod", Namespace: "default", Name: "zz"}})
	if got := actions(ch); got != "Pod/default/b=deleted" {
		t.Errorf("changes %s", got)
	}
	if len(s3.Pods()) != 1 || len(s2.Pods()) != 2 {
		t.Error("remove must return a new store and leave the old one intact")
	}
	if p, ok := s3.Pod("shop", "a"); !ok || p.Labels["app"] != "yy" {
		t.Errorf("pod shop/a: %v %v", p, ok)
	}
	if ns := New().Namespaces(); len(ns) != 1 || ns[0].Name != "default" || !New().HasNamespace("default") {
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
// one as it was; the by-service slice index follows relabels and removals;
// a namespace's keys are its own ("shop", not "shop2").
func TestStoresShareStructure(t *testing.T) {
	base := nsShop + "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: shop2}\n" +
		service("shop", "a") + service("shop", "b") + service("shop2", "a") +
		slice("shop", "a-1", "a") + slice("shop", "a-2", "a") + slice("shop2", "a-1", "a") + pod("shop", "p", "x", "sleep")
	s := NewStore(parse(t, base))
	if got := sliceNames(s.EndpointSlicesFor("shop", "a")); got != "a-1,a-2" {
		t.Errorf("slices of shop/a: %s", got)
	}
	// a-2 moves to service b.
	s2, _ := s.Put(parse(t, slice("shop", "a-2", "b")))
	if a, b := sliceNames(s2.EndpointSlicesFor("shop", "a")), sliceNames(s2.EndpointSlicesFor("shop", "b")); a != "a-1" || b != "a-2" {
		t.Errorf("after relabel: a has %q, b has %q", a, b)
	}
	if got := sliceNames(s.EndpointSlicesFor("shop", "a")); got != "a-1,a-2" {
		t.Errorf("the old store changed: %s", got)
	}
	s3, _ := s2.Remove([]manifest.Key{{Kind: "EndpointSlice", Namespace: "shop", Name: "a-2"}})
	if got := sliceNames(s3.EndpointSlicesFor("shop", "b")); got != "" {
		t.Errorf("removed slice still indexed: %s", got)
	}
	var keys []string
	for _, k := range s3.KeysInNamespace("shop") {
		keys = append(keys, k.String())
	}
	if got := strings.Join(keys, " "); got != "EndpointSlice/shop/a-1 Pod/shop/p Service/shop/a Service/shop/b" {
		t.Errorf("keys in shop: %s", got)
	}
	if len(s.Objects()) != 9 || len(s.ServicesIn("shop")) != 2 || s3.Len() != 8 {
		t.Errorf("the first store has %d objects, %d services in shop; the last %d objects", len(s.Objects()), len(s.ServicesIn("shop")), s3.Len())
	}
}

// TestServicesGeneration: the Services' generation changes when a Service
// is created, changed or removed, and only then: not with a pod, nor with
// a Service put again unchanged.
func TestServicesGeneration(t *testing.T) {
	svc := func(port string) string {
		return "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {selector: {app: web}, ports: [{port: " + port + "}]}\n"
	}
	s0, _ := New().Put(parse(t, nsShop))
	s1, _ := s0.Put(parse(t, svc("80")))
	s2, _ := s1.Put(parse(t, pod("shop", "a", "web", "sleep")))
	s3, _ := s2.Put(parse(t, svc("80")))
	s4, _ := s3.Put(parse(t, svc("81")))
	s5, _ := s4.Remove([]manifest.Key{{Kind: manifest.KindPod, Namespace: "shop", Name: "a"}})
	s6, _ := s5.Remove([]manifest.Key{{Kind: manifest.KindService, Namespace: "shop", Name: "web"}})
	g := func(s *Store) uint64 { return s.ServicesGeneration() }
	if g(s1) == g(s0) || g(s4) == g(s3) || g(s6) == g(s5) {
		t.Errorf("a Service created, changed or removed kept the generation: %d %d %d %d %d %d %d", g(s0), g(s1), g(s2), g(s3), g(s4), g(s5), g(s6))
	}
	if g(s2) != g(s1) || g(s3) != g(s2) || g(s5) != g(s4) {
		t.Errorf("a pod, or an unchanged Service, changed the generation: %d %d %d %d %d", g(s1), g(s2), g(s3), g(s4), g(s5))
	}
	if New().ServicesGeneration() == New().ServicesGeneration() {
		t.Error("two unrelated stores share a generation")
	}
}
