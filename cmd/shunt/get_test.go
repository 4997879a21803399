package main

import (
	corev1 "k8s.io/api/core/v1"

	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// agentLists are what the fake agent answers: pods in two namespaces with
// and without labels, one object or more of every other kind.
var agentLists = map[string]string{
	"/v1/pods": `{"apiVersion": "v1", "kind": "List", "items": [
		{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": "default", "labels": {"app": "client"}},
		 "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running", "podIP": "10.0.0.2"}},
		{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web", "tier": "a"}},
		 "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running", "podIP": "10.0.0.3"}},
		{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-2", "namespace": "default", "labels": {"tier": "b", "app": "web"}},
		 "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running", "podIP": "10.0.0.4"}},
		{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": "default"},
		 "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}},
		{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db", "namespace": "shop", "labels": {"app": "db", "tier": "c"}},
		 "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running", "podIP": "10.0.0.5"}}]}`,
	"/v1/namespaces": `{"apiVersion": "v1", "kind": "List", "items": [
		{"metadata": {"name": "default"}, "status": {"phase": "Active"}},
		{"metadata": {"name": "shop", "labels": {"team": "shop"}}, "status": {"phase": "Active"}}]}`,
	"/v1/services": `{"apiVersion": "v1", "kind": "List", "items": [
		{"metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
		 "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "selector": {"app": "web"}, "ports": [{"port": 80, "protocol": "TCP"}]}},
		{"metadata": {"name": "other", "namespace": "default"},
		 "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.11", "ports": [{"port": 53, "protocol": "UDP"}]}}]}`,
	"/v1/endpointslices": `{"apiVersion": "v1", "kind": "List", "items": [
		{"metadata": {"name": "web-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
		 "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.3"], "conditions": {"ready": true}}], "ports": [{"port": 8080}]}]}`,
	"/v1/networkpolicies": `{"apiVersion": "v1", "kind": "List", "items": [
		{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "allow-web", "namespace": "default", "labels": {"team": "a"}},
		 "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}},
		{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny-all", "namespace": "shop"},
		 "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}]}`,
	"/v1/shuntnetworkpolicies": `{"apiVersion": "v1", "kind": "List", "items": [
		{"apiVersion": "shunt.io/v1alpha1", "kind": "ShuntNetworkPolicy", "metadata": {"name": "web-shunt", "namespace": "default", "labels": {"team": "a"}},
		 "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [
			{"action": "allow", "peers": [{"entity": "cluster"}], "http": [{"method": "GET"}, {"path": "/x"}]},
			{"action": "deny", "peers": [{"entity": "host"}]},
			{"action": "deny", "peers": [{"entity": "world"}]}]}}]}`,
	"/v1/httproutes": `{"apiVersion": "v1", "kind": "List", "items": [
		{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "reviews", "namespace": "default", "labels": {"team": "a"}},
		 "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "reviews", "port": 9080}], "rules": [
			{"backendRefs": [{"name": "reviews-v1", "port": 9080, "weight": 90}, {"name": "reviews-v2", "port": 9080, "weight": 10}]},
			{"matches": [{"headers": [{"name": "x-canary", "value": "true"}]}], "backendRefs": [{"name": "reviews-v2", "port": 9080, "weight": 1}]}]},
		 "status": {"parents": [{"parentRef": {"group": "", "kind": "Service", "name": "reviews", "port": 9080}, "controllerName": "shunt.io/lab", "conditions": [
			{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "attached to Service reviews", "lastTransitionTime": "2026-01-02T03:04:05Z"},
			{"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "every backendRef names a Service port", "lastTransitionTime": "2026-01-02T03:04:05Z"}]}]}},
		{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "api", "namespace": "shop"},
		 "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "api"}, {"group": "", "kind": "Service", "name": "api-2"}], "rules": [{}]},
		 "status": {"parents": [
			{"parentRef": {"group": "", "kind": "Service", "name": "api"}, "controllerName": "shunt.io/lab", "conditions": [
				{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "attached to Service api", "lastTransitionTime": "2026-01-02T03:04:05Z"},
				{"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "every backendRef names a Service port", "lastTransitionTime": "2026-01-02T03:04:05Z"}]},
			{"parentRef": {"group": "", "kind": "Service", "name": "api-2"}, "controllerName": "shunt.io/lab", "conditions": [
				{"type": "Accepted", "status": "False", "reason": "NoMatchingParent", "message": "Service api-2 not found", "lastTransitionTime": "2026-01-02T03:04:05Z"},
				{"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "every backendRef names a Service port", "lastTransitionTime": "2026-01-02T03:04:05Z"}]}]}},
		{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "new", "namespace": "shop"},
		 "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "api"}], "rules": [{"backendRefs": [{"name": "api", "port": 80}]}]}}]}`,
	"/v1/grpcroutes": `{"apiVersion": "v1", "kind": "List", "items": [
		{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute", "metadata": {"name": "greeter", "namespace": "default"},
		 "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "greeter", "port": 9090}], "rules": [
			{"matches": [{"method": {"service": "grpc.health.v1.Health"}}], "backendRefs": [{"name": "greeter-v1", "port": 9090, "weight": 3}, {"name": "greeter-v2", "port": 9090}]},
			{}]},
		 "status": {"parents": [{"parentRef": {"group": "", "kind": "Service", "name": "greeter", "port": 9090}, "controllerName": "shunt.io/lab", "conditions": [
			{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "attached to Service greeter", "lastTransitionTime": "2026-01-02T03:04:05Z"},
			{"type": "ResolvedRefs", "status": "False", "reason": "BackendNotFound", "message": "Service greeter-v2 not found", "lastTransitionTime": "2026-01-02T03:04:05Z"}]}]}}]}`,
	"/v1/identities": `[{"id": 1, "reserved": "host"},
		{"id": 256, "namespace": "default", "labels": {"app": "web"}, "pods": ["default/web-1"]},
		{"id": 257, "namespace": "default", "labels": {"app": "client"}, "pods": ["default/client"]}]`,
}

// fakeAgent answers the list requests of `get` with fixed Lists, over a
// Unix socket as the agent does, and returns the socket.
func fakeAgent(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	for path, body := range agentLists {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) })
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// get runs `shunt get ARGS` against the agent on sock and returns stdout
// and stderr.
func get(sock string, args ...string) (string, string, error) {
	cmd := newGetCmd(&globals{instance: "test", socket: sock})
	var out, errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

// lines splits output into lines with their columns' spacing collapsed,
// so tests do not depend on column widths.
func lines(out string) []string {
	var ls []string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		ls = append(ls, strings.Join(strings.Fields(l), " "))
	}
	return ls
}

