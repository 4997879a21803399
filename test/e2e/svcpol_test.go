package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServicePoliciesLab: a lab of two nodes, a backend and a client pod
// on each, reached from the host outside the cluster:
//   - loadBalancerSourceRanges: a LoadBalancer whose ranges hold the
//     external host answers it; one whose ranges do not answers nothing,
//     and the ingress node's flows name the drop (lb-source-denied); at
//     the socket layer the node (by its underlay address, in the open
//     one's ranges) is admitted to the open one and refused by the closed
//     one, a pod (its pod address in neither) refused by both, at once;
//   - internalTrafficPolicy Local: the ClusterIP of a Service whose only
//     endpoint is on node-2 refuses node-1's pod (as a Service without
//     endpoints does) and takes node-2's to its endpoint;
//   - session affinity ClientIP on a NodePort: every request of the
//     external host reaches the same backend, of two on two nodes;
//   - hostPort: a pod's hostPort answers the external host on its node's
//     address (the pod sees the client's address) and the node itself;
//     one with hostIP 127.0.0.1 answers the node on its loopback and
//     nobody on its address, nor a pod on the pod's own loopback; a pod taking the same hostPort on that
//     node is refused with file, object and field.
func TestServicePoliciesLab(t *testing.T) {
	l := newLabNodes(t, 2, []string{"--lb-pool", "192.168.124.0/28"}, "testdata/svcpol.yaml")
	labExternal(t, l)
	node1 := "192.168.123.1"
	lbIPs := map[string]string{"open": loadBalancerAddress(t, l, "open"), "closed": loadBalancerAddress(t, l, "closed")}
	if lbIPs["open"] == "" || lbIPs["closed"] == "" {
		t.Fatalf("load balancer addresses %v: want one for open and closed", lbIPs)
	}
	status := func(url string) func() (string, string) {
		return func() (string, string) { return httpFromOutside(l, url) }
	}

	t.Run("source ranges", func(t *testing.T) {
		eventually(t, "LoadBalancer whose ranges hold the external host", "200", status("http://"+lbIPs["open"]+"/"))
		if st, body := httpFromOutside(l, "http://"+lbIPs["closed"]+"/"); st != "" {
			t.Errorf("LoadBalancer whose ranges do not hold the external host: %s %s, want no answer", st, body)
		}
		// Node-local clients, judged at the socket layer: the node by its
		// underlay address, a pod by its own.
		l.probe("", "connected", "--http", "http://"+lbIPs["open"]+"/")
		l.probe("", "refused", "--tcp", lbIPs["closed"]+":80")
		l.probe("client1", "refused", "--tcp", lbIPs["open"]+":80")
		l.probe("client1", "refused", "--tcp", lbIPs["closed"]+":80")
		// The lab routes the pool to node-1: its flows name the drop.
		eventually(t, "node-1's flows naming lb-source-denied", "yes", func() (string, string) {
			flows := l.mustShunt("observe", "--node", "node-1", "--last", "2000", "-o", "json")
			for _, line := range strings.Split(flows, "\n") {
				if strings.Contains(line, `"lb-source-denied"`) && strings.Contains(line, lbIPs["closed"]) {
					return "yes", ""
				}
			}
			return "no", fmt.Sprintf("%d lines", strings.Count(flows, "\n"))
		})
	})

	t.Run("internalTrafficPolicy Local", func(t *testing.T) {
		near := serviceIP(t, l, "near")
		l.probe("client2", "connected", "--http", "http://"+near+"/")
		l.probe("client1", "refused", "--http", "http://"+near+"/")
	})

	t.Run("hostPort", func(t *testing.T) {
		node2 := "192.168.123.2"
		ext := labExternal(t, l)
		body := eventually(t, "hostPort from outside", "200", status("http://"+node2+":8081/remote"))
		if host, _, _ := strings.Cut(body, ":"); host != ext.addr {
			t.Errorf("the pod saw %q, want the external host %s", body, ext.addr)
		}
		// Node-2's agent, run in node-2's namespace.
		onNode2 := l.node(2)
		onNode2.netns = l.instance + "-node2"
		fromNode2 := func(url string) func() (string, string) {
			return func() (string, string) {
				out, code := onNode2.shunt("lab", "http-get", "--timeout", "2s", url)
				if code != 0 {
					return "", out
				}
				st, body, _ := strings.Cut(out, "\n")
				return st, body
			}
		}
		eventually(t, "hostPort from its node, at the node's address", "200", fromNode2("http://"+node2+":8081/"))
		eventually(t, "hostIP 127.0.0.1 from its node", "200", fromNode2("http://127.0.0.1:8082/"))
		// A pod's loopback is its own: nothing listens on its 8082.
		l.probe("client2", "refused", "--tcp", "127.0.0.1:8082")
		if st, body := httpFromOutside(l, "http://"+node2+":8082/"); st != "" {
			t.Errorf("hostIP 127.0.0.1 from outside: %s %s, want no answer", st, body)
		}
		doc := "apiVersion: v1\nkind: Pod\nmetadata: {name: hp2}\nspec:\n  nodeName: node-2\n" +
			"  containers: [{name: c, command: [sleep, infinity], ports: [{containerPort: 9000, hostPort: 8081}]}]\n"
		f := filepath.Join(t.TempDir(), "hp2.yaml")
		if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		out, code := l.shunt("apply", "-f", f)
		if want := "Pod default/hp2: spec.containers[0].ports[0].hostPort: 8081/TCP is already taken on node node-2 by Pod default/hp"; code == 0 || !strings.Contains(out, want) {
			t.Errorf("a taken hostPort: exit %d, %s; want refused with %q", code, out, want)
		}
	})

	t.Run("session affinity on a NodePort from outside", func(t *testing.T) {
		first := eventually(t, "NodePort with affinity", "200", status(fmt.Sprintf("http://%s:30100/", node1)))
		for i := range 10 {
			if st, body := httpFromOutside(l, fmt.Sprintf("http://%s:30100/", node1)); st != "200" || body != first {
				t.Errorf("request %d: %s %q, want 200 from %q as the first", i, st, body, first)
			}
		}
	})
}
