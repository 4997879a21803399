package policy

import (
	"net/netip"
	"slices"
	"testing"
)

// TestL7Ports: a port HTTP rules name gets every ingress rule covering it
// (with or without HTTP rules, of both kinds); an HTTP allow still admits
// its peers at L4, an HTTP deny denies nothing at L4; ports without HTTP
// rules stay L4 only.
func TestL7Ports(t *testing.T) {
	docs := append(append([]string{}, basePods...), `
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: db-http, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - peers: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: 8080}]
    http: [{method: GET, path: /metrics}]
  - action: deny
    peers: [{namespaceSelector: {matchLabels: {env: dev}}}]
    ports: [{port: 8080}]
    http: [{path: /admin.*}]
`, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: monitoring, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress:
  - from: [{namespaceSelector: {matchLabels: {env: dev}}}]
    ports: [{port: 8080}, {port: 9090}]
`)
	r := Compute(world(t, docs...), Allocations{})
	if len(r.L7) != 1 {
		t.Fatalf("L7 ports %+v, want prod/db:8080 only", r.L7)
	}
	lp := r.L7[0]
	if lp.Pod != "prod/db" || lp.Port != 8080 || !lp.Isolated || len(lp.Rules) != 4 {
		t.Fatalf("L7 port %+v, want prod/db:8080, isolated, with the 3 rules covering it and the node's", lp)
	}
	// The node's own allow comes first (its kubelet probes the pod).
	if node := lp.Rules[0]; node.RuleID != RuleNode || node.Action != "allow" || !slices.Equal(node.Identities, []uint32{IdentityHost}) || node.HTTP != nil {
		t.Errorf("first rule %+v, want the node-to-local-pod allow of the host", node)
	}
	web, dev := r.podIdentity["prod/web"], r.podIdentity["dev/tool"]
	byAction := map[string]int{}
	for _, rule := range lp.Rules {
		byAction[rule.Action]++
		if rule.Action == "deny" && (len(rule.HTTP) != 1 || rule.HTTP[0].Path != "/admin.*" || !slices.Contains(rule.Identities, dev)) {
			t.Errorf("deny rule %+v lost its HTTP rule", rule)
		}
		if len(rule.HTTP) == 1 && rule.HTTP[0].Method == "GET" && (len(rule.Identities) != 1 || rule.Identities[0] != web) {
			t.Errorf("the GET /metrics rule names %v, want the web identity %d", rule.Identities, web)
		}
	}
	if byAction["allow"] != 3 || byAction["deny"] != 1 {
		t.Errorf("rules by action %v, want 3 allows (one the node's) and 1 deny", byAction)
	}
	for _, chk := range []struct {
		from string
		port uint16
		want string
	}{
		{"prod/web", 8080, "allowed"}, // the HTTP allow admits at L4
		{"dev/tool", 8080, "allowed"}, // the HTTP deny takes nothing at L4
		{"dev/tool", 9090, "allowed"}, // plain L4
		{"prod/web", 9090, "denied"},  // isolated, no rule
		{"prod/web2", 5432, "denied"}, // isolated, no rule
	} {
		if got := verdict(t, r, chk.from, "prod/db", 6, chk.port); got != chk.want {
			t.Errorf("%s -> prod/db:%d: %s, want %s", chk.from, chk.port, got, chk.want)
		}
	}
	if id := r.CIDRIdentityOf(netip.MustParseAddr("192.0.2.1")); id != 0 {
		t.Errorf("CIDR identity of an address no policy names: %d", id)
	}
}

// TestClusterL7: with prod/db on another node, this node's own
// computation has no L7 port for it (no endpoint here), but ClusterL7 has,
// with the same rules and the identities this node's computation gave; it
// is nil when no policy has HTTP rules or every pod is local.
func TestClusterL7(t *testing.T) {
	docs := append(append([]string{}, basePods...), `
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: db-http, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - peers: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: 8080}]
    http: [{method: GET, path: /metrics}]
`)
	in := world(t, docs...)
	if ClusterL7(in, Allocations{}) != nil {
		t.Error("ClusterL7 with every pod local: want nil (the node's own computation has them)")
	}
	for i, p := range in.Pods {
		if p.Pod.Namespace+"/"+p.Pod.Name == "prod/db" {
			in.Pods[i].Local = false
		}
	}
	own := Compute(in, Allocations{})
	if len(own.L7) != 0 {
		t.Fatalf("this node's computation has L7 ports %+v for a pod of another node", own.L7)
	}
	cluster := ClusterL7(in, own.Alloc)
	if cluster == nil || len(cluster.L7) != 1 || cluster.L7[0].Pod != "prod/db" || cluster.L7[0].Port != 8080 {
		t.Fatalf("ClusterL7: %+v, want prod/db:8080", cluster)
	}
	rule := cluster.L7[0].Rules[1] // after the node's own (RuleNode)
	if web := own.podIdentity["prod/web"]; len(rule.Identities) != 1 || rule.Identities[0] != web {
		t.Errorf("the rule names identities %v, want this node's number for prod/web, %d", rule.Identities, web)
	}
	in.ShuntPolicies = nil
	if ClusterL7(in, own.Alloc) != nil {
		t.Error("ClusterL7 without HTTP rules: want nil")
	}
}