func assertLines(t *testing.T, out string, want ...string) {
	t.Helper()
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Every name of every kind finds it, in any case; anything else is an
// error listing the kinds with their short names.
func TestGetKindNames(t *testing.T) {
	for name, want := range map[string]string{
		"pods": "pods", "pod": "pods", "po": "pods", "PODS": "pods",
		"services": "services", "service": "services", "svc": "services",
		"endpointslices": "endpointslices", "endpointslice": "endpointslices", "endpointslices.discovery.k8s.io": "endpointslices",
		"namespaces": "namespaces", "namespace": "namespaces", "ns": "namespaces",
		"networkpolicies": "networkpolicies", "networkpolicy": "networkpolicies", "netpol": "networkpolicies",
		"NetworkPolicy": "networkpolicies", "networkpolicies.networking.k8s.io": "networkpolicies",
		"shuntnetworkpolicies": "shuntnetworkpolicies", "shuntnetworkpolicy": "shuntnetworkpolicies", "snp": "shuntnetworkpolicies",
		"ShuntNetworkPolicy": "shuntnetworkpolicies", "shuntnetworkpolicies.shunt.io": "shuntnetworkpolicies",
		"httproutes": "httproutes", "httproute": "httproutes", "hr": "httproutes",
		"HTTPRoute": "httproutes", "httproutes.gateway.networking.k8s.io": "httproutes",
		"grpcroutes": "grpcroutes", "grpcroute": "grpcroutes", "GRPCRoute": "grpcroutes",
		"grpcroutes.gateway.networking.k8s.io": "grpcroutes",
		"identities":                           "identities", "identity": "identities",
	} {
		if r, err := lookupResource(name); err != nil || r.name != want {
			t.Errorf("%q: got %v, %v; want %s", name, r, err, want)
		}
	}
	// No agent is asked: the kind is checked first.
	_, _, err := get("/nonexistent.sock", "foo")
	if err == nil {
		t.Fatal("get foo: no error")
	}
	want := `the server doesn't have a resource type "foo"` + "\n" +
		"known resource types (short names): pods (po), services (svc), endpointslices, namespaces (ns), nodes (no), " +
		"networkpolicies (netpol), shuntnetworkpolicies (snp), httproutes (hr), grpcroutes, identities"
	if err.Error() != want {
		t.Errorf("got:\n%v\nwant:\n%s", err, want)
	}
	if _, _, err := get("/nonexistent.sock"); err == nil || !strings.Contains(err.Error(), "you must specify the type of resource to get: pods (po), ") {
		t.Errorf("get without a kind: %v", err)
	}
}

func TestGetSelector(t *testing.T) {
	sock := fakeAgent(t)
	for _, tc := range []struct {
		selector string
		want     []string
	}{
		{"app=web", []string{"pod/web-1", "pod/web-2"}},
		{"app==web", []string{"pod/web-1", "pod/web-2"}},
		{"app!=web", []string{"pod/client", "pod/bare"}}, // as kubectl: != matches pods without the label
		{"tier in (a,b)", []string{"pod/web-1", "pod/web-2"}},
		{"tier notin (a)", []string{"pod/client", "pod/web-2", "pod/bare"}},
		{"tier", []string{"pod/web-1", "pod/web-2"}},
		{"!tier", []string{"pod/client", "pod/bare"}},
		{"app=web,tier=b", []string{"pod/web-2"}},
		{"app=nothing", nil},
	} {
		out, _, err := get(sock, "pods", "-l", tc.selector, "-o", "name")
		if err != nil {
			t.Errorf("-l %q: %v", tc.selector, err)
			continue
		}
		if got := strings.Fields(out); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("-l %q: got %v, want %v", tc.selector, got, tc.want)
		}
	}
	// -A widens the namespace, the selector still holds.
	out, _, err := get(sock, "po", "-A", "--selector", "tier in (a,c)", "-o", "name")
	if err != nil || strings.Join(strings.Fields(out), " ") != "pod/web-1 pod/db" {
		t.Errorf("-A -l: %q %v", out, err)
	}
	// Every kind filters by its labels.
	for kind, want := range map[string]string{
		"svc": "service/web", "endpointslices": "endpointslice/web-abc", "ns": "namespace/shop",
		"netpol": "networkpolicy/allow-web", "snp": "shuntnetworkpolicy/web-shunt", "hr": "httproute/reviews",
	} {
		sel := "team"
		switch kind {
		case "svc":
			sel = "app=web"
		case "endpointslices":
			sel = "kubernetes.io/service-name=web"
		}
		out, _, err := get(sock, kind, "-A", "-l", sel, "-o", "name")
		if err != nil || strings.TrimSpace(out) != want {
			t.Errorf("get %s -l %s: %q %v, want %s", kind, sel, out, err, want)
		}
	}
	out, _, err = get(sock, "identities", "-l", "app=web")
	if err != nil {
		t.Fatal(err)
	}
	assertLines(t, out, "ID NAMESPACE LABELS PODS", "256 default app=web default/web-1")

	// JSON keeps the List shape, with what matched.
	out, _, err = get(sock, "pods", "-l", "tier=b", "-o", "json")
	var l struct {
		APIVersion, Kind string
		Items            []struct{ Metadata struct{ Name string } }
	}
	if err != nil || json.Unmarshal([]byte(out), &l) != nil || l.Kind != "List" || len(l.Items) != 1 || l.Items[0].Metadata.Name != "web-2" {
		t.Errorf("-o json -l: %v\n%s", err, out)
	}
	out, _, err = get(sock, "pods", "-l", "app=nothing", "-o", "json")
	if err != nil || !strings.Contains(out, `"items": []`) {
		t.Errorf("-o json, nothing selected: %v\n%s", err, out)
	}
	out, errOut, err := get(sock, "pods", "-l", "app=nothing")
	if err != nil || out != "" || errOut != "No resources found in default namespace.\n" {
		t.Errorf("table, nothing selected: %v %q %q", err, out, errOut)
	}
}

