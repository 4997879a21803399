package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

// TestProxySteering: HTTP rules hold for clients no socket hook of the
// server's node sees. With native routing, a pod of node-1 dials the
// backend on node-2 itself (node-1 leaves other nodes' HTTP ports alone),
// and the host outside the cluster reaches it through a NodePort of
// node-2; node-2's tc gives both connections to its proxy (bpf_sk_assign,
// bpf/lib/steer.h), which answers what the rules deny with 403 and
// forwards the rest, naming the client's identity; node-2's flows show the
// steering (proxy-steered) and the proxy's verdicts.
func TestProxySteering(t *testing.T) {
	l := newLabNodes(t, 2, []string{"--routing", "native"}, "testdata/steer.yaml")
	backend := l.podIP("backend")
	node2 := "192.168.123.2"
	get := l.httpGetIn

	// (1) Another node's pods, native routing.
	waitFor(t, 15*time.Second, "frontend on node-1 GET /metrics of the backend on node-2", func() bool {
		return strings.HasPrefix(get("frontend", "http://"+backend+":8080/metrics"), "200")
	})
	if out := get("frontend", "http://"+backend+":8080/admin"); !strings.HasPrefix(out, "403") || !strings.Contains(out, "ShuntNetworkPolicy default/backend-http") {
		t.Errorf("frontend GET /admin on node-2's backend: %q, want 403 naming the policy", out)
	}
	if out := get("monitoring", "-X", "POST", "http://"+backend+":8080/admin"); !strings.HasPrefix(out, "200") {
		t.Errorf("monitoring POST /admin: %q, want 200", out)
	}

	// (2) The host outside, through a NodePort of node-2 (Local: the
	// backend is there and sees the client's address, here the proxy's
	// connection for it).
	nodePort := fmt.Sprintf("http://%s:30088", node2)
	eventually(t, "GET /public from outside through the NodePort", "200", func() (string, string) { return httpFromOutside(l, nodePort+"/public") })
	if status, body := httpFromOutside(l, nodePort+"/admin"); status != "403" || !strings.Contains(body, "ShuntNetworkPolicy default/backend-http") {
		t.Errorf("GET /admin from outside through the NodePort: %s %q, want 403 naming the policy", status, body)
	}

	// (3) Through a NodePort of node-1 (Cluster): node-1 sends it to
	// node-2 from its own address, which the rules name.
	checkSteeredFromNode1(t, l)

	// The flows of node-2: the steering in tc, the proxy's verdicts with
	// the clients' identities (the proxy's flows reach the agent's history
	// a moment later).
	frontend := l.podIP("frontend")
	var fs []flows.Flow
	var steered, frontendDenied, outsideDenied, outsideAllowed bool
	deadline := time.Now().Add(20 * time.Second)
	for !(steered && frontendDenied && outsideDenied && outsideAllowed) && time.Now().Before(deadline) {
		// A request whose flow is not there yet is asked again: the
		// agent's relay of the proxy's flows may have started after the
		// first ones.
		if !frontendDenied {
			get("frontend", "http://"+backend+":8080/admin")
		}
		if !outsideDenied {
			httpFromOutside(l, nodePort+"/admin")
		}
		if !outsideAllowed {
			httpFromOutside(l, nodePort+"/public")
		}
		time.Sleep(200 * time.Millisecond)
		fs = l.observe("--last", "5000", "--node", "node-2")
		for _, f := range fs {
			if f.Reason == "proxy-steered" && f.Verdict == "REDIRECTED" && f.Destination.IP == backend {
				steered = true
			}
			if f.HTTP == nil {
				continue
			}
			denied := f.Verdict == "DROPPED" && f.HTTP.Path == "/admin" && f.HTTP.Status == 403
			switch {
			case denied && f.Source.IP == frontend && f.Source.Pod == "default/frontend":
				frontendDenied = true
			case denied && f.Source.IP != frontend && hasLabel(f.Source, "reserved:world"):
				outsideDenied = true
			case f.Verdict == "FORWARDED" && f.HTTP.Path == "/public" && f.HTTP.Status == 200 && hasLabel(f.Source, "reserved:world"):
				outsideAllowed = true
			}
		}
	}
	if !steered || !frontendDenied || !outsideDenied || !outsideAllowed {
		t.Errorf("node-2's flows: steered %v, frontend's /admin denied %v, outside /admin denied %v, outside /public forwarded %v; want all:\n%s",
			steered, frontendDenied, outsideDenied, outsideAllowed, flowLines(fs))
	}
	// node-1 sent nothing to its own proxy: no HTTP flow there.
	for _, f := range l.observe("--last", "5000", "--node", "node-1") {
		if f.HTTP != nil {
			t.Errorf("node-1's proxy saw a request (its client's node must leave other nodes' HTTP ports to them): %+v", f)
			break
		}
	}

	// (4) Through a route, which node-1's proxy serves: it decides the
	// requests by the backend's rules and connects to node-2 from node-1's
	// address, its SYN carrying the client's identity (a TCP option,
	// bpf/lib/carried_identity.h). node-2 admits the connection as that
	// client and does not steer it again. As remote-node, which the rules
	// allow /public only, /metrics would be refused.
	checkRoutedIdentity(t, l, backend, true)
}

