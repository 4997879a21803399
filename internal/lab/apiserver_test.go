package lab

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// fakeNode is the node's dataplane as the lab sees it: it records the
// objects it is given and admits everything.
type fakeNode struct {
	gen     uint64
	store   *model.Store
	changes []model.Change // of the last update
	admits  int
}

func (n *fakeNode) Update(s *model.Store, changes []model.Change) uint64 {
	n.gen++
	n.store, n.changes = s, changes
	return n.gen
}
func (n *fakeNode) Wait(context.Context, uint64) error { return nil }
func (n *fakeNode) Admit(*model.Store) error           { n.admits++; return nil }

// newControlPlane is a lab API server over a temporary state directory,
// for requests that create no pods (those need root and the kubelet).
func newControlPlane(t *testing.T) (*ControlPlane, *fakeNode) {
	t.Helper()
	pods, _ := ipam.NewPool("10.244.0.0/24")
	svcs, _ := ipam.NewPool("10.96.0.0/24")
	node := &fakeNode{}
	cp := &ControlPlane{cfg: Config{Instance: instance.Instance{Name: "t"}, NodeName: "node-1", PodPool: pods, ServicePool: svcs, Log: slog.New(slog.DiscardHandler)},
		node: node, store: model.New(), journal: objectLog{dir: t.TempDir()}, watch: newWatchState(), leases: newLeases()}
	cp.clusterIPs = newClusterIPs(svcs, cp.store)
	cp.kubelet = kubelet{cfg: cp.cfg, pods: map[string]*PodRecord{}}
	return cp, node
}

func docs(doc string) []manifest.Document {
	d, err := manifest.ReadDocuments([]string{"-"}, strings.NewReader(doc))
	if err != nil {
		panic(err)
	}
	return d
}

func actions(changes []model.Change) string {
	var s []string
	for _, c := range changes {
		s = append(s, c.Key.String()+"="+string(c.Action))
	}
	return strings.Join(s, " ")
}

func clusterIPOf(t *testing.T, s *model.Store, name string) string {
	t.Helper()
	svc, ok := s.Service("default", name)
	if !ok {
		t.Fatalf("no service %s", name)
	}
	return svc.Spec.ClusterIP
}