func TestGetBadSelector(t *testing.T) {
	sock := fakeAgent(t)
	for _, sel := range []string{"tier in (a", "app=web=x", "a b", "!"} {
		_, _, err := get(sock, "pods", "-l", sel)
		if err == nil || !strings.HasPrefix(err.Error(), "invalid label selector "+`"`+sel+`": `) {
			t.Errorf("-l %q: %v", sel, err)
		}
	}
	if _, _, err := get(sock, "pods", "web-1", "-l", "app=web"); err == nil || !strings.Contains(err.Error(), "cannot be given with a selector") {
		t.Errorf("NAME and -l: %v", err)
	}
}

func TestGetShowLabels(t *testing.T) {
	sock := fakeAgent(t)
	out, _, err := get(sock, "pods", "--show-labels")
	if err != nil {
		t.Fatal(err)
	}
	assertLines(t, out,
		"NAME READY STATUS RESTARTS AGE LABELS",
		"client 0/1 Running 0 <unknown> app=client",
		"web-1 0/1 Running 0 <unknown> app=web,tier=a",
		"web-2 0/1 Running 0 <unknown> app=web,tier=b",
		"bare 0/1 Pending 0 <unknown> <none>")
	// NAMESPACE first, wide columns, LABELS last.
	out, _, err = get(sock, "pods", "-A", "-o", "wide", "--show-labels", "-l", "tier")
	if err != nil {
		t.Fatal(err)
	}
	assertLines(t, out,
		"NAMESPACE NAME READY STATUS RESTARTS AGE IP NODE LABELS",
		"default web-1 0/1 Running 0 <unknown> 10.0.0.3 <none> app=web,tier=a",
		"default web-2 0/1 Running 0 <unknown> 10.0.0.4 <none> app=web,tier=b",
		"shop db 0/1 Running 0 <unknown> 10.0.0.5 <none> app=db,tier=c")
	out, _, _ = get(sock, "svc", "--show-labels")
	assertLines(t, out,
		"NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE LABELS",
		"web ClusterIP 10.96.0.10 <none> 80/TCP <unknown> app=web",
		"other ClusterIP 10.96.0.11 <none> 53/UDP <unknown> <none>")
	out, _, _ = get(sock, "endpointslices", "--show-labels")
	assertLines(t, out,
		"NAME ADDRESSTYPE PORTS ENDPOINTS LABELS",
		"web-abc IPv4 8080 10.0.0.3 kubernetes.io/service-name=web")
	// Namespaces and identities show their labels anyway: not twice.
	out, _, _ = get(sock, "ns", "--show-labels")
	assertLines(t, out, "NAME STATUS LABELS", "default Active <none>", "shop Active team=shop")
	out, _, _ = get(sock, "identities", "--show-labels")
	if l := lines(out); l[0] != "ID NAMESPACE LABELS PODS" {
		t.Errorf("identities header %q", l[0])
	}
}