// checkRoutedIdentity: frontend and monitoring of node-1 reach node-2's
// backend through backend-routed, whose HTTPRoute node-1's proxy serves;
// each gets what the backend's rules give its own identity, and node-2's
// flows show the proxy's connection from node-1's address admitted as
// frontend's identity (native: counted identity-carried; the overlay's VNI
// carries it otherwise).
func checkRoutedIdentity(t *testing.T, l *lab, backend string, native bool) {
	t.Helper()
	routed := "http://" + l.clusterIP("backend-routed") + ":8080"
	get := l.httpGetIn
	var last string
	waitFor(t, 15*time.Second, "frontend GET /metrics through the route", func() bool {
		last = get("frontend", routed+"/metrics")
		return strings.HasPrefix(last, "200")
	})
	if !strings.HasPrefix(last, "200") {
		t.Errorf("frontend GET /metrics through the route: %q, want 200 (as frontend, not remote-node)", last)
	}
	if out := get("frontend", routed+"/admin"); !strings.HasPrefix(out, "403") || !strings.Contains(out, "ShuntNetworkPolicy default/backend-http") {
		t.Errorf("frontend GET /admin through the route: %q, want 403 naming the policy", out)
	}
	if out := get("monitoring", "-X", "POST", routed+"/admin"); !strings.HasPrefix(out, "200") {
		t.Errorf("monitoring POST /admin through the route: %q, want 200", out)
	}
	frontend := l.podIP("frontend")
	var admitted bool
	var fs []flows.Flow
	for deadline := time.Now().Add(10 * time.Second); !admitted && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		get("frontend", routed+"/metrics")
		fs = l.observe("--last", "5000", "--node", "node-2")
		for _, f := range fs {
			admitted = admitted || (f.Event == "new" && f.Verdict == "FORWARDED" && f.Destination.IP == backend &&
				f.Source.IP != frontend && hasLabel(f.Source, "app=frontend"))
		}
	}
	if !admitted {
		t.Errorf("node-2's flows: no connection from node-1's address admitted as frontend's identity:\n%s", flowLines(fs))
	}
	if st := l.node(2).mustShunt("status", "-o", "json"); native && !strings.Contains(st, "identity-carried") {
		t.Errorf("node-2 counted no carried identity:\n%s", st)
	}
}

// httpGetIn runs `shunt lab http-get --timeout 2s ARGS` in pod and returns
// what it printed (the status line first, or the error).
func (l *lab) httpGetIn(pod string, args ...string) string {
	l.t.Helper()
	out, _ := l.shuntInPod(pod, append([]string{"lab", "http-get", "--timeout", "2s"}, args...)...)
	return out
}

func hasLabel(e flows.Endpoint, label string) bool {
	for _, l := range e.Labels {
		if l == label {
			return true
		}
	}
	return false
}

