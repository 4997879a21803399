package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/reconciler"
	"github.com/shuntnet/shunt/internal/services"
)

// nullDatapath takes every write and holds nothing: enough for a
// reconciler to compute policy in a test of the API.
type nullDatapath struct{}

func (nullDatapath) AttachPod(string, int) error                        { return nil }
func (nullDatapath) DetachPod(string) error                             { return nil }
func (nullDatapath) PolicyFits(policy.State, int) error                 { return nil }
func (nullDatapath) SyncPolicy(policy.State, []datapath.Endpoint) error { return nil }
func (nullDatapath) SyncTunnelRoutes(netip.Addr, []datapath.TunnelRoute) ([]datapath.TunnelRoute, error) {
	return nil, nil
}
func (nullDatapath) SyncDSRNodes([]netip.Addr) error                        { return nil }
func (nullDatapath) SyncServices([]services.Port) ([]netip.AddrPort, error) { return nil, nil }
func (nullDatapath) UpdateServices([]services.Port, []services.Frontend) ([]netip.AddrPort, error) {
	return nil, nil
}
func (nullDatapath) DestroyUDPSockets([]string, []netip.AddrPort) (int, error) { return 0, nil }
func (nullDatapath) SyncL7Redirects([]datapath.L7Redirect) error               { return nil }
func (nullDatapath) AttachProxy(string, string) error                          { return nil }
func (nullDatapath) DetachProxy(string) error                                  { return nil }

const namesDoc = `
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {app: web}}
spec: {nodeName: node-1, containers: [{name: web, image: agnhost}]}
status: {podIP: 10.244.0.5}
---
apiVersion: v1
kind: Pod
metadata: {name: pending, namespace: shop}
spec: {nodeName: node-1, containers: [{name: web, image: agnhost}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {selector: {app: web}, ports: [{port: 80}]}
`

