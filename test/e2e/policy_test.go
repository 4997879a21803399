package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/shuntnet/shunt/internal/labtools"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/netnsrun"
)

// The NetworkPolicy matrix: namespaces x and z, pods a, b, c in each, every
// pod serving TCP and UDP on ports 80 and 81 (named serve-80-tcp, ...).
// For each policy set, every pod probes every other pod on every port and
// protocol, and the outcome must equal what the oracle (written from the
// API reference, netpol_oracle_test.go) says.

var matrixPorts = []struct {
	proto corev1.Protocol
	port  int32
}{{corev1.ProtocolTCP, 80}, {corev1.ProtocolTCP, 81}, {corev1.ProtocolUDP, 80}, {corev1.ProtocolUDP, 81}}

func matrixNamespace(name string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s, labels: {ns: %s}}\n", name, name)
}

func matrixPod(ns, name, podLabel string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {pod: %s}}
spec:
  containers:
  - name: serve
    command: [shunt, lab, serve, --tcp, "80,81", --udp, "80,81"]
    ports:
    - {name: serve-80-tcp, containerPort: 80}
    - {name: serve-81-tcp, containerPort: 81}
    - {name: serve-80-udp, containerPort: 80, protocol: UDP}
    - {name: serve-81-udp, containerPort: 81, protocol: UDP}
