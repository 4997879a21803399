package services

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func issueText(is []Issue) string {
	var b strings.Builder
	for _, i := range is {
		b.WriteString(i.Reason + ": " + i.Message + "\n")
	}
	return b.String()
}

// A Service frontend at the overlay's own endpoint (UDP, the underlay
// address, the VXLAN port) is never served: the uplink hands it to the
// VXLAN device. The Service says which frontend, and nothing else is
// named.
func TestTunnelPortIssues(t *testing.T) {
	svc := lbService(t, "Cluster") // UDP 53, nodePort 30053; LB 192.168.124.1, externalIP 192.0.2.7
	underlay := netip.MustParseAddr("192.168.123.1")
	cases := []struct {
		name   string
		tunnel netip.AddrPort
		addrs  []netip.Addr // where the node serves NodePorts
		want   []string     // substrings, one per issue
	}{
		{"no overlay", netip.AddrPort{}, node1.NodePortAddrs, nil},
		{"another port", netip.AddrPortFrom(underlay, 4789), node1.NodePortAddrs, nil},
		{"UDP nodePort on the tunnel port", netip.AddrPortFrom(underlay, 30053), node1.NodePortAddrs,
			[]string{"nodePort 30053/UDP: 192.168.123.1:30053 is this node's overlay endpoint"}},
		{"NodePorts not served at the underlay address", netip.AddrPortFrom(underlay, 30053), []netip.Addr{netip.MustParseAddr("10.244.1.1")}, nil},
		{"TCP nodePort on the tunnel port", netip.AddrPortFrom(underlay, 30080), node1.NodePortAddrs, nil},
		{"load balancer address is the underlay", netip.MustParseAddrPort("192.168.124.1:53"), []netip.Addr{netip.MustParseAddr("192.168.124.1")},
			[]string{"port 53/UDP at external address 192.168.124.1"}},
		{"externalIP is the underlay", netip.MustParseAddrPort("192.0.2.7:53"), nil,
			[]string{"port 53/UDP at external address 192.0.2.7: 192.0.2.7:53 is this node's overlay endpoint"}},
		{"TCP port at the underlay", netip.MustParseAddrPort("192.0.2.7:80"), nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := TunnelPortIssues(svc, c.tunnel, c.addrs)
			if len(got) != len(c.want) {
				t.Fatalf("got %d issues, want %d:\n%s", len(got), len(c.want), issueText(got))
			}
			for i, w := range c.want {
				if got[i].Reason != "TunnelPortConflict" || !strings.Contains(got[i].Message, w) {
					t.Errorf("issue %d = %s: %s, want TunnelPortConflict with %q", i, got[i].Reason, got[i].Message, w)
				}
			}
		})
	}
}

func TestTunnelHostPortIssues(t *testing.T) {
	pod := parse[*corev1.Pod](t, `apiVersion: v1
kind: Pod
metadata: {name: dns, namespace: shop}
spec:
  nodeName: node-1
  containers:
  - name: server
    ports:
    - {containerPort: 53, hostPort: 4789, protocol: UDP}
    - {containerPort: 53, hostPort: 4789, protocol: UDP, hostIP: 192.168.123.1}
    - {containerPort: 53, hostPort: 4789, protocol: UDP, hostIP: 127.0.0.1}
    - {containerPort: 80, hostPort: 4789}
`)
	tunnel := netip.MustParseAddrPort("192.168.123.1:4789")
	got := TunnelHostPortIssues(pod, "node-1", tunnel)
	want := []string{
		"container server: hostPort 4789/UDP: 192.168.123.1:4789 is this node's overlay endpoint",
		"container server: hostPort 4789/UDP at hostIP 192.168.123.1: ",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d issues, want %d (every address and the underlay's; not 127.0.0.1, not TCP):\n%s", len(got), len(want), issueText(got))
	}
	for i, w := range want {
		if !strings.Contains(got[i].Message, w) {
			t.Errorf("issue %d = %q, want it to contain %q", i, got[i].Message, w)
		}
	}
	if got := TunnelHostPortIssues(pod, "node-2", tunnel); got != nil {
		t.Errorf("another node reports the pod's hostPorts: %s", issueText(got))
	}
	if got := TunnelHostPortIssues(pod, "node-1", netip.AddrPort{}); got != nil {
		t.Errorf("a node without the overlay reports: %s", issueText(got))
	}
}