func TestGetNetworkPolicies(t *testing.T) {
	sock := fakeAgent(t)
	out, _, err := get(sock, "netpol")
	if err != nil {
		t.Fatal(err)
	}
	assertLines(t, out, "NAME POD-SELECTOR AGE", "allow-web app=web <unknown>")
	out, _, _ = get(sock, "networkpolicies", "-A", "-o", "wide", "--show-labels")
	assertLines(t, out,
		"NAMESPACE NAME POD-SELECTOR AGE POLICY-TYPES LABELS",
		"default allow-web app=web <unknown> Ingress team=a",
		"shop deny-all <none> <unknown> Ingress,Egress <none>")
	out, _, _ = get(sock, "netpol", "-A", "-o", "name")
	assertLines(t, out, "networkpolicy/allow-web", "networkpolicy/deny-all")

	// -o json: a List of Kubernetes objects; a named one as itself.
	out, _, err = get(sock, "netpol", "-n", "shop", "-o", "json")
	var l struct {
		APIVersion, Kind string
		Items            []struct {
			APIVersion, Kind string
			Metadata         struct{ Name, Namespace string }
		}
	}
	if err != nil || json.Unmarshal([]byte(out), &l) != nil || l.APIVersion != "v1" || l.Kind != "List" || len(l.Items) != 1 ||
		l.Items[0].APIVersion != "networking.k8s.io/v1" || l.Items[0].Kind != "NetworkPolicy" || l.Items[0].Metadata.Name != "deny-all" {
		t.Errorf("-o json: %v\n%s", err, out)
	}
	out, _, err = get(sock, "netpol", "allow-web", "-o", "yaml")
	if err != nil || !strings.HasPrefix(out, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n") {
		t.Errorf("-o yaml NAME: %v\n%s", err, out)
	}
	if _, _, err := get(sock, "netpol", "nope"); err == nil || err.Error() != `networkpolicies "nope" not found in namespace "default"` {
		t.Errorf("missing policy: %v", err)
	}
	if _, errOut, err := get(sock, "netpol", "-n", "empty"); err != nil || errOut != "No resources found in empty namespace.\n" {
		t.Errorf("empty namespace: %v %q", err, errOut)
	}
}

