package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

// world builds an Input from YAML: namespaces, pods (all local, addresses
// 10.0.0.N in document order) and policies.
func world(t *testing.T, docs ...string) Input {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(strings.Join(docs, "\n---\n")))
	if err != nil {
		t.Fatal(err)
	}
	in := Input{HostAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
	n := 10
	for _, o := range objs {
		switch obj := o.Obj.(type) {
		case *corev1.Namespace:
			in.Namespaces = append(in.Namespaces, obj)
		case *corev1.Pod:
			in.Pods = append(in.Pods, Pod{Pod: obj, IP: netip.AddrFrom4([4]byte{10, 0, 0, byte(n)}), Local: true})
			n++
		case *networkingv1.NetworkPolicy:
			in.NetworkPolicies = append(in.NetworkPolicies, obj)
		case *manifest.ShuntNetworkPolicy:
			in.ShuntPolicies = append(in.ShuntPolicies, obj)
		case *corev1.Node:
			in.Nodes = append(in.Nodes, obj)
		}
	}
	return in
}

func podDoc(ns, name, labels string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {%s}}
spec:
  containers:
  - name: c
    command: [x]
    ports: [{name: http, containerPort: 8080}, {name: dns, containerPort: 5353, protocol: UDP}]`, name, ns, labels)
}

func nsDoc(name, labels string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s, labels: {%s}}", name, labels)
}

// verdict traces pod -> pod on proto/port and returns allowed/denied.
func verdict(t *testing.T, r *Result, from, to string, proto uint8, port uint16) string {
	t.Helper()
	f, err := r.Resolve(Peer{Pod: from})
	if err != nil {
		f, err = Peer{IP: netip.MustParseAddr(from)}, nil
	}
	d, err := r.Resolve(Peer{Pod: to})
	if err != nil {
		d = Peer{IP: netip.MustParseAddr(to)}
	}
	return r.Trace(f, d, proto, port).Verdict
}

var basePods = []string{
	nsDoc("prod", "env: prod"), nsDoc("dev", "env: dev"),
	podDoc("prod", "web", "app: web"), podDoc("prod", "web2", "app: web"),
	podDoc("prod", "db", "app: db"), podDoc("dev", "web", "app: web"), podDoc("dev", "tool", "app: tool"),
}

func TestIdentitiesAreSharedAndStable(t *testing.T) {
	in := world(t, basePods...)
	r := Compute(in, Allocations{})
	if r.podIdentity["prod/web"] != r.podIdentity["prod/web2"] {
		t.Error("pods with the same labels in one namespace must share an identity")
	}
	if r.podIdentity["prod/web"] == r.podIdentity["dev/web"] {
		t.Error("the same labels in another namespace are another identity")
	}
	if len(r.Identities) != 4 {
		t.Errorf("%d identities, want 4", len(r.Identities))
	}
	// Removing one pod keeps the other identities' numbers.
	in2 := in
	in2.Pods = in.Pods[2:]
	r2 := Compute(in2, r.Alloc)
	for _, key := range []string{"prod/db", "dev/web", "dev/tool"} {
		if r2.podIdentity[key] != r.podIdentity[key] {
			t.Errorf("%s changed identity %d -> %d", key, r.podIdentity[key], r2.podIdentity[key])
		}
	}
}

func TestNetworkPolicySemantics(t *testing.T) {
	cases := []struct {
		name   string
		policy string
		checks []string // "from to proto port verdict"
	}{
		{"no policy: everything allowed", "", []string{
			"prod/web prod/db 6 5432 allowed", "dev/tool prod/db 17 53 allowed"}},
		{"empty podSelector, no rules: default deny ingress for the namespace", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: prod}
spec: {podSelector: {}}`, []string{
			"prod/web prod/db 6 5432 denied", "dev/web prod/web 6 80 denied",
			"prod/db dev/web 6 80 allowed",  // egress not isolated; dev not selected
			"10.0.0.1 prod/db 6 22 allowed", // the node always reaches its pods
		}},
		{"podSelector AND namespaceSelector in one peer vs two peers", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {env: dev}}, podSelector: {matchLabels: {app: tool}}}]
  - from: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: 5432}]`, []string{
			"dev/tool prod/db 6 5432 allowed", "dev/tool prod/db 17 9 allowed",
			"dev/web prod/db 6 5432 denied", // app=web but in dev: the second peer is prod-only
			"prod/web prod/db 6 5432 allowed", "prod/web prod/db 6 5433 denied", "prod/web prod/db 17 5432 denied",
			"prod/db prod/web 6 80 allowed", // web is not selected
		}},
		{"namespaceSelector by the automatic name label", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ns, namespace: prod}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: dev}}}]}]`, []string{
			"dev/web prod/db 6 1 allowed", "prod/web prod/db 6 1 denied"}},
		{"egress isolation, ports with endPort, UDP named port on the peer", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: out, namespace: dev}
