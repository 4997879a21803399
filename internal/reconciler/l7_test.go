package reconciler

import (
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

const l7Docs = `
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec: {nodeName: node-1, containers: [{name: c, command: [x]}]}
status: {podIP: 10.244.0.5}
---
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: web-http}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - ports: [{port: 8080}]
    http: [{method: GET, path: /metrics}]
`

// TestL7RedirectsFollowPolicyAndRoutes: a pod port with HTTP rules, and
// the service ports reaching it, are redirected to the proxy and the proxy
// gets the port's rules; an HTTPRoute's parent service is redirected and
// its unresolvable backend is marked; removing them removes the redirects.
func TestL7RedirectsFollowPolicyAndRoutes(t *testing.T) {
	f := newFake()
	proxy := netip.MustParseAddrPort("10.244.0.1:15001")
	var mu sync.Mutex
	var last proxyapi.Config
	r := New(Config{NodeName: "node-1", NodeAddrs: []netip.Addr{proxy.Addr()}, ProxyAddr: proxy,
		ProxyConfig: func(c proxyapi.Config) { mu.Lock(); last = c; mu.Unlock() }}, f)
	runUntilEnd(t, r)
	wait(t, r, r.SetEndpoint(endpoint("default/web", "10.244.0.5", "lxc1", 7)))
	s := apply(t, r, model.New(), l7Docs+service("web", "10.96.0.1", "10.244.0.5")+service("other", "10.96.0.2", "10.244.0.9"))
	if got, want := redirectDests(f), []string{"10.96.0.1:80", "10.244.0.5:8080"}; !slices.Equal(got, want) {
		t.Errorf("redirects %v, want %v (the pod port and the service reaching it)", got, want)
	}
	mu.Lock()
	if len(last.Policies) != 1 || last.Policies[0].Endpoint != "10.244.0.5" || last.Policies[0].Port != 8080 ||
		len(last.Services) != 1 || last.Services[0].Name != "default/web" {
		t.Errorf("proxy config %+v: want web:8080's policy and the web service", last)
	}
	mu.Unlock()

	route := &gatewayv1.HTTPRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: "gateway.networking.k8s.io/v1", Kind: "HTTPRoute"},
		ObjectMeta: metav1.ObjectMeta{Name: "split", Namespace: "default"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{
				Group: ptr(gatewayv1.Group("")), Kind: ptr(gatewayv1.Kind("Service")), Name: "other"}}},
			Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{
				{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "web", Port: ptr(gatewayv1.PortNumber(80))}, Weight: ptr(int32(90))}},
				{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "missing", Port: ptr(gatewayv1.PortNumber(80))}, Weight: ptr(int32(10))}},
			}}},
		},
	}
	next, changes := s.Put([]manifest.Object{{Source: "test", Obj: route}})
	wait(t, r, r.Update(next, changes))
	if got, want := redirectDests(f), []string{"10.96.0.1:80", "10.96.0.2:80", "10.244.0.5:8080"}; !slices.Equal(got, want) {
		t.Errorf("redirects %v, want %v (the route's parent added)", got, want)
	}
	mu.Lock()
	if len(last.Routes) != 1 || len(last.Routes[0].Rules) != 1 || last.Routes[0].Rules[0].Backends[1].Unresolved == "" ||
		last.Routes[0].Rules[0].Backends[0].Unresolved != "" {
		t.Errorf("route in the proxy config: %+v", last.Routes)
	}
	mu.Unlock()

	next, changes = next.Remove([]manifest.Key{{Kind: "HTTPRoute", Namespace: "default", Name: "split"},
		{Kind: manifest.KindShuntNetworkPolicy, Namespace: "default", Name: "web-http"}})
	wait(t, r, r.Update(next, changes))
	if got := redirectDests(f); len(got) != 0 {
		t.Errorf("redirects %v after the route and the policy went, want none", got)
	}
}

func ptr[T any](v T) *T { return &v }

func redirectDests(f *fakeDatapath) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.redirects {
		out = append(out, r.Dest.String())
	}
	return out
}

