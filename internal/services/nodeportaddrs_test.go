package services

import (
	"reflect"
	"strings"
	"testing"
)

// TestNodePortAddresses: --nodeport-addresses selects which of the node's
// addresses serve its NodePorts, as kube-proxy's flag: by default every
// one but 127.0.0.1; a CIDR holding 127.0.0.1 adds it; "primary" is the
// node's first (underlay) address.
func TestNodePortAddresses(t *testing.T) {
	svc := lbService(t, "Cluster")
	svc.Spec.Type = "NodePort"
	for _, tc := range []struct {
		flag []string
		want []string
	}{
		{nil, []string{"192.168.123.1:30080/tcp", "10.244.1.1:30080/tcp"}},
		{[]string{"127.0.0.0/8"}, []string{"127.0.0.1:30080/tcp"}},
		{[]string{"primary", "127.0.0.1/32"}, []string{"192.168.123.1:30080/tcp", "127.0.0.1:30080/tcp"}},
		{[]string{"10.244.0.0/16", "0.0.0.0/0"}, []string{"192.168.123.1:30080/tcp", "10.244.1.1:30080/tcp", "127.0.0.1:30080/tcp"}},
		{[]string{"192.168.123.0/24"}, []string{"192.168.123.1:30080/tcp"}},
		{[]string{"172.16.0.0/12"}, nil},
	} {
		sel, err := ParseNodePortAddresses(tc.flag)
		if err != nil {
			t.Fatal(err)
		}
		node := node1
		node.NodePortAddresses = sel
		var got []string
		for _, r := range rows(PortsFor(svc, webSlices(), node)) {
			if r.kind == KindNodePort && strings.HasSuffix(r.frontend, "/tcp") {
				got = append(got, r.frontend)
			}
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("--nodeport-addresses %q: NodePorts %q, want %q", tc.flag, got, tc.want)
		}
		if !sel.IsDefault() {
			if back, _ := ParseNodePortAddresses(strings.Split(sel.String(), ",")); !reflect.DeepEqual(back, sel) {
				t.Errorf("%q: String %q does not parse back", tc.flag, sel.String())
			}
		}
		if node.NodePortAddrs[0] != node1.NodePortAddrs[0] || len(node1.NodePortAddrs) != 2 {
			t.Fatalf("PortsFor changed the node's addresses: %v", node1.NodePortAddrs)
		}
	}
	for _, bad := range []string{"127.0.0.1", "::1/128", "primary4", ""} {
		if _, err := ParseNodePortAddresses([]string{bad}); err == nil || !strings.Contains(err.Error(), "--nodeport-addresses") {
			t.Errorf("%q: %v, want a refusal naming the flag", bad, err)
		}
	}
}