spec:
  podSelector: {matchLabels: {app: tool}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {}}]
    ports: [{port: 8000, endPort: 8090}, {port: dns, protocol: UDP}]`, []string{
			"dev/tool prod/web 6 8000 allowed", "dev/tool prod/web 6 8090 allowed", "dev/tool prod/web 6 8091 denied",
			"dev/tool prod/web 6 7999 denied", "dev/tool prod/web 17 5353 allowed", "dev/tool prod/web 17 53 denied",
			"dev/tool 192.0.2.1 6 8080 denied", // namespaceSelector {} is pods only
			"prod/web dev/tool 6 1 allowed",
		}},
		{"ingress named port resolves on the target pod", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{ports: [{port: http}, {port: nosuch}]}]`, []string{
			"dev/tool prod/web 6 8080 allowed", "dev/tool prod/web 6 80 denied", "dev/tool prod/web 17 8080 denied"}},
		{"ipBlock with except matches pod addresses too", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: cidr, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/24, except: [10.0.0.12/32]}}]}]`, []string{
			"prod/web prod/db 6 1 allowed",  // 10.0.0.10
			"prod/web2 prod/db 6 1 allowed", // 10.0.0.11
			"dev/tool prod/db 6 1 allowed",  // 10.0.0.14
			"10.0.0.12 prod/db 6 1 denied",  // prod/db itself is .12: in except
			"192.0.2.7 prod/db 6 1 denied",
		}},
		{"several policies add up", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: 1}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{namespaceSelector: {}}], ports: [{port: 2}]}]`, []string{
			"prod/web prod/db 6 1 allowed", "prod/web prod/db 6 2 allowed", "dev/tool prod/db 6 2 allowed",
			"dev/tool prod/db 6 1 denied"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			docs := append([]string{}, basePods...)
			if c.policy != "" {
				docs = append(docs, c.policy)
			}
			r := Compute(world(t, docs...), Allocations{})
			for _, chk := range c.checks {
				var from, to, want string
				var proto uint8
				var port uint16
				if _, err := fmt.Sscan(chk, &from, &to, &proto, &port, &want); err != nil {
					t.Fatalf("bad check %q: %v", chk, err)
				}
				if got := verdict(t, r, from, to, proto, port); got != want {
					tr := r.Trace(Peer{Pod: from}, Peer{Pod: to}, proto, port)
					t.Errorf("%s: got %s, want %s (%+v)", chk, got, want, tr.Steps)
				}
			}
		})
	}
}