// apiAgent is an agent with everything the API's name-taking handlers
// read: objects, a running reconciler that computed their policy, a
// multi-node lab's control plane (without objects), no datapath.
func apiAgent(t *testing.T) *Agent {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	objects := storeOf(t, namesDoc)
	rec := reconciler.New(reconciler.Config{NodeName: "node-1", NodeAddrs: []netip.Addr{netip.MustParseAddr("10.244.0.1")}}, nullDatapath{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rec.Run(ctx)
	rec.Update(objects(), nil)
	wait, done := context.WithTimeout(ctx, 10*time.Second)
	defer done()
	if err := rec.WaitCurrent(wait); err != nil {
		t.Fatal(err)
	}
	if rec.Policy() == nil {
		t.Fatal("no policy computed")
	}
	pods, _ := ipam.NewPool("10.244.0.0/24")
	svcs, _ := ipam.NewPool("10.96.0.0/24")
	// No state of this instance is read or written: its store stays empty.
	cp, err := lab.New(lab.Config{Instance: instance.Instance{Name: "nonamestest"}, NodeName: "node-1", PodPool: pods, ServicePool: svcs, Log: log}, rec)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: Config{Instance: instance.Instance{Name: "t"}}, log: log, objects: objects, rec: rec, nodeName: "node-1",
		flows: flows.NewHistory(16), cniEndpoints: &cniEndpoints{path: filepath.Join(t.TempDir(), "endpoints.json"), byPod: map[string]api.Endpoint{}},
		labCP: cp, src: labSource{cp}}
	a.metrics = newMetrics(a)
	return a
}

// Every handler of the API that looks a name up (pod, namespace, service,
// map, profile, flow sampling...) answers an unknown one with a non-2xx
// status and an error naming it, never a panic (which the CLI saw as an
// agent that closed the connection: "cannot reach the shunt agent ... EOF").
//
// Flows are filtered by pod, namespace and service names that need not
// exist (yet: `shunt observe --pod` may be started before the pod), so an
// unknown one there is no error, only no flows.
//
// Two routes take a name that need not be known, by design: PUT
// /v1/endpoints/NS/NAME records the endpoint of a pod whose object may
// come later (a runtime's CNI ADD precedes status.podIP), and DELETE is
// idempotent as CNI DEL must be; TestEndpointRoutesTakeNewNames has them.
func TestUnknownNames(t *testing.T) {
	a := apiAgent(t)
	h := a.apiHandler()
	objects := func(doc string) string {
		b, _ := json.Marshal(api.ObjectsRequest{Objects: []api.Object{{Source: "t.yaml", Object: json.RawMessage(doc)}}})
		return string(b)
	}
	for _, c := range []struct {
		method, path, body string
		code               int
		want               string // in the error
	}{
		{"GET", "/v1/endpoints/shop/nosuch", "", 404, "pod shop/nosuch"},
		{"GET", "/v1/endpoints/nosuch/web", "", 404, "pod nosuch/web"},
		{"GET", "/v1/maps/policy?pod=shop/nosuch", "", 404, "pod shop/nosuch not found"},
		{"GET", "/v1/maps/policy?pod=nosuch/web", "", 404, "pod nosuch/web not found"},
		{"GET", "/v1/maps/policy?pod=nosuch", "", 404, "pod default/nosuch not found"},
		{"GET", "/v1/maps/policy?pod=shop/pending", "", 404, "pod shop/pending has no address yet"},
		{"GET", "/v1/maps/policy?pod=10.244.0.5", "", 400, "10.244.0.5 is an address"},
		{"GET", "/v1/maps/policy", "", 400, "needs a pod"},
		{"GET", "/v1/policy/trace?from=shop/nosuch&to=shop/web&port=80", "", 404, "pod shop/nosuch not found"},
		{"GET", "/v1/policy/trace?from=shop/web&to=nosuch/web&port=80", "", 404, "pod nosuch/web not found"},
		{"GET", "/v1/policy/trace?from=shop/web&to=shop/web&port=80/nosuch", "", 400, `protocol "nosuch"`},
		{"GET", "/v1/maps/nosuch", "", 404, `no map "nosuch"`},
		{"GET", "/v1/maps/nosuch?raw=true", "", 404, `no map "nosuch"`},
		{"POST", "/v1/flows/sampling?mode=nosuch", "", 400, `flow sampling "nosuch"`},
		{"GET", "/v1/flows?verdict=nosuch", "", 400, `verdict "nosuch"`},
		{"GET", "/v1/flows?protocol=nosuch", "", 400, `protocol "nosuch"`},
		{"GET", "/debug/pprof/nosuch", "", 404, "Unknown profile"},
		{"PUT", lab.PathPodStatus + "shop/nosuch/status?node=node-1", `{"metadata":{"namespace":"shop","name":"nosuch"}}`, 404, "shop/nosuch"},
		{"POST", "/v1/apply", objects(`{"apiVersion":"v1","kind":"Service","metadata":{"namespace":"nosuch","name":"web"},"spec":{"ports":[{"port":80}]}}`), 422, `namespace "nosuch" not found`},
		{"POST", "/v1/delete", objects(`{"apiVersion":"v1","kind":"Service","metadata":{"namespace":"shop","name":"nosuch"}}`), 422, "Service shop/nosuch: not found"},
		{"POST", "/v1/delete", objects(`{"apiVersion":"v1","kind":"Nosuch","metadata":{"name":"x"}}`), 422, "Nosuch"},
		{"POST", "/v1/wait?timeout=50ms", objects(`{"apiVersion":"v1","kind":"Service","metadata":{"namespace":"shop","name":"nosuch"}}`), 504, "Service/shop/nosuch"},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, strings.NewReader(c.body)))
			if rec.Code != c.code || !strings.Contains(errorOf(rec), c.want) {
				t.Errorf("%d %s, want %d and %q", rec.Code, strings.TrimSpace(rec.Body.String()), c.code, c.want)
			}
		})
	}

	// An agent that serves no multi-node lab says so to a node that
	// reports a pod's status to it.
	a.labCP = nil
	rec := httptest.NewRecorder()
	h = a.apiHandler()
	h.ServeHTTP(rec, httptest.NewRequest("PUT", lab.PathPodStatus+"shop/nosuch/status", strings.NewReader(`{"metadata":{"namespace":"shop","name":"nosuch"}}`)))
	if rec.Code != 404 || !strings.Contains(errorOf(rec), `instance "t" serves no multi-node lab`) {
		t.Errorf("pod status on an agent without a lab: %d %s", rec.Code, rec.Body)
	}
}

// errorOf is the error an answer carries: api.Error's, else the body.
func errorOf(rec *httptest.ResponseRecorder) string {
	var e api.Error
	if json.Unmarshal(rec.Body.Bytes(), &e) == nil && e.Error != "" {
		return e.Error
	}
	return rec.Body.String()
}

// The endpoint routes take pods the agent does not know yet: a runtime's
// CNI ADD comes before the pod's object has an address, and a DEL of an
// unknown pod succeeds (CNI DEL is idempotent).
func TestEndpointRoutesTakeNewNames(t *testing.T) {
	a := apiAgent(t)
	h := a.apiHandler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("DELETE", "/v1/endpoints/shop/nosuch?containerID=c1", nil))
	if rec.Code != 200 {
		t.Errorf("DELETE of an unknown pod's endpoint: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("PUT", "/v1/endpoints/shop/nosuch", strings.NewReader(`{"ip":"10.244.0.9"}`)))
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "endpoint of pod shop/nosuch") {
		t.Errorf("PUT of a bad endpoint: %d %s", rec.Code, rec.Body)
	}
}

// A handler that panics answers 500 with the panic and the request, and is
// logged; the server goes on serving.
func TestHandlerPanicIsAnError(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	h := recoverPanics(log, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p *struct{ IP string }
		_ = p.IP // a nil pointer, as handlePolicyMap once read
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/maps/policy?pod=x", nil))
	var e api.Error
	if rec.Code != 500 || json.Unmarshal(rec.Body.Bytes(), &e) != nil ||
		!strings.Contains(e.Error, "GET /v1/maps/policy") || !strings.Contains(e.Error, "nil pointer dereference") {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(logged.String(), "API handler panicked") || !strings.Contains(logged.String(), "server_names_test.go") {
		t.Errorf("log: %s", logged.String())
	}
}
