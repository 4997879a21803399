package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodePortThreeNodes: a lab of three nodes, with the overlay and with
// native routing, a NodePort whose backends are on node-2 and node-3: the
// external host reaches both backends through node-1 (which has none:
// SNAT to each of the other nodes), and through every node's address;
// through node-1 the backends see node-1's address on the pod network. A
// ClusterIP of trafficDistribution PreferSameNode keeps each backend's
// node's pods' requests on their own node.
func TestNodePortThreeNodes(t *testing.T) {
	for _, routing := range []string{"tunnel", "native"} {
		t.Run(routing, func(t *testing.T) { testNodePortThreeNodes(t, routing) })
	}
}

func testNodePortThreeNodes(t *testing.T, routing string) {
	l := newLabNodes(t, 3, []string{"--routing", routing}, "testdata/nodeport-3.yaml")
	labExternal(t, l)
	for k := 1; k <= 3; k++ {
		url := fmt.Sprintf("http://192.168.123.%d:30080/", k)
		eventually(t, fmt.Sprintf("the NodePort on node-%d", k), "200", func() (string, string) { return httpFromOutside(l, url) })
		seen := map[string]int{}
		for range 24 {
			st, body := httpFromOutside(l, url)
			if st != "200" {
				t.Errorf("node-%d: %s %q", k, st, body)
				continue
			}
			seen[strings.TrimSpace(body)]++
		}
		if seen["web2"] == 0 || seen["web3"] == 0 || len(seen) != 2 {
			t.Errorf("24 requests through node-%d reached %v; want both web2 (node-2) and web3 (node-3)", k, seen)
		}
	}
	// Through node-1 the backend sees node-1's pod-network address
	// (SNAT), which every node routes back to node-1.
	node1PodNet := l.status().NodeIP
	_, body := httpFromOutside(l, "http://192.168.123.1:30080/remote")
	if host, _, _ := strings.Cut(strings.TrimSpace(body), ":"); host != node1PodNet {
		t.Errorf("through node-1 the backend saw %q, want node-1's pod-network address %s", body, node1PodNet)
	}

	// trafficDistribution PreferSameNode: each backend's own node keeps
	// its pods' requests to the ClusterIP at home.
	near := "http://" + l.clusterIP("near") + "/"
	for _, pod := range []string{"web2", "web3"} {
		seen := map[string]int{}
		for range 12 {
			out, _ := l.shunt("lab", "exec", pod, "--", filepath.Join(binDir, "shunt"), "lab", "http-get", "--timeout", "2s", near)
			seen[strings.TrimSpace(strings.TrimPrefix(out, "200"))]++
		}
		if len(seen) != 1 || seen[pod] != 12 {
			t.Errorf("12 requests from %s to a PreferSameNode ClusterIP reached %v; want its own node's backend, %s, every time", pod, seen, pod)
		}
	}
}
