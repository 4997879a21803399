package labnet

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/instance"
)

// TestPlan: node k is instance NAME (k=1) or NAMEnk, gets the k-th /24 of
// the cluster CIDR (node-1 the plain lab's default) and the k-th address
// of the underlay; sizes and names the layout cannot hold are refused.
func TestPlan(t *testing.T) {
	l, err := Plan(instance.Instance{Name: "shunt"}, 3, DefaultClusterCIDR, "tunnel")
	if err != nil {
		t.Fatal(err)
	}
	want := []Node{
		{Name: "node-1", Instance: "shunt", Netns: "shunt-node1", Addr: "192.168.123.1", PodCIDR: "10.244.0.0/24"},
		{Name: "node-2", Instance: "shuntn2", Netns: "shunt-node2", Addr: "192.168.123.2", PodCIDR: "10.244.1.0/24"},
		{Name: "node-3", Instance: "shuntn3", Netns: "shunt-node3", Addr: "192.168.123.3", PodCIDR: "10.244.2.0/24"},
	}
	for i, n := range want {
		if l.Nodes[i] != n {
			t.Errorf("node %d: %+v, want %+v", i+1, l.Nodes[i], n)
		}
	}
	if instance.DefaultPodCIDR != l.Nodes[0].PodCIDR {
		t.Errorf("node-1's pod CIDR %s is not the one-node lab's %s", l.Nodes[0].PodCIDR, instance.DefaultPodCIDR)
	}
	if l.External != (Host{Netns: "shunt-external", Addr: "192.168.123.254"}) || l.UnderlayNetns != "shunt-underlay" {
		t.Errorf("external %+v, underlay %s", l.External, l.UnderlayNetns)
	}
	if n, ok := l.Node("node-2"); !ok || n.Instance != "shuntn2" {
		t.Errorf("Node(node-2) = %+v, %v", n, ok)
	}
	for _, tc := range []struct {
		name  string
		nodes int
		cidr  string
		want  string
	}{
		{"shunt", 1, "10.244.0.0/16", "2 to 9 nodes"},
		{"shunt", 10, "10.244.0.0/16", "2 to 9 nodes"},
		{"labnameis9", 2, "10.244.0.0/16", "at most 8"},
		{"shunt", 3, "10.244.0.0/23", "holds 3 /24 pod CIDRs"},
	} {
		_, err := Plan(instance.Instance{Name: tc.name}, tc.nodes, netip.MustParsePrefix(tc.cidr), "tunnel")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s, %d nodes, %s: %v, want %q", tc.name, tc.nodes, tc.cidr, err, tc.want)
		}
	}
}
