package agent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// The route listing is Kubernetes-shaped, with the routes' status.
func TestHTTPRouteListing(t *testing.T) {
	a := &Agent{objects: storeOf(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: split, labels: {team: a}}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules: [{backendRefs: [{name: reviews-v1, port: 9080}]}]
status:
  parents: [{parentRef: {group: "", kind: Service, name: reviews}, controllerName: shunt.io/lab,
    conditions: [{type: Accepted, status: "True", reason: Accepted, message: ok, lastTransitionTime: "2026-01-02T03:04:05Z"}]}]
`)}
	rec := httptest.NewRecorder()
	a.handleHTTPRoutes(rec, httptest.NewRequest("GET", "/v1/httproutes", nil))
	var l gatewayv1.HTTPRouteList
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &l) != nil {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if l.APIVersion != "v1" || l.Kind != "List" || len(l.Items) != 1 {
		t.Fatalf("list %+v", l)
	}
	if rt := l.Items[0]; rt.APIVersion != "gateway.networking.k8s.io/v1" || rt.Kind != "HTTPRoute" || rt.Namespace != "default" ||
		len(rt.Status.Parents) != 1 || rt.Status.Parents[0].Conditions[0].Type != "Accepted" {
		t.Errorf("route %+v", rt)
	}

	empty := &Agent{objects: storeOf(t, "")}
	rec = httptest.NewRecorder()
	empty.handleHTTPRoutes(rec, httptest.NewRequest("GET", "/v1/httproutes", nil))
	var raw struct{ Items json.RawMessage }
	if json.Unmarshal(rec.Body.Bytes(), &raw) != nil || string(raw.Items) != "[]" {
		t.Errorf("empty list: %s, want items []", rec.Body)
	}
}

// GRPCRoutes are listed as HTTPRoutes are.
func TestGRPCRouteListing(t *testing.T) {
	a := &Agent{objects: storeOf(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: greeter, namespace: mesh}
spec:
  parentRefs: [{group: "", kind: Service, name: greeter, port: 9090}]
  rules: [{matches: [{method: {service: grpc.health.v1.Health}}], backendRefs: [{name: greeter, port: 9090}]}]
`)}
	rec := httptest.NewRecorder()
	a.handleGRPCRoutes(rec, httptest.NewRequest("GET", "/v1/grpcroutes", nil))
	var l gatewayv1.GRPCRouteList
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &l) != nil {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if l.APIVersion != "v1" || l.Kind != "List" || len(l.Items) != 1 {
		t.Fatalf("list %+v", l)
	}
	if rt := l.Items[0]; rt.APIVersion != "gateway.networking.k8s.io/v1" || rt.Kind != "GRPCRoute" || rt.Namespace != "mesh" ||
		len(rt.Spec.Rules) != 1 || *rt.Spec.Rules[0].Matches[0].Method.Service != "grpc.health.v1.Health" {
		t.Errorf("route %+v", rt)
	}

	empty := &Agent{objects: storeOf(t, "")}
	rec = httptest.NewRecorder()
	empty.handleGRPCRoutes(rec, httptest.NewRequest("GET", "/v1/grpcroutes", nil))
	var raw struct{ Items json.RawMessage }
	if json.Unmarshal(rec.Body.Bytes(), &raw) != nil || string(raw.Items) != "[]" {
		t.Errorf("empty list: %s, want items []", rec.Body)
	}
}