// TestAssignClusterIPs: addresses are allocated lowest first, written into
// the spec, kept by updates that leave them out, checked when requested
// and freed with their service; a refused change assigns nothing.
func TestAssignClusterIPs(t *testing.T) {
	cp, _ := newControlPlane(t)
	ctx := context.Background()
	apply := func(doc string) error { _, err := cp.Apply(ctx, docs(doc)); return err }
	if err := apply(svc("a", "") + svc("b", "10.96.0.50") + svc("h", "None")); err != nil {
		t.Fatal(err)
	}
	s := cp.Store()
	if clusterIPOf(t, s, "a") != "10.96.0.2" || clusterIPOf(t, s, "b") != "10.96.0.50" || clusterIPOf(t, s, "h") != "None" {
		t.Fatalf("allocated a=%s b=%s h=%s", clusterIPOf(t, s, "a"), clusterIPOf(t, s, "b"), clusterIPOf(t, s, "h"))
	}
	// Kept across applies; a new service does not take a kept address.
	if err := apply(svc("c", "") + svc("a", "") + svc("b", "")); err != nil {
		t.Fatal(err)
	}
	s = cp.Store()
	if clusterIPOf(t, s, "a") != "10.96.0.2" || clusterIPOf(t, s, "b") != "10.96.0.50" || clusterIPOf(t, s, "c") != "10.96.0.3" {
		t.Errorf("reallocated a=%s b=%s c=%s", clusterIPOf(t, s, "a"), clusterIPOf(t, s, "b"), clusterIPOf(t, s, "c"))
	}
	for _, tc := range []struct{ doc, want string }{
		{svc("a", "10.96.0.9") + svc("b", ""), "spec.clusterIP: field is immutable"},
		{svc("a", "") + svc("b", "") + svc("dup", "10.96.0.2"), "10.96.0.2 is already allocated to Service default/a"},
		{svc("x", "10.96.0.70") + svc("x2", "10.96.0.70"), "10.96.0.70 is already allocated to Service default/x"},
		{svc("a", "") + svc("b", "") + svc("far", "10.97.0.1"), "not in the service CIDR 10.96.0.0/24"},
	} {
		if err := apply(tc.doc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
	if len(cp.clusterIPs.owner) != 3 || cp.Store() != s {
		t.Errorf("refused changes left addresses held (%v) or changed the store", cp.clusterIPs.owner)
	}
	// Deleting a (with a manifest naming it only) frees its address.
	if _, err := cp.Delete(ctx, docs("apiVersion: v1\nkind: Service\nmetadata: {name: a}\n")); err != nil {
		t.Fatal(err)
	}
	if err := apply(svc("d", "")); err != nil || clusterIPOf(t, cp.Store(), "d") != "10.96.0.2" {
		t.Errorf("after deleting a, d got %v (%v)", clusterIPOf(t, cp.Store(), "d"), err)
	}
	// The index rebuilt from a store (at start) matches the one kept in step.
	if rebuilt := newClusterIPs(cp.cfg.ServicePool, cp.Store()); !maps.Equal(rebuilt.owner, cp.clusterIPs.owner) {
		t.Errorf("rebuilt %v, kept %v", rebuilt.owner, cp.clusterIPs.owner)
	}
}

const nsShop = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n"

func slice(ns, name, svc string) string {
	return "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: " + name + ", namespace: " + ns +
		", labels: {kubernetes.io/service-name: " + svc + "}}\naddressType: IPv4\nendpoints: []\n"
}

// TestAdmissionRefusesWholeAndCascades: references to missing namespaces or
// services refuse a request whole; deleting a namespace or a service takes
// what depends on it; deleting what does not exist is an error; assigned
// fields survive an update, so the same manifest again is unchanged.
func TestAdmissionRefusesWholeAndCascades(t *testing.T) {
	cp, node := newControlPlane(t)
	ctx := context.Background()
	ch, err := cp.Apply(ctx, docs(nsShop+"---\napiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: shop}\nspec: {ports: [{port: 80}]}\n"+slice("shop", "a-1", "a")))
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(ch); got != "Namespace//shop=created Service/shop/a=created EndpointSlice/shop/a-1=created" {
		t.Errorf("changes %s", got)
	}
	if node.store != cp.Store() {
		t.Error("the node was not given the committed objects")
	}
	svcA, _ := cp.Store().Service("shop", "a")
	if svcA.UID == "" || svcA.CreationTimestamp.IsZero() {
		t.Errorf("uid %q, created %v: assigned on create", svcA.UID, svcA.CreationTimestamp)
	}
	ch, err = cp.Apply(ctx, docs("apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: shop}\nspec: {ports: [{port: 80}]}\n"))
	if err != nil || actions(ch) != "Service/shop/a=unchanged" {
		t.Errorf("the same service again: %s (%v), want unchanged", actions(ch), err)
	}
	before := cp.Store()
	_, err = cp.Apply(ctx, docs(slice("shop", "b-1", "ghost")+"---\napiVersion: v1\nkind: Service\nmetadata: {name: z, namespace: nowhere}\nspec: {ports: [{port: 80}]}\n"))
	if err == nil || !strings.Contains(err.Error(), `service "ghost" not found`) || !strings.Contains(err.Error(), `namespace "nowhere" not found`) {
		t.Errorf("error %v", err)
	}
	if cp.Store() != before {
		t.Error("a refused request changed the store")
	}
	if _, err := cp.Delete(ctx, docs("apiVersion: v1\nkind: Service\nmetadata: {name: zz}\n")); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("deleting a missing service: %v", err)
	}
	ch, err = cp.Delete(ctx, docs(nsShop))
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(ch); got != "Namespace//shop=deleted EndpointSlice/shop/a-1=deleted Service/shop/a=deleted" {
		t.Errorf("changes %s", got)
	}
	if cp.Store().Len() != 0 {
		t.Errorf("left %d objects", cp.Store().Len())
	}
}

// TestEndpointSliceController: a selector service gets the slices of the
// pods it selects, from their status (address, Ready condition), and loses
// them when the pods go; hand-written slices are left alone.
func TestEndpointSliceController(t *testing.T) {
	pod := func(name, ip string, ready corev1.ConditionStatus) manifest.Object {
		p := &corev1.Pod{}
		p.APIVersion, p.Kind, p.Name, p.Namespace = "v1", "Pod", name, "default"
		p.Labels = map[string]string{"app": "web"}
		p.Spec.NodeName = "node-1"
		p.Spec.Containers = []corev1.Container{{Name: "c", Command: []string{"x"}, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}
		p.Status.PodIP = ip
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}
		return manifest.Object{Source: "kubelet", Obj: p}
	}
	cp, _ := newControlPlane(t)
	cp.mu.Lock()
	defer cp.mu.Unlock()
	objs, err := manifest.Parse("t.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}, ports: [{port: 80, targetPort: http}]}\n"+slice("default", "web-1", "web")))
	if err != nil {
		t.Fatal(err)
	}
	next, changes := cp.store.Put(append(objs, pod("a", "10.244.0.5", corev1.ConditionTrue), pod("b", "10.244.0.6", corev1.ConditionFalse)))
	if err := cp.commit(next, changes); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sl := range cp.store.EndpointSlicesFor("default", "web") {
		names = append(names, sl.Name)
		if sl.Name == "web-2" {
			if len(sl.Endpoints) != 2 || *sl.Ports[0].Port != 8080 || *sl.Endpoints[0].Conditions.Ready != true || *sl.Endpoints[1].Conditions.Ready != false {
				t.Errorf("derived slice %+v", sl)
			}
		}
	}
	if got := strings.Join(names, ","); got != "web-1,web-2" {
		t.Errorf("slices %s: want the hand-written web-1 kept and the derived one named web-2", got)
	}
	next, changes = cp.store.Remove([]manifest.Key{{Kind: "Pod", Namespace: "default", Name: "a"}, {Kind: "Pod", Namespace: "default", Name: "b"}})
	if err := cp.commit(next, changes); err != nil {
		t.Fatal(err)
	}
	if sl := cp.store.EndpointSlicesFor("default", "web"); len(sl) != 1 || sl[0].Name != "web-1" {
		t.Errorf("after the pods went: %v", sl)
	}
}