`, name, ns, podLabel)
}

type matrix struct {
	*lab
	t    *testing.T
	dir  string
	pods map[string]*oraclePod // ns/name
	ns   map[string]map[string]string
	// udpAllowed: when each UDP flow (source pod, source port, target)
	// last got through. A later probe that happens to reuse the flow's
	// 5-tuple within conntrack's 60 s is that flow still established,
	// which a policy change does not cut (as Kubernetes allows).
	udpAllowed map[string]time.Time
}

// udpFlowTimeout is conntrack's lifetime of a UDP flow (CT_TIMEOUT_OTHER).
const udpFlowTimeout = 60 * time.Second

func udpFlowKey(src *oraclePod, local, target string) string {
	_, port, _ := net.SplitHostPort(local)
	return src.Namespace + "/" + src.Name + ":" + port + "->" + target
}

func newMatrix(t *testing.T, startLab labStarter) *matrix {
	dir := t.TempDir()
	docs := []string{matrixNamespace("x"), matrixNamespace("z")}
	for _, ns := range []string{"x", "z"} {
		for _, p := range []string{"a", "b", "c"} {
			docs = append(docs, matrixPod(ns, p, p))
		}
	}
	file := filepath.Join(dir, "pods.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &matrix{lab: startLab(file), t: t, dir: dir, pods: map[string]*oraclePod{}, udpAllowed: map[string]time.Time{},
		ns: map[string]map[string]string{}}
	for _, ns := range []string{"x", "z"} {
		m.ns[ns] = map[string]string{"ns": ns, "kubernetes.io/metadata.name": ns}
		for _, p := range []string{"a", "b", "c"} {
			m.addPod(ns, p, p)
		}
	}
	// Every server must answer before policies are judged.
	deadline := time.Now().Add(5 * time.Second)
	for {
		bad := m.compare("no policy", oracle{nsLabels: m.ns}, false)
		if len(bad) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("without policy not every pod reaches every other:\n%s", strings.Join(bad, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return m
}

func (m *matrix) addPod(ns, name, podLabel string) {
	p := &oraclePod{Namespace: ns, Name: name, Labels: map[string]string{"pod": podLabel},
		IP: netip.MustParseAddr(m.podIPIn(ns, name))}
	for _, port := range matrixPorts {
		p.Ports = append(p.Ports, corev1.ContainerPort{
			Name: fmt.Sprintf("serve-%d-%s", port.port, strings.ToLower(string(port.proto))), ContainerPort: port.port, Protocol: port.proto})
	}
	m.pods[ns+"/"+name] = p
}

// waitServing waits until a pod's servers answer the node, which policy
// always lets through: a new pod's process needs a moment to listen.
func (m *matrix) waitServing(p *oraclePod) {
	m.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, pp := range matrixPorts {
		target := fmt.Sprintf("%s:%d", p.IP, pp.port)
		for {
			var r labtools.Result
			m.onNode(func() {
				r = labtools.Probe(strings.ToLower(string(pp.proto)), target, labtools.ProbeOptions{Timeout: 500 * time.Millisecond, Send: "ping"})
			})
			if r.Result == labtools.Connected {
				break
			}
			if time.Now().After(deadline) {
				m.t.Fatalf("%s/%s does not answer on %s/%s from the node: %s %s", p.Namespace, p.Name, target, pp.proto, r.Result, r.Error)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// onNode runs f on the lab's node: in its network namespace, if it has
// one of its own.
func (l *lab) onNode(f func()) {
	l.t.Helper()
	if l.netns == "" {
		f()
		return
	}
	if err := netnsrun.Do("/run/netns/"+l.netns, func() error { f(); return nil }); err != nil {
		l.t.Fatal(err)
	}
}

// podIPIn waits for a pod's address: with Kubernetes, the lab kubelet
// writes it through the API server a moment after the pod is created.
func (l *lab) podIPIn(ns, name string) string {
	l.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var list podList
		if err := json.Unmarshal([]byte(l.mustShunt("get", "pods", "-n", ns, "-o", "json")), &list); err != nil {
			l.t.Fatal(err)
		}
		listed := false
		for _, p := range list.Items {
			if p.Metadata.Name == name {
				if p.Status.PodIP != "" {
					return p.Status.PodIP
				}
				listed = true
			}
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("pod %s/%s has no address after 20 s (listed: %v)", ns, name, listed)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probeFrom runs one labtools probe inside a pod's network namespace.
func (l *lab) probeFrom(ns, pod, proto, target string) labtools.Result {
	var r labtools.Result
	if err := l.inPod(ns, pod, func() error {
		r = labtools.Probe(proto, target, labtools.ProbeOptions{Timeout: time.Second, Send: "ping"})
		return nil
	}); err != nil {
		return labtools.Result{Result: labtools.Failed, Error: err.Error()}
	}
	return r
}

// compare probes every pair and port at once and lists the disagreements
// with the oracle.
func (m *matrix) compare(name string, o oracle, report bool) []string {
	type probe struct {
		src, dst *oraclePod
		proto    corev1.Protocol
		port     int32
		got      bool
		detail   string
		flow     string    // UDP: source pod, source port and target
		at       time.Time // when the attempt began
	}
	var probes []*probe
	for _, src := range m.pods {
		for _, dst := range m.pods {
			if src == dst {
				continue
			}
			for _, pp := range matrixPorts {
				probes = append(probes, &probe{src: src, dst: dst, proto: pp.proto, port: pp.port})
			}
		}
	}
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := fmt.Sprintf("%s:%d", p.dst.IP, p.port)
			r := m.probeFrom(p.src.Namespace, p.src.Name, strings.ToLower(string(p.proto)), target)
			p.got = r.Result == labtools.Connected
			p.detail = r.Result + " " + r.Error
			if p.proto == corev1.ProtocolUDP {
				p.flow, p.at = udpFlowKey(p.src, r.Local, target), r.Start
			}
		}()
	}
	wg.Wait()
	var bad []string
	for _, p := range probes {
		want := o.allowed(*p.src, *p.dst, p.proto, p.port)
		if last, ok := m.udpAllowed[p.flow]; p.got && !want && ok && p.at.Sub(last) < udpFlowTimeout {
			m.t.Logf("%s: %s/%s -> %s/%s %d/UDP got through on the 5-tuple of a flow allowed %s earlier, still in conntrack: not a verdict on the new policy",
				name, p.src.Namespace, p.src.Name, p.dst.Namespace, p.dst.Name, p.port, p.at.Sub(last).Round(time.Millisecond))
			continue
		}
		if p.got && p.flow != "" {
			m.udpAllowed[p.flow] = p.at
		}
		if p.got != want {
			bad = append(bad, fmt.Sprintf("  %s: %s/%s -> %s/%s %d/%s: got %s, want allowed=%v (UDP flow %q)", name,
				p.src.Namespace, p.src.Name, p.dst.Namespace, p.dst.Name, p.port, p.proto, p.detail, want, p.flow))
		}
	}
	sort.Strings(bad)
	if report && len(bad) > 0 {
		m.t.Errorf("%s: %d of %d probes disagree with the NetworkPolicy oracle:\n%s", name, len(bad), len(probes), strings.Join(bad, "\n"))
	}
	return bad
}

// apply writes docs to a file, applies it and returns the policies in it
// (with API defaults) for the oracle.
func (m *matrix) apply(name string, docs ...string) (string, []*networkingv1.NetworkPolicy) {
	file := filepath.Join(m.dir, strings.ReplaceAll(name, " ", "-")+".yaml")
	text := strings.Join(docs, "---\n")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		m.t.Fatal(err)
	}
	m.lab.apply(file)
	objs, err := manifest.Parse(file, []byte(text))
	if err != nil {
		m.t.Fatal(err)
	}
	var nps []*networkingv1.NetworkPolicy
	for _, o := range objs {
		if np, ok := o.Obj.(*networkingv1.NetworkPolicy); ok {
			nps = append(nps, np)
		}
	}
	return file, nps
}

func netpol(ns, name, spec string) string {
	return fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: %s, namespace: %s}\nspec:\n%s\n", name, ns, spec)
}

// inEverySource is inBothSources and a lab of two nodes ("lab-nodes"),
// where the pods are spread over both: most pairs cross nodes, and the
// receiving node judges ingress with the identity the packet carries.
func inEverySource(t *testing.T, body func(t *testing.T, startLab labStarter)) {
	inBothSources(t, body)
	t.Run("lab-nodes", func(t *testing.T) {
		body(t, func(manifests ...string) *lab { return newLabNodes(t, 2, nil, manifests...) })
	})
}

func TestNetworkPolicyMatrix(t *testing.T) {
	inEverySource(t, func(t *testing.T, startLab labStarter) {
		m := newMatrix(t, startLab)
		ya, yc := m.pods["z/a"].IP, m.pods["z/c"].IP
		cases := []struct {
			name string
			docs []string
		}{
			{"deny all ingress in x", []string{netpol("x", "deny", "  podSelector: {}")}},
			{"allow only from the same namespace", []string{netpol("x", "same-ns", `  podSelector: {}
  ingress: [{from: [{podSelector: {}}]}]`)}},
			{"namespaceSelector AND podSelector", []string{netpol("x", "and", `  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: z}}, podSelector: {matchLabels: {pod: b}}}]
    ports: [{port: 80}]`)}},
			{"namespaceSelector OR podSelector", []string{netpol("x", "or", `  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: z}}}, {podSelector: {matchLabels: {pod: b}}}]}]`)}},
			{"namespaceSelector by name label", []string{netpol("z", "by-name", `  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]}]`)}},
			{"egress isolation to one pod and port", []string{netpol("x", "egress", `  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {}}], ports: [{protocol: UDP, port: 81}]}]`)}},
			{"egress deny all, ingress untouched", []string{netpol("z", "no-egress", `  podSelector: {matchLabels: {pod: c}}
  policyTypes: [Egress]`)}},
			{"named ports and endPort", []string{netpol("x", "ports", `  podSelector: {matchLabels: {pod: b}}
  ingress:
  - ports: [{port: serve-81-tcp}]
  - from: [{namespaceSelector: {}}]
    ports: [{protocol: UDP, port: 80, endPort: 81}]`)}},
			{"egress by named port of the destination", []string{netpol("z", "egress-named", `  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {}}], ports: [{port: serve-80-tcp}, {protocol: UDP, port: serve-81-udp}]}]`)}},
			{"ipBlock with except matches pod addresses", []string{netpol("x", "cidr", fmt.Sprintf(`  podSelector: {matchLabels: {pod: c}}
  ingress: [{from: [{ipBlock: {cidr: %s, except: [%s/32]}}]}]`, m.cidr, ya))}},
			{"egress ipBlock", []string{netpol("x", "egress-cidr", fmt.Sprintf(`  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress, Egress]
  ingress: [{}]
  egress: [{to: [{ipBlock: {cidr: %s/32}}], ports: [{protocol: TCP}]}]`, yc))}},
			{"several policies add up", []string{
				netpol("x", "one", `  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}], ports: [{port: 80}]}]`),
				netpol("x", "two", `  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: z}}}], ports: [{port: 81, protocol: UDP}]}]`)}},
			{"ingress and egress together", []string{netpol("z", "both", `  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress, Egress]
  ingress: [{from: [{podSelector: {matchLabels: {pod: a}}}]}]
  egress: [{to: [{namespaceSelector: {matchLabels: {ns: x}}}]}]`)}},
		}
		for _, c := range cases {
			file, nps := m.apply(c.name, c.docs...)
			m.compare(c.name, oracle{nsLabels: m.ns, policies: nps}, true)
			m.delete(file)
		}

		// Changes at run time: a policy, then a pod's labels change, a pod is
		// added, a namespace's labels change; each takes effect on new
		// connections as soon as apply returns.
		_, nps := m.apply("from b", netpol("x", "from-b", `  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {matchLabels: {team: blue}}}]}]`))
		o := oracle{nsLabels: m.ns, policies: nps}
		m.compare("before the changes", o, true)

		m.apply("relabel", matrixPod("z", "c", "b"))
		m.pods["z/c"].Labels["pod"] = "b"
		m.apply("label ns", "apiVersion: v1\nkind: Namespace\nmetadata: {name: z, labels: {ns: z, team: blue}}\n")
		m.ns["z"]["team"] = "blue"
		m.compare("after relabelling z/c and namespace z", o, true)

		m.apply("new pod", matrixPod("z", "d", "b"))
		m.addPod("z", "d", "b")
		m.waitServing(m.pods["z/d"])
		m.compare("after adding z/d", o, true)

		// Drops are counted by reason, and trace names the policy.
		st := m.status()
		var notAllowed uint64
		for _, c := range st.Counters {
			if c.Reason == "policy-not-allowed" {
				notAllowed += c.Packets
			}
		}
		if notAllowed == 0 {
			t.Errorf("no policy-not-allowed drops counted: %+v", st.Counters)
		}
		out, code := m.shunt("policy", "trace", "--from", "x/c", "--to", "x/a", "--port", "80")
		if code != 1 || !strings.Contains(out, "NetworkPolicy x/from-b") || !strings.Contains(out, "policy-not-allowed") {
			t.Errorf("trace of a denied connection: exit %d:\n%s", code, out)
		}
		out, code = m.shunt("policy", "trace", "--from", "z/d", "--to", "x/a", "--port", "80/udp")
		if code != 0 || !strings.Contains(out, "allowed by NetworkPolicy x/from-b ingress[0]") {
			t.Errorf("trace of an allowed connection: exit %d:\n%s", code, out)
		}
	})
}
