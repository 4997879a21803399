package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const servicesManifest = "testdata/services.yaml"

func (l *lab) clusterIP(svc string) string {
	l.t.Helper()
	var s struct {
		Spec struct {
			ClusterIP string `json:"clusterIP"`
		}
	}
	if err := json.Unmarshal([]byte(l.mustShunt("get", "svc", svc, "-o", "json")), &s); err != nil {
		l.t.Fatal(err)
	}
	return s.Spec.ClusterIP
}

type probeResult struct {
	Proto, Result, Peer, Local, Remote, Error string
	Start                                     time.Time
}

// probeJSON runs a probe (in pod, or on the node for "") and decodes every attempt.
func (l *lab) probeJSON(pod string, args ...string) []probeResult {
	l.t.Helper()
	args = append([]string{"lab", "probe", "-o", "json", "--expect", "any", "--timeout", "2s"}, args...)
	if pod != "" {
		args = append([]string{"lab", "exec", pod, "--", filepath.Join(binDir, "shunt")}, args...)
	}
	out := l.mustShunt(args...)
	var rs []probeResult
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r probeResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			l.t.Fatalf("probe output %q: %v", line, err)
		}
		rs = append(rs, r)
	}
	return rs
}

// probeRefusedByHooks checks that the socket hooks refuse the targets:
// with ECONNREFUSED, or with EPERM where the agent runs without
// bpf_set_retval (the no-set-retval kernel fallback, as status says).
func (l *lab) probeRefusedByHooks(pod string, targets ...string) {
	l.t.Helper()
	if !slices.Contains(l.status().Kernel.Fallbacks, "no-set-retval") {
		l.probe(pod, "refused", targets...)
		return
	}
	for _, r := range l.probeJSON(pod, targets...) {
		if r.Result != "error" || !strings.Contains(r.Error, "operation not permitted") {
			l.t.Errorf("probe from %q %v without bpf_set_retval: %s (%s), want error EPERM (operation not permitted)",
				pod, targets, r.Result, r.Error)
		}
	}
}

func peers(rs []probeResult) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		if r.Result == "connected" {
			m[r.Peer]++
		} else {
			m[r.Result+": "+r.Error]++
		}
	}
	return m
}