// TestUnwrittenChangeIsNotApplied: the journal is written ahead; a change
// that cannot be recorded is refused whole: not in the store, not given to
// the node, no address held, and nothing of it on disk.
func TestUnwrittenChangeIsNotApplied(t *testing.T) {
	cp, node := newControlPlane(t)
	ctx := context.Background()
	if _, err := cp.Apply(ctx, docs(svc("a", ""))); err != nil {
		t.Fatal(err)
	}
	store, gen := cp.Store(), node.gen
	// A directory where the journal goes: appending to it fails.
	journal, _ := os.ReadFile(cp.journal.journalPath())
	os.Remove(cp.journal.journalPath())
	if err := os.Mkdir(cp.journal.journalPath(), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := cp.Apply(ctx, docs(svc("b", "")+svc("c", "")))
	if err == nil || !strings.Contains(err.Error(), "nothing applied") || !strings.Contains(err.Error(), cp.journal.journalPath()) {
		t.Fatalf("apply with an unwritable journal: %v", err)
	}
	if cp.Store() != store || node.gen != gen || len(cp.clusterIPs.owner) != 1 {
		t.Errorf("a change that was not written was applied: store changed %v, node updated %v, addresses %v", cp.Store() != store, node.gen != gen, cp.clusterIPs.owner)
	}
	os.Remove(cp.journal.journalPath())
	os.WriteFile(cp.journal.journalPath(), journal, 0o600)
	if _, err := cp.Apply(ctx, docs(svc("b", ""))); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(t, &objectLog{dir: cp.journal.dir}); got != "Service/default/a@<stdin>#1 Service/default/b@<stdin>#1" {
		t.Errorf("on disk: %s", got)
	}
}
