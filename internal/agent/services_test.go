package agent

import (
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
	ips, err := assignClusterIPs(pool, nil, storeOf(t, svc("a", "")+svc("b", "10.96.0.50")+svc("h", "None")))
	if err != nil {
		t.Fatal(err)
	}
	if ips["default/a"] != "10.96.0.2" || ips["default/b"] != "10.96.0.50" || ips["default/h"] != "" {
		t.Fatalf("allocated %v", ips)
	}
	// Kept across applies; a new service does not take a kept address.
	again, err := assignClusterIPs(pool, ips, storeOf(t, svc("c", "")+svc("a", "")+svc("b", "")))
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
		if _, err := assignClusterIPs(pool, ips, storeOf(t, c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}