func flowLines(fs []flows.Flow) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "%s %s %s:%d -> %s:%d", f.Verdict, f.Reason, f.Source.IP, f.Source.Port, f.Destination.IP, f.Destination.Port)
		if f.HTTP != nil {
			fmt.Fprintf(&b, " http %s %s %d", f.HTTP.Method, f.HTTP.Path, f.HTTP.Status)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// checkSteeredFromNode1: the host outside reaches the backend of node-2
// through the Cluster NodePort of node-1, which SNATs it to its address
// on the pod network: node-2 steers the connection to its proxy, which
// applies the rules naming that address (/public allowed, /admin 403), and
// its answers find their way back through node-1.
func checkSteeredFromNode1(t *testing.T, l *lab) {
	t.Helper()
	url := "http://192.168.123.1:30089"
	eventually(t, "GET /public from outside through node-1's NodePort", "200", func() (string, string) { return httpFromOutside(l, url+"/public") })
	if status, body := httpFromOutside(l, url+"/admin"); status != "403" || !strings.Contains(body, "ShuntNetworkPolicy default/backend-http") {
		t.Errorf("GET /admin from outside through node-1's NodePort: %s %q, want 403 naming the policy", status, body)
	}
}

// TestProxySteeringOverlay: with the overlay, the host outside reaches
// node-2's backend through node-1's Cluster NodePort; node-2 steers the
// connection to its proxy, whose answers leave through the overlay with
// the backend pod's identity (the address they leave from) and are
// translated back on node-1.
func TestProxySteeringOverlay(t *testing.T) {
	l := newLabNodes(t, 2, []string{"--routing", "tunnel"}, "testdata/steer.yaml")
	checkSteeredFromNode1(t, l)
	if st := l.node(2).mustShunt("status", "-o", "json"); !strings.Contains(st, "proxy-steered") {
		t.Errorf("node-2 counted no steered packet:\n%s", st)
	}

	// The steering routing removed behind the agent's back (a network
	// manager that owns the node's rules, `ip rule flush`): a drift check
	// names the rule and the route and puts them back, and the steering
	// works again.
	node2ns := "--net=/run/netns/" + l.instance + "-node2"
	for _, del := range [][]string{{"rule", "del", "pref", "95"}, {"route", "del", "local", "default", "dev", "lo", "table", "95"}} {
		if out, err := exec.Command("nsenter", append([]string{node2ns, "ip"}, del...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s in node-2: %v: %s", strings.Join(del, " "), err, out)
		}
	}
	out, code := l.node(2).shunt("sync", "--verify")
	if code != 1 || !strings.Contains(out, "proxy-steer-routing") || !strings.Contains(out, "rule fwmark 0x5f000000 lookup 95 pref 95") ||
		!strings.Contains(out, "route local 0.0.0.0/0 dev lo table 95") {
		t.Errorf("sync --verify on node-2 without the steering routing: exit %d (want 1), want both named:\n%s", code, out)
	}
	if out, code := l.node(2).shunt("sync", "--verify"); code != 0 {
		t.Errorf("second sync --verify on node-2: exit %d (want 0):\n%s", code, out)
	}
	if m := l.node(2).mustShunt("metrics"); !strings.Contains(m, `shunt_drift_repaired_total{map="proxy-steer-routing"} 2`) {
		t.Errorf("node-2's metrics do not count the routing's repair:\n%s", grepLines(m, "shunt_drift_repaired_total"))
	}
	checkSteeredFromNode1(t, l)
	checkRoutedIdentity(t, l, l.podIP("backend"), false)

	// Without HTTP rules and routes no connection goes to the proxy: both
	// nodes drop the routing (a rule makes every route lookup walk the
	// rules).
	l.mustShunt("delete", "shuntnetworkpolicy", "backend-http")
	l.mustShunt("delete", "httproute", "backend-routed")
	for k, ns := range []string{"-node1", "-node2"} {
		waitFor(t, 10*time.Second, fmt.Sprintf("node-%d's steering rule removed with the last HTTP rule", k+1), func() bool {
			out, _ := exec.Command("nsenter", "--net=/run/netns/"+l.instance+ns, "ip", "rule", "show").CombinedOutput()
			return !strings.Contains(string(out), "0x5f000000")
		})
	}
	if out, code := l.node(2).shunt("sync", "--verify"); code != 0 || strings.Contains(out, "proxy-steer-routing") {
		t.Errorf("sync --verify on node-2 without HTTP rules: exit %d (want 0, the routing not checked):\n%s", code, out)
	}
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var keep []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// TestProxySteeringCIDR: HTTP rules for peers named by address (ipBlock)
// hold for clients outside, with native routing and with the overlay. The
// host outside reaches node-2's backend through node-2's Local NodePort
// and through node-1's Cluster NodePort (SNATed to node-1's address);
// node-2 steers both connections to its proxy, which answers 403 for what
// the rules deny and forwards the rest from the client's own address, so
// the backend's L3/L4 policy admits it by the same ipBlock (a CIDR
// identity: no socket mark can carry one) and the backend sees its client.
// node-2's flows name the ipBlock (cidr:...) as the client's on the
// proxy's request, and the rule on the upstream connection into the pod.
func TestProxySteeringCIDR(t *testing.T) {
	for _, routing := range []string{"native", "tunnel"} {
		t.Run(routing, func(t *testing.T) {
			l := newLabNodes(t, 2, []string{"--routing", routing}, "testdata/steer-cidr.yaml")
			for _, c := range []struct{ via, client string }{
				{"http://192.168.123.2:30088", "192.168.123.254"}, // Local: the client's address
				{"http://192.168.123.1:30089", "10.244.0.1"},      // Cluster: node-1's
			} {
				eventually(t, "GET /public through "+c.via, "200", func() (string, string) { return httpFromOutside(l, c.via+"/public") })
				if status, body := httpFromOutside(l, c.via+"/admin"); status != "403" || !strings.Contains(body, "ShuntNetworkPolicy default/backend-cidr") {
					t.Errorf("GET /admin through %s: %s %q, want 403 naming the policy", c.via, status, body)
				}
				if status, body := httpFromOutside(l, c.via+"/remote"); status != "200" || !strings.HasPrefix(body, c.client+":") {
					t.Errorf("GET /remote through %s: %s %q, want 200 and the backend seeing %s", c.via, status, body, c.client)
				}
			}
			backend := l.podIP("backend")
			var fs []flows.Flow
			var cidrNamed, upstreamAdmitted bool
			deadline := time.Now().Add(20 * time.Second)
			for !(cidrNamed && upstreamAdmitted) && time.Now().Before(deadline) {
				httpFromOutside(l, "http://192.168.123.2:30088/public")
				time.Sleep(200 * time.Millisecond)
				fs = l.observe("--last", "5000", "--node", "node-2")
				for _, f := range fs {
					// The upstream connection into the pod, from the
					// client's address, admitted by the ipBlock's rule.
					if f.Point == "to-pod" && f.Verdict == "FORWARDED" && f.Event == "new" && f.Source.IP == "192.168.123.254" &&
						f.Destination.IP == backend && strings.Contains(f.Policy, "backend-cidr") {
						upstreamAdmitted = true
					}
					if f.HTTP != nil && f.HTTP.Path == "/public" && f.HTTP.Status == 200 && f.Source.IP == "192.168.123.254" &&
						strings.Contains(f.Policy, "backend-cidr") && hasLabel(f.Source, "cidr:192.168.123.254/32") {
						cidrNamed = true
					}
				}
			}
			if !cidrNamed || !upstreamAdmitted {
				t.Errorf("node-2's flows: the proxy's /public 200 naming cidr:192.168.123.254/32 and the rule %v, the upstream connection from the client's address admitted by it %v; want both:\n%s",
					cidrNamed, upstreamAdmitted, flowLines(fs))
			}
		})
	}
}
