package agent

import (
	"maps"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

func storeOf(t *testing.T, doc string) *model.Store {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s, err := model.NewStore(objs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func svc(name, clusterIP string) string {
	return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec: {clusterIP: '" + clusterIP + "', ports: [{port: 80}]}\n"
}

func TestAssignClusterIPs(t *testing.T) {
	pool, _ := ipam.NewPool("10.96.0.0/24")
	ips, err := assignClusterIPs(pool, nil, storeOf(t, svc("a", "")+svc("b", "10.96.0.50")+svc("h", "None")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ips["default/a"] != "10.96.0.2" || ips["default/b"] != "10.96.0.50" || ips["default/h"] != "" {
		t.Fatalf("allocated %v", ips)
	}
	// Kept across applies; a new service does not take a kept address.
	again, err := assignClusterIPs(pool, ips, storeOf(t, svc("c", "")+svc("a", "")+svc("b", "")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if again["default/a"] != "10.96.0.2" || again["default/b"] != "10.96.0.50" || again["default/c"] != "10.96.0.3" {
		t.Errorf("reallocated %v", again)
	}
	for _, c := range []struct{ doc, want string }{
		{svc("a", "10.96.0.9") + svc("b", ""), "spec.clusterIP: field is immutable"},
		{svc("a", "") + svc("b", "") + svc("dup", "10.96.0.2"), "10.96.0.2 is already allocated to Service default/a"},
		{svc("a", "") + svc("b", "") + svc("far", "10.97.0.1"), "not in the service CIDR 10.96.0.0/24"},
	} {
		if _, err := assignClusterIPs(pool, ips, storeOf(t, c.doc), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}

// TestAssignClusterIPsIncrementally: given the step's changes, the result
// equals a full assignment, and deleted services free their address.
func TestAssignClusterIPsIncrementally(t *testing.T) {
	pool, _ := ipam.NewPool("10.96.0.0/24")
	base := storeOf(t, svc("a", "")+svc("b", "10.96.0.50")+svc("c", ""))
	ips, err := assignClusterIPs(pool, nil, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Parse("t.yaml", []byte(svc("d", "")+svc("e", "10.96.0.60")))
	if err != nil {
		t.Fatal(err)
	}
	next, changes, err := base.Apply(objs)
	if err != nil {
		t.Fatal(err)
	}
	inc, err := assignClusterIPs(pool, ips, next, changes)
	if err != nil {
		t.Fatal(err)
	}
	full, err := assignClusterIPs(pool, ips, next, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(inc, full) || inc["default/d"] != "10.96.0.4" || inc["default/e"] != "10.96.0.60" {
		t.Errorf("incremental %v, full %v", inc, full)
	}
	del, err := manifest.Parse("t.yaml", []byte(svc("a", "")))
	if err != nil {
		t.Fatal(err)
	}
	after, changes, err := next.Delete(del)
	if err != nil {
		t.Fatal(err)
	}
	if inc, err = assignClusterIPs(pool, inc, after, changes); err != nil || inc["default/a"] != "" || len(inc) != 4 {
		t.Errorf("after deleting a: %v %v", inc, err)
	}
	dup, _ := manifest.Parse("t.yaml", []byte(svc("f", "10.96.0.60")))
	if bad, changes, err := after.Apply(dup); err != nil {
		t.Fatal(err)
	} else if _, err := assignClusterIPs(pool, inc, bad, changes); err == nil || !strings.Contains(err.Error(), "already allocated to Service default/e") {
		t.Errorf("a taken address requested incrementally: %v", err)
	}
}