// waitWebServes waits until both web pods of servicesManifest listen (TCP
// api port and UDP 5353). A container counts as ready once it runs, as in
// Kubernetes without a readinessProbe, so a backend can be in a service
// before its server has bound its port; tests that count answers wait.
//
// Both must also be backends of the service: with an API server the
// EndpointSlice controller adds each pod once its Ready condition reaches
// it, which a loaded machine delays past the servers' start.
func (l *lab) waitWebServes() {
	l.t.Helper()
	l.probe("client", "connected", "--tcp", l.podIP("web-1")+":8080", "--tcp", l.podIP("web-2")+":8081",
		"--udp", l.podIP("web-1")+":5353", "--udp", l.podIP("web-2")+":5353")
	deadline := time.Now().Add(30 * time.Second)
	for {
		dump := l.mustShunt("map", "dump", "services")
		if strings.Contains(dump, l.podIP("web-1")+":8080 (#") && strings.Contains(dump, l.podIP("web-2")+":8081 (#") {
			return
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("web-1 and web-2 are not both backends of web after 30 s:\n%s", dump)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestServiceClusterIP(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		l := startLab(servicesManifest)
		vip := l.clusterIP("web")
		l.waitWebServes()

		for _, from := range []string{"client", ""} { // a pod, and the node itself
			got := peers(l.probeJSON(from, "--tcp", vip+":80", "--count", "30"))
			if got["web-1"] == 0 || got["web-2"] == 0 || got["web-1"]+got["web-2"] != 30 {
				t.Errorf("from %q: TCP to %s:80 not spread over both backends: %v", from, vip, got)
			}
			got = peers(l.probeJSON(from, "--udp", vip+":53", "--count", "30"))
			if got["web-1"] == 0 || got["web-2"] == 0 || got["web-1"]+got["web-2"] != 30 {
				t.Errorf("from %q: UDP to %s:53 not spread over both backends: %v", from, vip, got)
			}
			l.probe(from, "connected", "--http", "http://"+vip+":8000/")
		}

		// Applications see the address they dialled: getpeername for TCP and
		// connected UDP, the reply's source for unconnected UDP.
		for _, args := range [][]string{{"--tcp", vip + ":80"}, {"--udp", vip + ":53"}, {"--udp", vip + ":53", "--udp-connected"}} {
			r := l.probeJSON("client", args...)[0]
			want := args[1]
			if r.Result != "connected" || r.Remote != want {
				t.Errorf("%v: result %s, peer address seen by the app %q, want %q", args, r.Result, r.Remote, want)
			}
		}

		// Named targetPort resolves per pod: web-1 serves api on 8080, web-2 on 8081.
		dump := l.mustShunt("map", "dump", "services")
		if !strings.Contains(dump, ":8080 (#") || !strings.Contains(dump, ":8081 (#") {
			t.Errorf("named targetPort not resolved per pod:\n%s", dump)
		}

		// No endpoints: refused at once, TCP and UDP, not a timeout.
		empty := l.clusterIP("empty")
		start := time.Now()
		l.probeRefusedByHooks("client", "--tcp", empty+":80", "--udp", empty+":53")
		if d := time.Since(start); d > time.Second {
			t.Errorf("refusing a service without endpoints took %s", d)
		}

		// The socket hooks count their decisions, by hook, in the metrics and
		// in status.
		for _, c := range []struct{ reason, hook string }{
			{"sock-translated", "connect"}, {"sock-translated", "sendmsg"}, {"sock-refused", "connect"},
			{"sock-restored", "getpeername"}, {"sock-restored", "recvmsg"},
		} {
			if l.metric("shunt_datapath_packets_total", `reason="`+c.reason+`"`, `direction="`+c.hook+`"`) == 0 {
				t.Errorf("no %s counted for %s in the metrics", c.reason, c.hook)
			}
		}
		if out := l.mustShunt("status"); !strings.Contains(out, "sock-refused") || !strings.Contains(out, "calls") {
			t.Errorf("status does not show the socket hooks' counters:\n%s", out)
		}
	})
}

func TestServiceDNSThroughClusterIP(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		l := startLab(servicesManifest, "testdata/dns.yaml")
		vip := l.clusterIP("dns")
		dig := []string{"dig", "@" + vip, "web.shunt.test", "+short", "+time=1", "+tries=3"}
		var out string
		for i := 0; i < 20; i++ { // dnsmasq needs a moment to bind
			o, code := l.shunt(append([]string{"lab", "exec", "client", "--"}, dig...)...)
			if out = o; code == 0 && strings.TrimSpace(o) == "10.1.2.3" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if strings.TrimSpace(out) != "10.1.2.3" {
			t.Errorf("dig @%s from a pod: %q", vip, out)
		}
		node, err := exec.Command(dig[0], dig[1:]...).CombinedOutput()
		if strings.TrimSpace(string(node)) != "10.1.2.3" {
			t.Errorf("dig @%s from the node: %q %v", vip, node, err)
		}
	})
}

func TestServiceAffinity(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		l := startLab(servicesManifest, "testdata/affinity.yaml")
		vip := l.clusterIP("sticky")
		l.waitWebServes()
		got := peers(l.probeJSON("client", "--tcp", vip+":80", "--count", "20"))
		if len(got) != 1 {
			t.Errorf("within the affinity timeout one client must stick to one backend: %v", got)
		}
		// After the timeout (1s) a new choice is made: over several expiries,
		// both backends must show up (all the same: probability 2^-9).
		seen := map[string]int{}
		for i := 0; i < 10 && len(seen) < 2; i++ {
			time.Sleep(1100 * time.Millisecond)
			for p := range peers(l.probeJSON("client", "--tcp", vip+":80")) {
				seen[p]++
			}
		}
		if len(seen) < 2 {
			t.Errorf("affinity never moved after its timeout: %v", seen)
		}
	})
}

