package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The node L7 proxy end to end: HTTP policy, weighted routes, gRPC, flows,
// and the proxy surviving agent and proxy restarts. testdata/l7.yaml
// describes the pods, services, policy and routes.

type loadResult struct {
	Requests int            `json:"requests"`
	ByPod    map[string]int `json:"byPod"`
	ByStatus map[string]int `json:"byStatus"`
	Errors   int            `json:"errors"`
}

// inPod runs the shunt CLI inside a pod.
func (l *lab) shuntInPod(pod string, args ...string) (string, int) {
	return l.shunt(append([]string{"lab", "exec", pod, "--", filepath.Join(binDir, "shunt")}, args...)...)
}

// httpLoad sends n requests from pod over conns keep-alive connections.
func (l *lab) httpLoad(pod, url string, n, conns int, extra ...string) loadResult {
	l.t.Helper()
	args := append([]string{"lab", "http-load", "--url", url, "-n", fmt.Sprint(n), "-c", fmt.Sprint(conns)}, extra...)
	out, code := l.shuntInPod(pod, args...)
	var r loadResult
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 {
		l.t.Fatalf("http-load from %s to %s: exit %d, %v:\n%s", pod, url, code, err, out)
	}
	return r
}

// httpGet makes one request from pod and returns the status line and body
// ("" and the error output when no response came).
func (l *lab) httpGet(pod, method, url string) (status int, body string) {
	l.t.Helper()
	out, code := l.shuntInPod(pod, "lab", "http-get", "-X", method, url)
	if code != 0 {
		return 0, out
	}
	first, rest, _ := strings.Cut(out, "\n")
	fmt.Sscan(first, &status)
	return status, rest
}

type proxyStatus struct {
	Healthy  bool   `json:"healthy"`
	Version  uint64 `json:"version"`
	Wanted   uint64 `json:"wantedVersion"`
	Routes   int    `json:"routes"` // in the agent's latest configuration
	Requests uint64 `json:"requests"`
	PID      int    `json:"pid"`
}

func (l *lab) proxyStatus() proxyStatus {
	l.t.Helper()
	var st struct {
		Proxy proxyStatus `json:"proxy"`
	}
	if err := json.Unmarshal([]byte(l.mustShunt("status", "-o", "json")), &st); err != nil {
		l.t.Fatal(err)
	}
	return st.Proxy
}

