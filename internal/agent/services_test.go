package agent

import (
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/model"
)

func storeOf(t *testing.T, doc string) *model.Store {
	t.Helper()
	s, err := model.NewStore(parseAll(t, doc))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func svc(name, clusterIP string) string {
	return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec: {clusterIP: '" + clusterIP + "', ports: [{port: 80}]}\n"
}

// applyIPs applies doc to from and assigns ClusterIPs as the agent's
// commit does.
func applyIPs(t *testing.T, c *clusterIPs, from *model.Store, doc string) (*model.Store, error) {
	t.Helper()
	next, changes, err := from.Apply(parseAll(t, doc))
	if err != nil {
		return nil, err
	}
	a, err := c.assign(from, next, changes)
	if err != nil {
		return nil, err
	}
	c.commit(a)
	return next, nil
}

func clusterIPOf(t *testing.T, s *model.Store, name string) string {
	t.Helper()
	o, ok := s.Get("Service/default/" + name)
	if !ok {
		t.Fatalf("no service %s", name)
	}
	return o.Obj.(*corev1.Service).Spec.ClusterIP
}

// TestAssignClusterIPs: addresses are allocated lowest first, written into
// the spec, kept by updates that leave them out, checked when requested
// and freed with their service; a refused change assigns nothing.
func TestAssignClusterIPs(t *testing.T) {
	pool, _ := ipam.NewPool("10.96.0.0/24")
	empty := storeOf(t, "")
	c := newClusterIPs(pool, empty)
	s, err := applyIPs(t, &c, empty, svc("a", "")+svc("b", "10.96.0.50")+svc("h", "None"))
	if err != nil {
		t.Fatal(err)
	}
	if clusterIPOf(t, s, "a") != "10.96.0.2" || clusterIPOf(t, s, "b") != "10.96.0.50" || clusterIPOf(t, s, "h") != "None" {
		t.Fatalf("allocated a=%s b=%s h=%s", clusterIPOf(t, s, "a"), clusterIPOf(t, s, "b"), clusterIPOf(t, s, "h"))
	}
	// Kept across applies; a new service does not take a kept address.
	s, err = applyIPs(t, &c, s, svc("c", "")+svc("a", "")+svc("b", ""))
	if err != nil {
		t.Fatal(err)
	}
	if clusterIPOf(t, s, "a") != "10.96.0.2" || clusterIPOf(t, s, "b") != "10.96.0.50" || clusterIPOf(t, s, "c") != "10.96.0.3" {
		t.Errorf("reallocated a=%s b=%s c=%s", clusterIPOf(t, s, "a"), clusterIPOf(t, s, "b"), clusterIPOf(t, s, "c"))
	}
	for _, tc := range []struct{ doc, want string }{
		{svc("a", "10.96.0.9") + svc("b", ""), "spec.clusterIP: field is immutable"},
		{svc("a", "") + svc("b", "") + svc("dup", "10.96.0.2"), "10.96.0.2 is already allocated to Service default/a"},
		{svc("x", "10.96.0.70") + svc("x2", "10.96.0.70"), "10.96.0.70 is already allocated to Service default/x"},
		{svc("a", "") + svc("b", "") + svc("far", "10.97.0.1"), "not in the service CIDR 10.96.0.0/24"},
	} {
		if _, err := applyIPs(t, &c, s, tc.doc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
	if len(c.owner) != 3 {
		t.Errorf("refused changes left addresses held: %v", c.owner)
	}
	// Deleting a frees its address for the next service.
	after, changes, err := s.Delete(parseAll(t, svc("a", "")))
	if err != nil {
		t.Fatal(err)
	}
	freed, err := c.assign(s, after, changes)
	if err != nil {
		t.Fatal(err)
	}
	c.commit(freed)
	if s, err = applyIPs(t, &c, after, svc("d", "")); err != nil || clusterIPOf(t, s, "d") != "10.96.0.2" {
		t.Errorf("after deleting a, d got %v (%v)", clusterIPOf(t, s, "d"), err)
	}
	// The index rebuilt from a store (at start) matches the one kept in step.
	if rebuilt := newClusterIPs(pool, s); !maps.Equal(rebuilt.owner, c.owner) {
		t.Errorf("rebuilt %v, kept %v", rebuilt.owner, c.owner)
	}
}
