package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// httpFromOutside sends one GET from the lab's external host and returns
// the status line and body ("" and the output when no response came).
func httpFromOutside(l *lab, url string) (status, body string) {
	out, code := l.shunt("lab", "exec", "--external", "--", filepath.Join(binDir, "shunt"), "lab", "http-get", "--timeout", "2s", url)
	if code != 0 {
		return "", out
	}
	status, body, _ = strings.Cut(out, "\n")
	return status, strings.TrimSpace(body)
}

// remoteFromOutside is, for eventually, the address the lab server at url
// (its /remote page) sees the external host's request come from, and the
// answer; a failed request gives its status.
func remoteFromOutside(l *lab, url string) func() (string, string) {
	return func() (string, string) {
		status, body := httpFromOutside(l, url)
		if status != "200" {
			return status, body
		}
		host, _, _ := strings.Cut(body, ":")
		return host, body
	}
}

// eventually retries get until it returns want (the agents program the
// objects a moment after `lab up` returns), failing with the last answer.
func eventually(t *testing.T, what string, want string, get func() (string, string)) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, detail := get()
		if got == want {
			return detail
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: got %q (%s), want %q", what, got, detail, want)
			return detail
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNodePortLab: a lab of two nodes whose only backend is on node-2,
// reached from the host outside the cluster: a NodePort (Cluster) on each
// node's address (through node-1 with the node's address as the source the
// backend sees, through node-2 with the client's own); a Local
// LoadBalancer through node-2 only, keeping the client's address, its
// health check answering 200 on node-2 and 503 on node-1 with kube-proxy's
// body; a LoadBalancer address from the lab's pool (--lb-pool, routed to
// node-1) and an externalIP routed to node-1, both crossing to node-2;
// a pod of node-1 reaching the NodePort and the load balancer address
// through the socket layer; the backend's own address, routed from outside
// to its node, answers with that address (the nodes masquerade, the
// replies of connections from outside keep their source). `get svc` shows
// them as kubectl does, and the ingress node's flows name the frontend's
// kind. Once the endpoint is
// deleted, node-2's health check answers 503.
// Both routing modes: the SNATed flow crosses the overlay as the node's
// own traffic, or is routed, and its reply comes back through
// from-overlay or from-uplink.
func TestNodePortLab(t *testing.T) {
	for _, routing := range []string{"tunnel", "native"} {
		t.Run(routing, func(t *testing.T) { testNodePortLab(t, routing) })
	}
}

func testNodePortLab(t *testing.T, routing string) {
	l := newLabNodes(t, 2, []string{"--routing", routing, "--lb-pool", "192.168.124.0/28"}, "testdata/nodeport.yaml")
	ext := labExternal(t, l)
	node1, node2 := "192.168.123.1", "192.168.123.2"

	if out := l.mustShunt("status", "--node", "node-2"); !strings.Contains(out, "NodePorts from outside: snat") {
		t.Errorf("status of node-2 does not name its NodePort mode (snat, the default):\n%s", out)
	}
	lbIP := loadBalancerAddress(t, l, "lb")
	if !strings.HasPrefix(lbIP, "192.168.124.") {
		t.Fatalf("Service lb got load balancer address %q, want one of the pool 192.168.124.0/28", lbIP)
	}
	table := strings.Join(strings.Fields(l.mustShunt("get", "svc")), " ")
	for _, want := range []string{"web NodePort 10.96.0.2 <none> 80:30080/TCP,81:30090/TCP", "local LoadBalancer 10.96.0.3 192.168.124.1 80:30081/TCP",
		"lb LoadBalancer 10.96.0.4 " + lbIP + " 8000:30000/TCP", "ext ClusterIP 10.96.0.5 192.168.125.7 80/TCP"} {
		if !strings.Contains(table, want) {
			t.Errorf("get svc lacks %q:\n%s", want, table)
		}
	}

	remote := func(url string) func() (string, string) { return remoteFromOutside(l, url) }
	// Cluster: through node-1 the backend on node-2 sees node-1's address
	// on the pod network (SNAT: the reply must come back through node-1);
	// through node-2, where the backend is, the client's own.
	node1PodNet := strings.TrimSuffix(l.node(1).status().PodCIDR, "0/24") + "1"
	eventually(t, "NodePort on node-1, backend on node-2", node1PodNet, remote(fmt.Sprintf("http://%s:30080/remote", node1)))
	eventually(t, "NodePort on node-2, backend there", ext.addr, remote(fmt.Sprintf("http://%s:30080/remote", node2)))
	if out, code := l.shunt("lab", "exec", "--external", "--", filepath.Join(binDir, "shunt"), "lab", "probe", "--timeout", "2s",
		"--expect", "connected", "--tcp", node1+":30090", "--tcp", node2+":30090"); code != 0 {
		t.Errorf("TCP NodePort from outside: %s", out)
	}

	// Local: node-2 keeps the client's address; node-1 has no endpoint and
	// answers nothing.
	eventually(t, "Local through node-2", ext.addr, remote(fmt.Sprintf("http://%s:30081/remote", node2)))
	if status, body := httpFromOutside(l, fmt.Sprintf("http://%s:30081/remote", node1)); status != "" {
		t.Errorf("Local through node-1, which has no endpoint: %s %s, want no answer", status, body)
	}
	health := func(node string) func() (string, string) {
		return func() (string, string) { return httpFromOutside(l, fmt.Sprintf("http://%s:30500/", node)) }
	}
	body := eventually(t, "health check on node-2", "200", health(node2))
	var hc struct {
		Service             struct{ Namespace, Name string }
		LocalEndpoints      int
		ServiceProxyHealthy bool
	}
	if err := json.Unmarshal([]byte(body), &hc); err != nil || hc.Service.Namespace != "default" || hc.Service.Name != "local" ||
		hc.LocalEndpoints != 1 || !hc.ServiceProxyHealthy {
		t.Errorf("health check body on node-2 %q (%v): want kube-proxy's, one local endpoint", body, err)
	}
	if body := eventually(t, "health check on node-1", "503", health(node1)); !strings.Contains(body, `"localEndpoints":0`) {
		t.Errorf("health check body on node-1 %q: want localEndpoints 0", body)
	}

	// The load balancer address (the lab routes the pool to node-1) and
	// an externalIP routed to node-1: both cross to node-2.
	eventually(t, "load balancer address", node1PodNet, remote(fmt.Sprintf("http://%s:8000/remote", lbIP)))
	l.mustShunt("lab", "exec", "--external", "--", "ip", "route", "replace", "192.168.125.7", "via", node1)
	eventually(t, "externalIP", node1PodNet, remote("http://192.168.125.7:80/remote"))

	// The backend's own address, routed to its node by the external host
	// (as a router of the underlay would): the connection is the
	// outside's, so the pod's replies keep the pod's address although the
	// nodes masquerade (a reply from node-2's address would be reset), and
	// the backend sees the client's.
	l.mustShunt("lab", "exec", "--external", "--", "ip", "route", "replace", l.node(2).status().PodCIDR, "via", node2)
	eventually(t, "the backend's own address from outside (masquerade on)", ext.addr,
		remote(fmt.Sprintf("http://%s:8080/remote", l.podIP("web"))))

	// Node-local clients: a pod of node-1 reaches the NodePort of its node
	// and the load balancer address through the socket layer.
	l.probe("client", "connected", "--tcp", node1+":30090")
	// ... and the NodePort of the other node, as kube-proxy's rules (and
	// Cilium's socket layer) let every pod reach every node's NodePorts.
	l.probe("client", "connected", "--tcp", node2+":30090")
	client := l.podIP("client")
	eventually(t, "load balancer address from a pod of node-1", client, func() (string, string) {
		out, code := l.shunt("lab", "exec", "client", "--", filepath.Join(binDir, "shunt"), "lab", "http-get", "--timeout", "2s", "http://"+lbIP+":8000/remote")
		status, body, _ := strings.Cut(out, "\n")
		if code != 0 || status != "200" {
			return "", out
		}
		host, _, _ := strings.Cut(strings.TrimSpace(body), ":")
		return host, body
	})

	// The ingress node's flows name the frontend and its kind.
	defer func() {
		// Then the last endpoint goes: node-2's health check flips.
		l.mustShunt("delete", "pod", "web")
		if body := eventually(t, "health check on node-2 once its endpoint is gone", "503", health(node2)); !strings.Contains(body, `"localEndpoints":0`) {
			t.Errorf("health check body on node-2 %q: want localEndpoints 0", body)
		}
	}()
	// (The agent reads the flow events as they come: a moment after.)
	for _, want := range []string{`"kind":"nodeport"`, `"kind":"lb"`, `"kind":"externalip"`, `"node":"node-1"`} {
		eventually(t, "node-1's flows naming "+want, "yes", func() (string, string) {
			flows := l.mustShunt("observe", "--node", "node-1", "--last", "2000", "-o", "json")
			if strings.Contains(flows, want) {
				return "yes", ""
			}
			return "no", fmt.Sprintf("%d lines", strings.Count(flows, "\n"))
		})
	}
}

// loadBalancerAddress is Service name's load balancer address ("" while
// it has none or several).
func loadBalancerAddress(t *testing.T, l *lab, name string) string {
	t.Helper()
	var svcs struct {
		Items []struct {
			Metadata struct{ Name string }
			Status   struct {
				LoadBalancer struct{ Ingress []struct{ IP string } }
			}
		}
	}
	if err := json.Unmarshal([]byte(l.mustShunt("get", "svc", "-o", "json")), &svcs); err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		if s.Metadata.Name == name && len(s.Status.LoadBalancer.Ingress) == 1 {
			return s.Status.LoadBalancer.Ingress[0].IP
		}
	}
	return ""
}