func TestGetShuntNetworkPolicies(t *testing.T) {
	sock := fakeAgent(t)
	out, _, err := get(sock, "shuntnetworkpolicies")
	if err != nil {
		t.Fatal(err)
	}
	assertLines(t, out, "NAME POD-SELECTOR INGRESS EGRESS AGE", "web-shunt app=web 1 allow, 2 deny <none> <unknown>")
	out, _, _ = get(sock, "snp", "-o", "wide", "--show-labels")
	assertLines(t, out, "NAME POD-SELECTOR INGRESS EGRESS AGE HTTP-RULES LABELS", "web-shunt app=web 1 allow, 2 deny <none> <unknown> 2 team=a")
	out, _, err = get(sock, "snp", "-o", "json")
	var l struct {
		Kind  string
		Items []struct {
			APIVersion, Kind string
			Spec             struct{ Ingress []struct{ Action string } }
		}
	}
	if err != nil || json.Unmarshal([]byte(out), &l) != nil || l.Kind != "List" || len(l.Items) != 1 ||
		l.Items[0].APIVersion != "shunt.io/v1alpha1" || l.Items[0].Kind != "ShuntNetworkPolicy" || len(l.Items[0].Spec.Ingress) != 3 {
		t.Errorf("-o json: %v\n%s", err, out)
	}
	if _, _, err := get(sock, "snp", "nope", "-A"); err == nil || err.Error() != `shuntnetworkpolicies "nope" not found` {
		t.Errorf("missing policy: %v", err)
	}
}

func TestGetHTTPRoutes(t *testing.T) {
	sock := fakeAgent(t)
	out, _, err := get(sock, "httproutes")
	if err != nil {
		t.Fatal(err)
	}
	assertLines(t, out, "NAME PARENTS BACKENDS ACCEPTED RESOLVED AGE",
		"reviews reviews:9080 reviews-v1:9080=90,reviews-v2:9080=10;reviews-v2:9080=1 True True <unknown>")
	// A parent that does not accept makes the route False; a route without
	// status yet is Unknown; -o wide says why.
	out, _, _ = get(sock, "hr", "-n", "shop", "-o", "wide")
	assertLines(t, out, "NAME PARENTS BACKENDS ACCEPTED RESOLVED AGE MESSAGE",
		"api api,api-2 <none> False True <unknown> Service api-2 not found",
		"new api api:80=1 Unknown Unknown <unknown> <none>")
	out, _, _ = get(sock, "httproute", "-A", "-o", "name")
	assertLines(t, out, "httproute/reviews", "httproute/api", "httproute/new")

	// -o yaml: the route as itself, its conditions included.
	out, _, err = get(sock, "hr", "reviews", "-o", "yaml")
	if err != nil || !strings.HasPrefix(out, "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n") ||
		!strings.Contains(out, "controllerName: shunt.io/lab") || !strings.Contains(out, "reason: ResolvedRefs") {
		t.Errorf("-o yaml NAME: %v\n%s", err, out)
	}
	out, _, err = get(sock, "hr", "-A", "-o", "json")
	var l struct {
		Kind  string
		Items []struct {
			Status struct {
				Parents []struct {
					Conditions []struct{ Type, Status, Message string }
				}
			}
		}
	}
	if err != nil || json.Unmarshal([]byte(out), &l) != nil || l.Kind != "List" || len(l.Items) != 3 ||
		l.Items[1].Status.Parents[1].Conditions[0].Message != "Service api-2 not found" {
		t.Errorf("-o json: %v\n%s", err, out)
	}
	if _, _, err := get(sock, "hr", "nope"); err == nil || err.Error() != `httproutes "nope" not found in namespace "default"` {
		t.Errorf("missing route: %v", err)
	}
}