// The first endpoint's conditions in the hand-written slices below: ready,
// then terminating as the EndpointSlice controller writes a terminating
// pod (not ready, still serving; kube-proxy, like shunt, goes by ready).
const (
	endpointReady       = "{ready: true, terminating: false}"
	endpointTerminating = "{ready: false, serving: true, terminating: true}"
)

func TestServiceEndpointChangesKeepConnections(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		l := startLab(servicesManifest)
		dir := t.TempDir()
		ip1, ip2 := l.podIP("web-1"), l.podIP("web-2")
		slice := func(name, conditions1 string, withSecond bool) string {
			p := filepath.Join(dir, name)
			doc := `apiVersion: v1
kind: Service
metadata: {name: manual}
spec:
  ports: [{name: api, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: manual-1, labels: {kubernetes.io/service-name: manual}}
addressType: IPv4
ports: [{name: api, port: 8080}]
endpoints:
- addresses: [` + ip1 + `]
  conditions: ` + conditions1 + `
`
			if withSecond {
				doc += `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: manual-2, labels: {kubernetes.io/service-name: manual}}
addressType: IPv4
ports: [{name: api, port: 8081}]
endpoints:
- addresses: [` + ip2 + `]
`
			}
			os.WriteFile(p, []byte(doc), 0o644)
			return p
		}
		l.apply(slice("one.yaml", endpointReady, false))
		vip := l.clusterIP("manual")
		if got := peers(l.probeJSON("client", "--tcp", vip+":80", "--count", "10")); got["web-1"] != 10 {
			t.Fatalf("one endpoint: %v", got)
		}

		// A connection held open across the changes must keep working.
		held, heldOut := l.holdConnection("client", vip+":80", "3s")

		// Scale up, then mark the first endpoint terminating: new connections
		// go to web-2 only.
		l.apply(slice("two.yaml", endpointReady, true))
		if got := peers(l.probeJSON("client", "--tcp", vip+":80", "--count", "20")); got["web-1"] == 0 || got["web-2"] == 0 {
			t.Errorf("scaled to two endpoints: %v", got)
		}
		l.apply(slice("term.yaml", endpointTerminating, true))
		if got := peers(l.probeJSON("client", "--tcp", vip+":80", "--count", "10")); got["web-2"] != 10 {
			t.Errorf("web-1 terminating: new connections %v, want all on web-2", got)
		}
		if err := held.Wait(); err != nil {
			t.Errorf("held connection broke while endpoints changed: %v\n%s", err, heldOut)
		}

		// A service deleted while a connection runs leaves the connection running.
		held, heldOut = l.holdConnection("client", vip+":80", "2s")
		l.delete(slice("term.yaml", endpointTerminating, true))
		if err := held.Wait(); err != nil {
			t.Errorf("held connection broke when its service was deleted: %v\n%s", err, heldOut)
		}
		if out := l.mustShunt("get", "endpointslices"); strings.Contains(out, "manual") {
			t.Errorf("slices of a deleted service remain:\n%s", out)
		}
	})
}

// holdConnection starts, in the background, a probe from pod that connects,
// talks, holds the connection for hold, then talks again; Wait reports
// whether the connection survived.
func (l *lab) holdConnection(pod, target, hold string) (*exec.Cmd, *strings.Builder) {
	l.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", pod, "--",
		filepath.Join(binDir, "shunt"), "lab", "probe", "--tcp", target, "--hold", hold, "--timeout", "2s")
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // connected and holding
	return cmd, out
}