// waitProxyConfigured waits until the proxy serves the latest configuration.
func (l *lab) waitProxyConfigured() {
	l.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := l.proxyStatus()
		if st.Healthy && st.Version >= st.Wanted && st.Wanted > 0 {
			return
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("the proxy is not configured: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestL7ProxyPolicyRoutesAndFlows(t *testing.T) {
	l := newLab(t, "redirect-peer", "testdata/l7.yaml")
	l.waitProxyConfigured()
	// Their readiness probes say when the servers answer; backend's
	// passes its HTTP policy, which no rule of it names the node in (the
	// node reaches its own pods, as at L4).
	l.waitReady("reviews-v1", "reviews-v2", "greeter", "backend")
	l.probe("monitoring", "connected", "--http", "http://"+l.podIP("backend")+":8080/")
	reviews, backend, greeter := l.clusterIP("reviews"), l.clusterIP("backend"), l.clusterIP("greeter-front")

	t.Run("split 90/10 per request on one connection", func(t *testing.T) {
		r := l.httpLoad("frontend", "http://"+reviews+":9080/", 2000, 1)
		share := float64(r.ByPod["reviews-v2"]) / float64(r.Requests) * 100
		if r.Errors != 0 || r.ByStatus["200"] != 2000 || math.Abs(share-10) > 3 {
			t.Errorf("2000 requests to reviews: %+v (v2 share %.1f%%), want 10%% ± 3 points, all 200", r, share)
		}
		// The proxy's metrics are served with the agent's.
		if n := l.metric("shunt_proxy_http_requests_total", `route="default/reviews-split"`); n < 2000 {
			t.Errorf("shunt_proxy_http_requests_total for the route: %v, want >= 2000", n)
		}
	})
	t.Run("RequestMirror: the backend answers, the mirror gets a copy", func(t *testing.T) {
		answered := func() float64 {
			return l.metric("shunt_proxy_mirrored_requests_total", `route="default/reviews-mirrored"`, `outcome="answered"`)
		}
		before := answered()
		r := l.httpLoad("frontend", "http://"+l.clusterIP("reviews-mirrored")+":9080/", 50, 1)
		if r.Errors != 0 || r.ByStatus["200"] != 50 || r.ByPod["reviews-v1"] != 50 {
			t.Errorf("50 requests to reviews-mirrored: %+v, want all 200 from reviews-v1 (the mirror's answers are thrown away)", r)
		}
		// The copies go on their own: wait for reviews-v2's answers.
		for deadline := time.Now().Add(5 * time.Second); answered()-before != 50; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("copies answered by the mirror reviews-v2: %v, want 50 (metrics: %v)", answered()-before,
					l.metric("shunt_proxy_mirrored_requests_total", `route="default/reviews-mirrored"`))
			}
		}
		// Each copy has a flow of its own (the proxy's flows reach the
		// agent's history a moment later).
		waitFor(t, 5*time.Second, "a flow of a copy to reviews-v2", func() bool {
			for _, f := range l.observe("--last", "2000", "--protocol", "http") {
				if f.Reason == "mirrored" && f.HTTP != nil && f.HTTP.Route == "default/reviews-mirrored" &&
					f.HTTP.Status == 200 && strings.HasSuffix(f.HTTP.BackendPod, "/reviews-v2") && f.Source.Pod == "default/frontend" {
					return true
				}
			}
			return false
		})
	})
	t.Run("header match overrides the weights", func(t *testing.T) {
		r := l.httpLoad("frontend", "http://"+reviews+":9080/", 50, 1, "-H", "x-canary: true")
		if r.ByPod["reviews-v2"] != 50 {
			t.Errorf("canary requests: %+v, want all 50 on reviews-v2", r)
		}
	})
	t.Run("HTTP policy matrix", func(t *testing.T) {
		for _, c := range []struct {
			pod, method, path string
			want              int
		}{
			{"frontend", "GET", "/metrics", 200},
			{"frontend", "GET", "/admin", 403},
			{"frontend", "POST", "/metrics", 403},
			{"monitoring", "GET", "/admin", 200},
			{"monitoring", "POST", "/metrics", 200},
		} {
			for _, addr := range []string{backend, l.podIP("backend")} { // through the service and directly
				status, body := l.httpGet(c.pod, c.method, "http://"+addr+":8080"+c.path)
				if status != c.want {
					t.Errorf("%s %s %s on %s: %d %q, want %d", c.pod, c.method, c.path, addr, status, body, c.want)
				}
				if status == 403 && !strings.Contains(body, "backend-http") {
					t.Errorf("403 body %q does not name the policy", body)
				}
			}
		}
		// policy trace answers the same questions without traffic.
		if out, code := l.shunt("policy", "trace", "--from", "frontend", "--to", "backend", "--port", "8080",
			"--http-method", "GET", "--http-path", "/admin"); code != 1 || !strings.Contains(out, "backend-http") {
			t.Errorf("trace of GET /admin: exit %d:\n%s", code, out)
		}
		if out, code := l.shunt("policy", "trace", "--from", "frontend", "--to", "backend", "--port", "8080",
			"--http-method", "GET", "--http-path", "/metrics"); code != 0 {
			t.Errorf("trace of GET /metrics: exit %d:\n%s", code, out)
		}
		// The 403s are flows with the rule's verdict.
		fs := l.observe("--protocol", "http", "--http-status", "403", "--last", "100")
		if len(fs) == 0 || fs[0].HTTP == nil || fs[0].Verdict != "DROPPED" || fs[0].Source.Pod != "default/frontend" {
			t.Errorf("403 flows: %+v", fs)
		}
	})
	t.Run("L4 first: a client no rule admits gets nothing, as without the proxy", func(t *testing.T) {
		// No rule of backend:8080 names intruder: dialling the pod or the
		// Service, its SYN is dropped (no handshake with the proxy, no
		// 403), and the drop is a flow naming the policy and the service.
		l.probe("intruder", "timeout", "--tcp", l.podIP("backend")+":8080")
		l.probe("intruder", "timeout", "--tcp", backend+":8080")
		if status, body := l.httpGet("intruder", "GET", "http://"+backend+":8080/metrics"); status != 0 {
			t.Errorf("intruder through the Service: %d %q, want no answer (its SYN dropped)", status, body)
		}
		viaService := false
		for _, f := range l.observe("--verdict", "DROPPED", "--from-pod", "default/intruder", "--last", "500") {
			if f.HTTP == nil && f.Point == "from-pod" && f.DropReason == "policy-not-allowed" &&
				f.Service != nil && f.Service.IP == backend && f.Service.Port == 8080 {
				viaService = true
			}
		}
		if !viaService {
			t.Errorf("no from-pod drop (policy-not-allowed) of intruder's SYN to %s:8080 in the flows", backend)
		}
		// A client admitted at L4 still gets its HTTP rules through the
		// Service (the policy matrix above asks more).
		if status, _ := l.httpGet("frontend", "GET", "http://"+backend+":8080/admin"); status != 403 {
			t.Errorf("frontend GET /admin through the Service: %d, want 403 (its HTTP rule)", status)
		}
		if status, _ := l.httpGet("frontend", "GET", "http://"+backend+":8080/metrics"); status != 200 {
			t.Errorf("frontend GET /metrics through the Service: %d, want 200", status)
		}
	})
	t.Run("a client denied at L4 by its own egress stays out of the proxy", func(t *testing.T) {
		// The backend's HTTP rule allows locked, its own egress policy does
		// not: its SYN to the proxy is dropped at its veth, as its SYN to
		// the backend would be.
		status, body := l.httpGet("locked", "GET", "http://"+backend+":8080/metrics")
		if status != 0 {
			t.Fatalf("locked through the Service: %d %q, want no answer", status, body)
		}
		found := false
		for _, f := range l.observe("--verdict", "DROPPED", "--from-pod", "default/locked", "--last", "500") {
			if f.HTTP == nil && f.Point == "from-pod" && f.Service != nil && f.Service.IP == backend {
				found = found || f.DropReason == "policy-not-allowed"
			}
		}
		if !found {
			t.Errorf("no drop of locked's SYN to %s:8080 at its veth (policy-not-allowed)", backend)
		}
	})
	t.Run("gRPC through a route to a selectorless parent", func(t *testing.T) {
		before := l.proxyStatus().Requests
		out, code := l.shuntInPod("frontend", "lab", "probe", "--grpc", greeter+":9090", "--timeout", "5s")
		if code != 0 || !strings.Contains(out, "greeter") {
			t.Errorf("gRPC health check through the route: exit %d:\n%s", code, out)
		}
		if l.proxyStatus().Requests <= before {
			t.Error("the gRPC call did not go through the proxy")
		}
	})
	t.Run("gRPC through a GRPCRoute", func(t *testing.T) {
		before := l.proxyStatus().Requests
		out, code := l.shuntInPod("frontend", "lab", "probe", "--grpc", l.clusterIP("greeter-grpc")+":9090", "--timeout", "5s")
		if code != 0 || !strings.Contains(out, "greeter") {
			t.Errorf("gRPC health check through the GRPCRoute: exit %d:\n%s", code, out)
		}
		if l.proxyStatus().Requests <= before {
			t.Error("the gRPC call did not go through the proxy")
		}
		// The proxy sends its flows every 50 ms.
		routed := func() bool {
			for _, f := range l.observe("--protocol", "http", "--http-path", "/grpc.health.v1.Health/Check", "--last", "200") {
				if f.HTTP != nil && f.HTTP.Route == "default/greeter-grpc" {
					return true
				}
			}
			return false
		}
		deadline := time.Now().Add(3 * time.Second)
		for !routed() {
			if time.Now().After(deadline) {
				t.Fatal("no flow of /grpc.health.v1.Health/Check by the route default/greeter-grpc")
			}
			time.Sleep(100 * time.Millisecond)
		}
		// `shunt get` shows the route with the status the mesh controller
		// gave it.
		// The rule's RequestMirror copied the call, its streamed body
		// teed, and the copy was answered.
		waitFor(t, 5*time.Second, "the gRPC call's copy answered", func() bool {
			return l.metric("shunt_proxy_mirrored_requests_total", `route="default/greeter-grpc"`, `outcome="answered"`) >= 1
		})
		out = l.mustShunt("get", "grpcroutes", "greeter-grpc")
		if !strings.Contains(strings.Join(strings.Fields(out), " "), "greeter-grpc greeter-grpc:9090 greeter:9090=1 True True") {
			t.Errorf("shunt get grpcroutes greeter-grpc:\n%s", out)
		}
	})
	t.Run("connections without L7 rules never reach the proxy", func(t *testing.T) {
		// Not the proxy's request counter: the kubelet's readiness probe
		// of backend (a port with HTTP rules) passes the proxy every
		// second. The proxy reports every request it handles as an HTTP
		// flow: none may carry this load's path.
		r := l.httpLoad("frontend", "http://"+l.clusterIP("reviews-v1")+":9080/without-l7-rules", 50, 2)
		if r.ByPod["reviews-v1"] != 50 {
			t.Errorf("direct service: %+v", r)
		}
		time.Sleep(time.Second) // the proxy sends its flows every 50 ms
		if fs := l.observe("--protocol", "http", "--http-path", "/without-l7-rules", "--last", "5000"); len(fs) != 0 {
			t.Errorf("%d of the requests to a service without routes or HTTP rules went through the proxy, e.g. %+v", len(fs), fs[0])
		}
	})
	t.Run("socket acceleration through the proxy", func(t *testing.T) {
		// Both legs join the sockhash (the client's connection to the
		// proxy, the proxy's marked upstream connection), and the proxy
		// still sees and decides every request: the split holds, HTTP
		// denials hold, an L4-denied client is still dropped.
		l.mustShunt("accel", "on")
		defer l.mustShunt("accel", "off")
		before := l.status()
		r := l.httpLoad("frontend", "http://"+reviews+":9080/", 200, 1)
		if r.ByStatus["200"] != 200 || r.ByPod["reviews-v2"] < 10 || r.ByPod["reviews-v2"] > 30 {
			t.Errorf("200 requests through the proxy, accelerated: %+v, want all 200 and the 90/10 split", r)
		}
		if status, _ := l.httpGet("frontend", "GET", "http://"+backend+":8080/admin"); status != 403 {
			t.Errorf("frontend GET /admin through the accelerated proxy: %d, want 403", status)
		}
		l.probe("intruder", "timeout", "--tcp", backend+":8080")
		if status, _ := l.httpGet("locked", "GET", "http://"+backend+":8080/metrics"); status == 200 {
			t.Error("locked got through the accelerated proxy")
		}
		after := l.status()
		added := after.counter("accel-added", "sockmsg") - before.counter("accel-added", "sockmsg")
		moved := after.counter("accel-redirected", "sockmsg") - before.counter("accel-redirected", "sockmsg")
		t.Logf("accel-added +%d, accel-redirected +%d", added, moved)
		// At least the client leg of each load connection; the proxy's
		// upstream connections are pooled, so some predate acceleration.
		if added < 2 || moved < 400 {
			t.Errorf("accel-added +%d, accel-redirected +%d: want the proxied connection accelerated (>= 2 sockets, >= 400 sends)", added, moved)
		}
	})
}