func TestShuntPolicyDenyWinsAndEntities(t *testing.T) {
	docs := append(append([]string{}, basePods...), `
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: db, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - peers: [{namespaceSelector: {}}]
  - action: deny
    peers: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: 22}]
  - action: deny
    peers: [{entity: host}]
    ports: [{port: 23}]
  egress:
  - peers: [{entity: world}]
    ports: [{port: 443}]
  - action: deny
    peers: [{cidr: 192.0.2.0/24}]`)
	r := Compute(world(t, docs...), Allocations{})
	for _, chk := range []struct {
		from, to string
		port     uint16
		want     string
	}{
		{"prod/web", "prod/db", 21, "allowed"},
		{"prod/web", "prod/db", 22, "denied"}, // deny wins over the namespace allow
		{"dev/tool", "prod/db", 22, "allowed"},
		{"10.0.0.1", "prod/db", 22, "allowed"}, // the node, built-in allow
		{"10.0.0.1", "prod/db", 23, "denied"},  // explicitly denied host
		{"prod/db", "198.51.100.1", 443, "allowed"},
		{"prod/db", "192.0.2.1", 443, "denied"}, // world, but the CIDR deny wins
		{"prod/db", "prod/web", 443, "denied"},  // a pod is not world
	} {
		if got := verdict(t, r, chk.from, chk.to, 6, chk.port); got != chk.want {
			t.Errorf("%s -> %s:%d: %s, want %s", chk.from, chk.to, chk.port, got, chk.want)
		}
	}
	if len(r.Warnings) != 0 {
		t.Errorf("warnings %q, want none", r.Warnings)
	}
	tr := r.Trace(Peer{Pod: "prod/web", IP: netip.MustParseAddr("10.0.0.10")}, Peer{Pod: "prod/db", IP: netip.MustParseAddr("10.0.0.12")}, 6, 22)
	last := tr.Steps[len(tr.Steps)-1]
	if tr.Reason != "policy-denied" || last.Rule == nil || last.Rule.Name != "db" || last.Rule.Index != 1 {
		t.Errorf("trace of the denied connection: %+v", tr)
	}
}

func TestRangePrefixes(t *testing.T) {
	for _, c := range []struct {
		lo, hi uint16
		n      int
	}{{80, 80, 1}, {0, 65535, 1}, {8000, 8090, 5}, {1, 65535, 16}, {6000, 6001, 1}} {
		ms := rangePrefixes(c.lo, c.hi)
		covered := 0
		for _, m := range ms {
			covered += 1 << (16 - m.bits)
		}
		if covered != int(c.hi)-int(c.lo)+1 || len(ms) != c.n {
			t.Errorf("[%d,%d]: %d prefixes covering %d ports, want %d prefixes covering %d", c.lo, c.hi, len(ms), covered, c.n, int(c.hi)-int(c.lo)+1)
		}
		for p := uint32(c.lo); p <= uint32(c.hi); p++ {
			in := 0
			for _, m := range ms {
				if portInPrefix(uint16(p), m.port, m.bits) {
					in++
				}
			}
			if in != 1 {
				t.Fatalf("[%d,%d]: port %d in %d prefixes", c.lo, c.hi, p, in)
			}
		}
	}
}

func TestDenyCoversNarrowerAllow(t *testing.T) {
	docs := append(append([]string{}, basePods...), `
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: p, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - peers: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: 80}]
  - action: deny
    peers: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: 1, endPort: 1023}]`)
	r := Compute(world(t, docs...), Allocations{})
	if got := verdict(t, r, "prod/web", "prod/db", 6, 80); got != "denied" {
		t.Errorf("allow :80 inside deny 0-1023 of the same peer: %s, want denied", got)
	}
	for _, e := range r.State.Entries {
		if e.Verdict == VerdictAllow && e.Port == 80 {
			t.Errorf("covered allow left in the map (the LPM would prefer it): %+v", e)
		}
	}
}

// A deny-only policy takes away without isolating: everything else stays
// allowed, and the pod is marked for lookups so the deny is enforced.
func TestDenyOnlyPolicyDoesNotIsolate(t *testing.T) {
	docs := append(append([]string{}, basePods...), `
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: no-admin, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - action: deny
    peers: [{namespaceSelector: {matchLabels: {env: dev}}}]
    ports: [{port: 8443}]`)
	r := Compute(world(t, docs...), Allocations{})
	e := r.Endpoint("prod/db")
	if len(e.IngressIsolatedBy) > 0 || !e.IngressRules || e.EgressRules {
		t.Errorf("endpoint flags %+v: want ingress rules without isolation", e)
	}
	for _, chk := range []struct {
		from string
		port uint16
		want string
	}{{"dev/tool", 8443, "denied"}, {"dev/tool", 443, "allowed"}, {"prod/web", 8443, "allowed"}} {
		if got := verdict(t, r, chk.from, "prod/db", 6, chk.port); got != chk.want {
			t.Errorf("%s -> prod/db:%d: %s, want %s", chk.from, chk.port, got, chk.want)
		}
	}
}