func TestServiceBadInput(t *testing.T) {
	l := newLab(t, "redirect-peer", servicesManifest)
	dir := t.TempDir()
	taken := l.clusterIP("web")
	cases := []struct{ name, doc, want string }{
		{"overlap.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: clash}\nspec: {clusterIP: " + taken + ", ports: [{port: 80}]}\n",
			"spec.clusterIP: " + taken + " is already allocated to Service default/web"},
		{"outside.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: far}\nspec: {clusterIP: 192.0.2.77, ports: [{port: 80}]}\n",
			"is not in the service CIDR"},
		{"immutable.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: " + strings.TrimSuffix(l.serviceCIDR, "0/24") + "200, selector: {app: web}, ports: [{name: api, port: 80, targetPort: api}]}\n",
			"spec.clusterIP: field is immutable"},
		{"orphan.yaml", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: o, labels: {kubernetes.io/service-name: ghost}}\naddressType: IPv4\nendpoints: []\n",
			`service "ghost" not found`},
		{"proto.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: icmp}\nspec: {ports: [{port: 80, protocol: ICMP}]}\n",
			`proto.yaml#1: Service default/icmp: spec.ports[0].protocol: unsupported protocol "ICMP"`},
		{"range.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: big}\nspec: {ports: [{port: 70000}]}\n",
			"spec.ports[0].port: 70000 is out of range"},
	}
	for _, c := range cases {
		p := filepath.Join(dir, c.name)
		os.WriteFile(p, []byte(c.doc), 0o644)
		out, code := l.shunt("apply", "-f", p)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d:\n%s\nwant %q", c.name, code, out, c.want)
		}
	}
	if out := l.mustShunt("get", "svc"); strings.Contains(out, "clash") || strings.Contains(out, "far") {
		t.Errorf("a rejected service was applied:\n%s", out)
	}
	l.probe("client", "connected", "--tcp", taken+":80")
}

// TestConnectedUDPSocketLeavesDeletedBackend: a connected UDP socket keeps
// the backend its connect was translated to; when that backend's pod is
// deleted the datapath closes the socket (the application sees an error at
// once and can connect again, through the service, to a live backend)
// instead of letting it send into the void.
func TestConnectedUDPSocketLeavesDeletedBackend(t *testing.T) {
	l := newLab(t, "redirect-peer", servicesManifest)
	vip := l.clusterIP("web")
	l.waitWebServes() // a backend not listening yet would end the held socket with port unreachable
	cmd := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", "client", "--",
		filepath.Join(binDir, "shunt"), "lab", "probe", "-o", "json", "--expect", "any",
		"--udp", vip+":53", "--udp-connected", "--hold", "4s", "--timeout", "2s")
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The kernel knows the backend the socket really talks to.
	var backend string
	for i := 0; i < 30 && backend == ""; i++ {
		time.Sleep(100 * time.Millisecond)
		for _, f := range strings.Fields(l.mustShunt("lab", "exec", "client", "--", "ss", "-Hnu", "state", "established")) {
			if strings.HasSuffix(f, ":5353") {
				backend = strings.TrimSuffix(f, ":5353")
			}
		}
	}
	victim, survivor := "web-1", "web-2"
	switch backend {
	case l.podIP("web-1"):
	case l.podIP("web-2"):
		victim, survivor = survivor, victim
	default:
		cmd.Process.Kill()
		t.Fatalf("no connected UDP socket to a backend found in the client (ss saw %q)", backend)
	}
	doc := filepath.Join(t.TempDir(), "victim.yaml")
	os.WriteFile(doc, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: "+victim+"}\nspec: {containers: [{name: serve, command: [sleep]}]}\n"), 0o644)
	start := time.Now()
	l.mustShunt("delete", "-f", doc)
	cmd.Wait()
	var r probeResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out.String())), &r); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	if r.Result != "error" || !strings.Contains(r.Error, "socket broken after hold") ||
		!(strings.Contains(r.Error, "connection abort") || strings.Contains(r.Error, "destination address required")) {
		t.Errorf("the socket to deleted %s: %+v, want it closed by the datapath", victim, r)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("the probe ended %v after the delete: it waited for a timeout", took)
	}
	if got := peers(l.probeJSON("client", "--udp", vip+":53", "--udp-connected", "--count", "4")); got[survivor] != 4 {
		t.Errorf("after deleting %s, new sockets reach %v, want all %s", victim, got, survivor)
	}
	if n := l.metric("shunt_udp_sockets_destroyed_total"); n < 1 {
		t.Errorf("shunt_udp_sockets_destroyed_total = %v", n)
	}
}