// TestL7ProxySurvivesRestarts: an agent restart during a long proxied
// stream of requests drops none, also while the new agent's source is held
// back for seconds (its endpoints restored, no objects yet: the proxy
// keeps the configuration it had, and the new agent's first push is
// complete); a proxy restart drains the old proxy without failing requests
// of other connections.
func TestL7ProxySurvivesRestarts(t *testing.T) {
	l := newLab(t, "redirect-peer", "testdata/l7.yaml")
	l.waitProxyConfigured()
	l.waitReady("reviews-v1", "reviews-v2")
	url := "http://" + l.clusterIP("reviews") + ":9080/"

	run := func(what string, during func()) {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", "frontend", "--",
			filepath.Join(binDir, "shunt"), "lab", "http-load", "--url", url, "-n", "6000", "-c", "2", "--rate", "400")
		var out strings.Builder
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		during()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: http-load: %v\n%s", what, err, out.String())
		}
		var r loadResult
		if err := json.Unmarshal([]byte(out.String()), &r); err != nil || r.Errors != 0 || r.ByStatus["200"] != 6000 {
			t.Errorf("%s: %+v (%v), want 6000 answered requests and no error", what, r, err)
		}
	}
	var pushedBefore uint64
	run("agent restart", func() {
		pid, before := l.status().PID, l.proxyStatus().Version
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid)
		// The new agent loads, then waits 3 s before its source starts
		// (`lab up` returns after): the load (15 s from 2 s before the
		// restart) runs through that window.
		os.Setenv("SHUNT_TEST_HOLD_SOURCE", "3s")
		defer os.Unsetenv("SHUNT_TEST_HOLD_SOURCE")
		l.mustShunt("lab", "up")
		os.Unsetenv("SHUNT_TEST_HOLD_SOURCE")
		pushedBefore = before
	})
	l.waitProxyConfigured()
	if st := l.proxyStatus(); st.Routes == 0 || st.Version <= pushedBefore {
		t.Errorf("after the agent restart: %+v, want the new agent's configuration (newer than version %d) with its routes", st, pushedBefore)
	}
	run("proxy restart", func() {
		old := l.proxyStatus().PID
		l.mustShunt("proxy", "restart")
		if st := l.proxyStatus(); st.PID == old || !st.Healthy {
			t.Errorf("proxy after restart: %+v (old pid %d)", st, old)
		}
	})
}