// TestProxyConfigCompleteOnlyWithObjects: a configuration computed before
// the source's first Update (a restarted agent that restored its endpoints
// and waits for the objects) is marked incomplete, so neither the agent
// nor the proxy puts it in place of the one the proxy kept; with
// WaitForObjects none is computed at all. The first configuration after
// the objects came is complete and has the routes.
func TestProxyConfigCompleteOnlyWithObjects(t *testing.T) {
	for _, waitForObjects := range []bool{false, true} {
		f := newFake()
		proxy := netip.MustParseAddrPort("10.244.0.1:15001")
		var mu sync.Mutex
		var got []proxyapi.Config
		r := New(Config{NodeName: "node-1", NodeAddrs: []netip.Addr{proxy.Addr()}, ProxyAddr: proxy, WaitForObjects: waitForObjects,
			ProxyConfig: func(c proxyapi.Config) { mu.Lock(); got = append(got, c); mu.Unlock() }}, f)
		runUntilEnd(t, r)
		// The source is held back: only the restored endpoint is known.
		gen := r.SetEndpoint(endpoint("default/web", "10.244.0.5", "lxc1", 7))
		if !waitForObjects {
			wait(t, r, gen)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
		mu.Lock()
		before := slices.Clone(got)
		mu.Unlock()
		switch {
		case waitForObjects && len(before) != 0:
			t.Errorf("WaitForObjects: %d configurations before the objects came, want none", len(before))
		case !waitForObjects && (len(before) == 0 || slices.ContainsFunc(before, func(c proxyapi.Config) bool { return c.Complete })):
			t.Errorf("configurations before the objects came: %+v, want at least one, none complete", before)
		}
		apply(t, r, model.New(), l7Docs+service("web", "10.96.0.1", "10.244.0.5"))
		mu.Lock()
		last := got[len(got)-1]
		mu.Unlock()
		if !last.Complete || len(last.Policies) != 1 || len(last.Services) != 1 {
			t.Errorf("WaitForObjects %v: configuration after the objects came %+v, want complete with web's policy and service", waitForObjects, last)
		}
	}
}

const remoteL7Docs = `
apiVersion: v1
kind: Node
metadata: {name: node-2}
spec: {podCIDR: 10.244.1.0/24}
status: {addresses: [{type: InternalIP, address: 192.168.50.12}]}
---
apiVersion: v1
kind: Pod
metadata: {name: far, labels: {app: web}}
spec: {nodeName: node-2, containers: [{name: c, command: [x]}]}
status: {podIP: 10.244.1.5}
`

// TestL7RemotePortsByRouting: with the overlay, another node's pod port
// with HTTP rules is sent to this node's proxy (the VNI carries the
// client's identity on); with native routing it is not (the server's node
// steers the client's own connection in tc). Either way the proxy has
// that port's rules, for the requests it sends there itself (a route, a
// service with a local L7 backend; with native routing its SYN carries
// the client's identity in a TCP option and is not steered again), and
// its endpoints name that node's pods by address, for the connections tc
// steers to it.
func TestL7RemotePortsByRouting(t *testing.T) {
	for _, native := range []bool{false, true} {
		f := newFake()
		proxy := netip.MustParseAddrPort("10.244.0.1:15001")
		var mu sync.Mutex
		var last proxyapi.Config
		r := New(Config{NodeName: "node-1", NodeAddrs: []netip.Addr{proxy.Addr()}, ProxyAddr: proxy, NativeRouting: native,
			ProxyConfig: func(c proxyapi.Config) { mu.Lock(); last = c; mu.Unlock() }}, f)
		runUntilEnd(t, r)
		wait(t, r, r.SetEndpoint(endpoint("default/web", "10.244.0.5", "lxc1", 7)))
		apply(t, r, model.New(), l7Docs+"---"+remoteL7Docs)
		got := redirectDests(f)
		if remote := slices.Contains(got, "10.244.1.5:8080"); remote == native {
			t.Errorf("native routing %v: redirects %v, want the other node's HTTP port only with the overlay", native, got)
		}
		mu.Lock()
		if !slices.ContainsFunc(last.Policies, func(p proxyapi.PortPolicy) bool { return p.Endpoint == "10.244.1.5" && p.Port == 8080 }) {
			t.Errorf("native routing %v: proxy policies %+v, want the other node's HTTP port's rules", native, last.Policies)
		}
		var named bool
		for _, ep := range last.Endpoints {
			named = named || (ep.IP == "10.244.1.5" && ep.Pod == "default/far" && ep.Identity != 0)
		}
		if !named {
			t.Errorf("native routing %v: proxy endpoints %+v, want default/far of node-2 with its identity", native, last.Endpoints)
		}
		mu.Unlock()
	}
}