// TestIPv6IsAProblemNotAFailure: an API server accepts IPv6 blocks and pod
// addresses, which shunt does not enforce. They become problems of their
// objects, while the rest is computed: the IPv4 block of the same policy
// keeps its identity, and no IPv6 prefix reaches the maps (the datapath
// would refuse the whole state).
func TestIPv6IsAProblemNotAFailure(t *testing.T) {
	in := world(t, podDoc("default", "web", "app: web"), podDoc("default", "v6", "app: v6"), `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: blocks, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{ipBlock: {cidr: 192.0.2.0/24}}, {ipBlock: {cidr: "2001:db8::/32"}}]`)
	in.Pods[1].IP = netip.MustParseAddr("2001:db8::7")
	res := Compute(in, Allocations{})
	for _, p := range append(slices.Clone(res.State.IPCache), res.State.CIDRIdentities...) {
		if !p.Prefix.Addr().Is4() {
			t.Errorf("IPv6 prefix %s reached the maps", p.Prefix)
		}
	}
	if len(res.State.CIDRIdentities) != 1 || res.State.CIDRIdentities[0].Prefix != netip.MustParsePrefix("192.0.2.0/24") {
		t.Errorf("CIDR identities %v, want the IPv4 block only", res.State.CIDRIdentities)
	}
	want := map[string]bool{"NetworkPolicy default/blocks": false, "Pod default/v6": false}
	for _, p := range res.Problems {
		want[p.Kind+" "+p.Namespace+"/"+p.Name] = p.Reason == "IPv6NotSupported"
	}
	for obj, ok := range want {
		if !ok {
			t.Errorf("no IPv6NotSupported problem for %s: %+v", obj, res.Problems)
		}
	}
	if len(res.Warnings) != len(res.Problems) {
		t.Errorf("warnings %v do not say the problems", res.Warnings)
	}
}

func nodeDoc(name, addresses string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata: {name: %s}\nstatus: {addresses: [%s]}", name, addresses)
}

// TestRemotePodsTunnel: a pod of another node is reached at its node's
// InternalIP (ExternalIP when it has none); two nodes claiming one address
// would take each other's traffic, so neither gets a tunnel and both are
// reported; local pods never get one.
func TestRemotePodsTunnel(t *testing.T) {
	in := world(t,
		podDoc("default", "a", "app: a"), podDoc("default", "b", "app: b"), podDoc("default", "c", "app: c"),
		podDoc("default", "d", "app: d"), podDoc("default", "e", "app: e"),
		nodeDoc("n2", "{type: ExternalIP, address: 203.0.113.2}, {type: InternalIP, address: 192.168.50.2}"),
		nodeDoc("n3", "{type: ExternalIP, address: 203.0.113.3}"),
		nodeDoc("n4", "{type: InternalIP, address: 192.168.50.9}"),
		nodeDoc("n5", "{type: InternalIP, address: 192.168.50.9}"))
	for i, node := range []string{"", "n2", "n3", "n4", "n5"} {
		in.Pods[i].Pod.Spec.NodeName = node
		in.Pods[i].Local = node == ""
	}
	res := Compute(in, Allocations{})
	got := map[string]string{}
	for _, p := range res.State.IPCache {
		got[p.Prefix.Addr().String()] = p.Tunnel.String()
	}
	want := map[string]string{"10.0.0.10": "invalid IP", "10.0.0.11": "192.168.50.2", "10.0.0.12": "203.0.113.3",
		"10.0.0.13": "invalid IP", "10.0.0.14": "invalid IP"}
	for ip, tun := range want {
		if got[ip] != tun {
			t.Errorf("%s: tunnel %s, want %s", ip, got[ip], tun)
		}
	}
	if len(res.Problems) != 1 || res.Problems[0].Kind != "Node" || res.Problems[0].Name != "n5" || res.Problems[0].Reason != "DuplicateNodeAddress" ||
		!strings.Contains(res.Problems[0].Message, "node n4") {
		t.Errorf("problems %+v: want n5's address reported as n4's too", res.Problems)
	}
}