// TestBringYourOwnProxy: a pod asks that its port 7000 go to its own proxy
// on 15006 (a Python script, as a third-party sidecar would be): the proxy
// reads the dialled address with SO_ORIGINAL_DST, its marked upstream
// connection reaches the server instead of being redirected again, and a
// client the pod's policy does not allow on 7000 stays out.
func TestBringYourOwnProxy(t *testing.T) {
	requireRoot(t)
	manifest, log := byopManifest(t, "", `
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers: [{name: c, command: ["shunt", "lab", "serve", "--tcp", "7000"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: other, labels: {app: other}}
spec:
  containers: [{name: c, command: ["shunt", "lab", "serve", "--tcp", "7000"]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-client}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{port: 7000}]}]
`)
	l := newLab(t, "redirect-peer", manifest)
	server := l.podIP("server")
	l.probe("client", "connected", "--tcp", server+":7000", "--send", "hello")
	got := readFile(log)
	if !strings.Contains(got, "orig="+server+":7000 upstream="+server+":7000") {
		t.Errorf("the pod's proxy log %q: want the dialled address from SO_ORIGINAL_DST and a direct upstream", got)
	}
	lines := strings.Count(got, "\n")
	l.probe("other", "timeout", "--tcp", server+":7000")
	if now := strings.Count(readFile(log), "\n"); now != lines {
		t.Errorf("a client the policy does not allow on 7000 reached the pod's proxy: %q", readFile(log))
	}
}