// GRPCRoutes print as HTTPRoutes do; a backend without a weight has 1 and
// a rule without backends shows <none>.
func TestGetGRPCRoutes(t *testing.T) {
	sock := fakeAgent(t)
	out, _, err := get(sock, "grpcroutes", "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	assertLines(t, out, "NAME PARENTS BACKENDS ACCEPTED RESOLVED AGE MESSAGE",
		"greeter greeter:9090 greeter-v1:9090=3,greeter-v2:9090=1;<none> True False <unknown> Service greeter-v2 not found")
	out, _, err = get(sock, "grpcroute", "greeter", "-o", "yaml")
	if err != nil || !strings.HasPrefix(out, "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata:\n") ||
		!strings.Contains(out, "service: grpc.health.v1.Health") || !strings.Contains(out, "reason: BackendNotFound") {
		t.Errorf("-o yaml NAME: %v\n%s", err, out)
	}
	if _, _, err := get(sock, "grpcroutes", "nope"); err == nil || err.Error() != `grpcroutes "nope" not found in namespace "default"` {
		t.Errorf("missing route: %v", err)
	}
}

// `delete KIND NAME` sends what a three-line manifest would: apiVersion,
// kind and metadata of each object named.
func TestDeleteKindName(t *testing.T) {
	var got []map[string]any
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/delete", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Objects []struct {
				Source string
				Object map[string]any
			}
		}
		json.NewDecoder(r.Body).Decode(&req)
		got = nil
		for _, o := range req.Objects {
			if o.Source != "<args>" {
				t.Errorf("source %q", o.Source)
			}
			got = append(got, o.Object)
		}
		w.Write([]byte(`{"changes": [{"key": "HTTPRoute/shop/a", "action": "deleted"}]}`))
	})
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	del := func(args ...string) error {
		cmd := newDeleteCmd(&globals{instance: "test", socket: sock})
		cmd.SetArgs(args)
		cmd.SetOut(new(bytes.Buffer))
		cmd.SetErr(new(bytes.Buffer))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		return cmd.Execute()
	}

	if err := del("hr", "a", "b", "-n", "shop"); err != nil {
		t.Fatal(err)
	}
	want := `[{"apiVersion":"gateway.networking.k8s.io/v1","kind":"HTTPRoute","metadata":{"name":"a","namespace":"shop"}},` +
		`{"apiVersion":"gateway.networking.k8s.io/v1","kind":"HTTPRoute","metadata":{"name":"b","namespace":"shop"}}]`
	if b, _ := json.Marshal(got); string(b) != want {
		t.Errorf("sent %s\nwant %s", b, want)
	}
	// Cluster-scoped kinds have no namespace.
	if err := del("ns", "prod"); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(got); string(b) != `[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"prod"}}]` {
		t.Errorf("sent %s", b)
	}
	if err := del("grpcroute", "greeter"); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(got); string(b) != `[{"apiVersion":"gateway.networking.k8s.io/v1","kind":"GRPCRoute","metadata":{"name":"greeter","namespace":"default"}}]` {
		t.Errorf("sent %s", b)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"identities", "x"}, "identities are not objects and cannot be deleted"},
		{[]string{"gadget", "x"}, `the server doesn't have a resource type "gadget"`},
		{[]string{"hr"}, "give -f FILE|DIR|- or KIND NAME..."},
		{[]string{"hr", "a", "-f", "x.yaml"}, "give either -f FILE or KIND NAME, not both"},
	} {
		if err := del(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("delete %v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestServiceColumnsAsKubectl: EXTERNAL-IP and PORT(S) of NodePort and
// LoadBalancer Services read as kubectl prints them.
func TestServiceColumnsAsKubectl(t *testing.T) {
	ports := []corev1.ServicePort{{Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}, {Port: 53, NodePort: 30053, Protocol: corev1.ProtocolUDP}}
	for _, tc := range []struct {
		name      string
		svc       corev1.Service
		ext, port string
	}{
		{"NodePort", corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: ports}}, "<none>", "80:30080/TCP,53:30053/UDP"},
		{"NodePort with externalIPs", corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: ports[:1], ExternalIPs: []string{"192.0.2.1", "192.0.2.2"}}}, "192.0.2.1,192.0.2.2", "80:30080/TCP"},
		{"LoadBalancer pending", corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: ports[:1]}}, "<pending>", "80:30080/TCP"},
		{"LoadBalancer", corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: ports[:1]},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.168.124.1"}}}}}, "192.168.124.1", "80:30080/TCP"},
	} {
		if ext, port := externalIPText(&tc.svc), servicePortsText(&tc.svc); ext != tc.ext || port != tc.port {
			t.Errorf("%s: EXTERNAL-IP %q PORT(S) %q, want %q %q", tc.name, ext, port, tc.ext, tc.port)
		}
	}
}
