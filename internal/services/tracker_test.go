package services

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

func objects(t *testing.T, doc string) []manifest.Object {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func svcWithSlice(name, vip, slice, backend string) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: %s}
spec: {clusterIP: %s, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %s, labels: {kubernetes.io/service-name: %s}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [%s]}]
`, name, vip, slice, name, backend)
}

func names(ports []Port) string {
	var out []string
	for _, p := range ports {
		out = append(out, fmt.Sprintf("%s=%d", p.Name, len(p.Backends)))
	}
	return strings.Join(out, ",")
}

func frontends(fs []Frontend) string {
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%s:%d", f.VIP, f.Port))
	}
	return strings.Join(out, ",")
}

// TestTrackerComputesTouchedServicesOnly: the first computation covers
// every service; later ones only those a change names (through the
// Service or one of its EndpointSlices, before and after a relabel), and
// a deleted service's frontends are reported gone.
func TestTrackerComputesTouchedServicesOnly(t *testing.T) {
	tr := NewTracker()
	s := model.NewStore(objects(t, svcWithSlice("a", "10.96.0.1", "a-1", "10.0.0.1")+svcWithSlice("b", "10.96.0.2", "b-1", "10.0.0.2")+svcWithSlice("c", "10.96.0.3", "c-1", "10.0.0.3")))
	d := tr.Compute(s)
	if !d.Full || names(d.Upsert) != "default/a:80/TCP=1,default/b:80/TCP=1,default/c:80/TCP=1" {
		t.Fatalf("first compute: full=%v %s", d.Full, names(d.Upsert))
	}
	if d := tr.Compute(s); !d.Empty() {
		t.Errorf("nothing changed, yet %+v", d)
	}
	// Slice b-1 moves to service a: both a and b change, c does not.
	next, changes := s.Put(objects(t, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: b-1, labels: {kubernetes.io/service-name: a}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.0.0.2]}]\n"))
	tr.Touch(s, next, changes)
	d = tr.Compute(next)
	if d.Full || names(d.Upsert) != "default/a:80/TCP=2,default/b:80/TCP=0" || len(d.Remove) != 0 {
		t.Errorf("after relabel: full=%v upsert %s remove %s", d.Full, names(d.Upsert), frontends(d.Remove))
	}
	// Service c deleted: its frontend is gone.
	s, changes = next.Remove([]manifest.Key{{Kind: "Service", Namespace: "default", Name: "c"}})
	tr.Touch(next, s, changes)
	d = tr.Compute(s)
	if len(d.Upsert) != 0 || frontends(d.Remove) != "10.96.0.3:80" {
		t.Errorf("after delete: upsert %s remove %s", names(d.Upsert), frontends(d.Remove))
	}
	if p, b := tr.Count(); p != 2 || b != 2 || names(tr.Ports()) != "default/a:80/TCP=2,default/b:80/TCP=0" {
		t.Errorf("table %s (%d ports, %d backends)", names(tr.Ports()), p, b)
	}
	// After a failed write the tracker starts over.
	tr.Reset()
	if d := tr.Compute(s); !d.Full || len(d.Upsert) != 2 {
		t.Errorf("after reset: %+v", d)
	}
}

// TestSelectorServicesTouched: a pod change touches the selector services
// that select it before or after (a relabel touches both), never one that
// selects neither, nor one without selector.
func TestSelectorServicesTouched(t *testing.T) {
	pod := func(app string) string {
		return "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {app: " + app + "}}\nspec: {containers: [{name: c, command: [x]}]}\n"
	}
	sel := func(name, app string) string {
		return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec: {selector: {app: " + app + "}, ports: [{port: 80}]}\n"
	}
	old := model.NewStore(objects(t, sel("web", "web")+sel("db", "db")+sel("cache", "cache")+pod("web")))
	next, changes := old.Put(objects(t, pod("db")))
	var got []string
	for _, k := range SelectorServicesTouched(old, next, changes) {
		got = append(got, k.Name)
	}
	if strings.Join(got, ",") != "db,web" {
		t.Errorf("touched %v, want db,web", got)
	}
	p := PodOf(next.Pods()[0])
	if p.Ready || p.IP != "" {
		t.Errorf("a pod without status: %+v, want not ready and no address", p)
	}
}

// TestTrackerHostPorts: a pod of the node with a hostPort adds its
// frontends when it has an address, a change to it rewrites them, its
// deletion removes them; another node's pod adds none.
func TestTrackerHostPorts(t *testing.T) {
	pod := func(name, node, ip string, hostPort int) string {
		return fmt.Sprintf("---\napiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec: {nodeName: %s, containers: [{name: c, command: [x], ports: [{containerPort: 8080, hostPort: %d}]}]}\nstatus: {podIP: %s}\n",
			name, node, hostPort, ip)
	}
	tr := NewTrackerFor(node1)
	s := model.NewStore(objects(t, pod("mine", "node-1", "10.244.1.5", 80)+pod("theirs", "node-2", "10.244.2.5", 80)))
	if d := tr.Compute(s); names(d.Upsert) != "default/mine:80/TCP=1,default/mine:80/TCP=1" {
		t.Fatalf("first compute: %s (one frontend per NodePort address of node-1)", names(d.Upsert))
	}
	next, changes := s.Put(objects(t, pod("mine", "node-1", "10.244.1.5", 81)))
	tr.Touch(s, next, changes)
	d := tr.Compute(next)
	if names(d.Upsert) != "default/mine:81/TCP=1,default/mine:81/TCP=1" || frontends(d.Remove) != "192.168.123.1:80,10.244.1.1:80" {
		t.Errorf("hostPort changed: upsert %s remove %s", names(d.Upsert), frontends(d.Remove))
	}
	s, changes = next.Remove([]manifest.Key{{Kind: "Pod", Namespace: "default", Name: "mine"}})
	tr.Touch(next, s, changes)
	if d := tr.Compute(s); len(d.Upsert) != 0 || frontends(d.Remove) != "192.168.123.1:81,10.244.1.1:81" {
		t.Errorf("pod deleted: upsert %s remove %s", names(d.Upsert), frontends(d.Remove))
	}
	if len(tr.Ports()) != 0 {
		t.Errorf("left: %s", names(tr.Ports()))
	}
}