// byopManifest writes a manifest of a pod "server" (on node, if given)
// whose port 7000 goes to its own proxy on 15006 (testdata/byop.py, which
// logs each connection to the file returned) and the objects in rest.
func byopManifest(t *testing.T, node, rest string) (manifest, log string) {
	t.Helper()
	dir := t.TempDir()
	script, _ := filepath.Abs("testdata/byop.py")
	log, manifest = filepath.Join(dir, "byop.log"), filepath.Join(dir, "byop.yaml")
	nodeName := ""
	if node != "" {
		nodeName = "nodeName: " + node
	}
	writeFile(t, manifest, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata:
  name: server
  labels: {app: server}
  annotations: {shunt.io/inbound-redirect: "7000:15006"}
spec:
  %s
  containers:
  - {name: app, command: ["shunt", "lab", "serve", "--tcp", "7000"]}
  # SO_MARK needs NET_ADMIN, as a sidecar proxy's does
  - {name: proxy, command: ["python3", %q, "15006", "0x5e000000", %q], securityContext: {capabilities: {add: [NET_ADMIN]}}}
---`, nodeName, script, log)+rest)
	return manifest, log
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBringYourOwnProxyRemote: the clients of a pod with its own proxy
// (shunt.io/inbound-redirect 7000:15006) that no socket hook of its node
// sees, a pod of another node (native routing and the overlay) and the
// host outside through a Local NodePort, reach that proxy too: tc on the
// pod's node sends their connections to 15006 and files the dialled
// address, which the proxy reads with SO_ORIGINAL_DST, and the answers
// leave from 7000. A client the pod's policy does not allow on 7000 stays
// out, as before.
func TestBringYourOwnProxyRemote(t *testing.T) {
	for _, routing := range []string{"native", "tunnel"} {
		t.Run(routing, func(t *testing.T) {
			manifest, log := byopManifest(t, "node-2", `
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  nodeName: node-1
  containers: [{name: c, command: ["sleep", "infinity"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: other, labels: {app: other}}
spec:
  nodeName: node-1
  containers: [{name: c, command: ["sleep", "infinity"]}]
---
apiVersion: v1
kind: Service
metadata: {name: server}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {app: server}
  ports: [{port: 7000, targetPort: 7000, nodePort: 30070}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-client}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}, {ipBlock: {cidr: 192.168.123.254/32}}]
    ports: [{port: 7000}]
`)
			l := newLabNodes(t, 2, []string{"--routing", routing}, manifest)
			server := l.podIP("server")
			lines := func() int { return strings.Count(readFile(log), "orig="+server+":7000 ") }
			l.probe("client", "connected", "--tcp", server+":7000", "--send", "hello")
			if lines() != 1 {
				t.Errorf("after the pod of node-1 connected: the pod's proxy log %q, want one connection for %s:7000", readFile(log), server)
			}
			out, code := l.shunt("lab", "exec", "--external", "--", filepath.Join(binDir, "shunt"), "lab", "probe", "--timeout", "2s",
				"--expect", "connected", "--tcp", "192.168.123.2:30070", "--send", "hello")
			if code != 0 || lines() != 2 {
				t.Errorf("the host outside through the NodePort: exit %d %s; the pod's proxy log %q, want a second connection", code, out, readFile(log))
			}
			l.probe("other", "timeout", "--tcp", server+":7000")
			if lines() != 2 {
				t.Errorf("a client the policy does not allow on 7000 reached the pod's proxy: %q", readFile(log))
			}
		})
	}
}
