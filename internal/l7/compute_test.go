package l7

import (
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/meshroute"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/proxy/l7policy"
	"github.com/shuntnet/shunt/internal/proxyapi"
	"github.com/shuntnet/shunt/internal/services"
)

func TestParseInboundRedirect(t *testing.T) {
	got, err := ParseInboundRedirect("8080:15006, 9090:15007")
	if err != nil || len(got) != 2 || got[0] != [2]uint16{8080, 15006} || got[1] != [2]uint16{9090, 15007} {
		t.Errorf("good value: %v, %v", got, err)
	}
	for bad, want := range map[string]string{
		"8080":       "want PORT:PROXYPORT",
		"8080:8080":  "loop",
		"0:15006":    "not a port",
		"8080:70000": "not a port",
		"80:1,80:2":  "twice",
		"http:15006": "not a port",
	} {
		if _, err := ParseInboundRedirect(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", bad, err, want)
		}
	}
}

// TestHostProbesPassHTTPRules: the node's kubelet probes an isolated pod's
// port with HTTP rules from the host identity; the proxy lets them through
// as the tc programs admit the host at L4 (Kubernetes' rule, and Cilium's),
// while a pod no rule allows still gets 403, and a ShuntNetworkPolicy that
// denies the host still denies it (as at L4).
func TestHostProbesPassHTTPRules(t *testing.T) {
	const base = `
apiVersion: v1
kind: Namespace
metadata: {name: prod}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: prod, labels: {app: db}}
spec: {containers: [{name: c, image: x}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: prod, labels: {app: web}}
spec: {containers: [{name: c, image: x}]}
---
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: db-http, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - peers: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: 8080}]
    http: [{method: GET, path: /api}]
`
	const denyHost = `
---
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: no-host, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - action: deny
    peers: [{entity: host}]
    ports: [{port: 8080}]
`
	host := netip.MustParseAddr("10.0.0.1")
	// decide asks as the proxy would for a GET from a pod (ns/name), or
	// from the host when pod is "".
	decide := func(docs, pod, path string) l7policy.Decision {
		t.Helper()
		objs, err := manifest.Parse("t.yaml", []byte(docs))
		if err != nil {
			t.Fatal(err)
		}
		in := policy.Input{HostAddrs: []netip.Addr{host}}
		ip := byte(10)
		for _, o := range objs {
			switch obj := o.Obj.(type) {
			case *corev1.Namespace:
				in.Namespaces = append(in.Namespaces, obj)
			case *corev1.Pod:
				in.Pods = append(in.Pods, policy.Pod{Pod: obj, IP: netip.AddrFrom4([4]byte{10, 0, 0, ip}), Local: true})
				ip++
			case *manifest.ShuntNetworkPolicy:
				in.ShuntPolicies = append(in.ShuntPolicies, obj)
			}
		}
		pol := policy.Compute(in, policy.Allocations{})
		if len(pol.L7) != 1 || !pol.L7[0].Isolated {
			t.Fatalf("L7 ports %+v, want prod/db:8080, isolated", pol.L7)
		}
		port, err := l7policy.Compile(PortPolicy(pol.L7[0], pol))
		if err != nil {
			t.Fatal(err)
		}
		peer := l7policy.Peer{Identity: pol.IdentityOf(policy.Peer{IP: host}), IP: host}
		if pod != "" {
			peer = l7policy.Peer{Identity: pol.Endpoint(pod).Identity, IP: netip.MustParseAddr("10.0.0.11")}
		}
		return port.Decide(peer,
			l7policy.Request{Method: "GET", Path: path, Header: http.Header{}})
	}
	if d := decide(base, "", "/healthz"); !d.Allowed || !strings.Contains(d.Rule, "node-to-local-pod") {
		t.Errorf("the host's probe GET /healthz: %+v, want allowed by the node's built-in rule", d)
	}
	if d := decide(base, "prod/web", "/healthz"); d.Allowed || d.Explanation != "no rule of ShuntNetworkPolicy prod/db-http allows GET /healthz" {
		t.Errorf("prod/web GET /healthz: %+v, want refused naming only the policy (only GET /api is allowed to it)", d)
	}
	if d := decide(base, "prod/web", "/api"); !d.Allowed {
		t.Errorf("prod/web GET /api: %+v, want allowed", d)
	}
	if d := decide(base+denyHost, "", "/healthz"); d.Allowed || d.DropReason != l7policy.ReasonDenied {
		t.Errorf("the host's probe with a policy denying the host: %+v, want denied", d)
	}
}

// A route's filters reach the proxy as they were written; one the proxy
// does not implement is named, and a parent of another namespace makes
// the route a consumer route of its own namespace.
func TestRouteFiltersAndConsumers(t *testing.T) {
	ptr := func(s string) *string { return &s }
	svcKind, otherNS := gatewayv1.Kind("Service"), gatewayv1.Namespace("producer")
	host := gatewayv1.PreciseHostname("example.org")
	code, port := 301, gatewayv1.PortNumber(8083)
	rt := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "consumer", Name: "r"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{
				{Kind: &svcKind, Name: "echo", Namespace: &otherNS},
				{Kind: &svcKind, Name: "local"},
			}},
			Rules: []gatewayv1.HTTPRouteRule{
				{Filters: []gatewayv1.HTTPRouteFilter{
					{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
						Set: []gatewayv1.HTTPHeader{{Name: "X-Set", Value: "v"}}, Add: []gatewayv1.HTTPHeader{{Name: "X-Add", Value: "a"}}, Remove: []string{"X-Gone"}}},
					{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
						Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr("/new")}}},
				}, BackendRefs: []gatewayv1.HTTPBackendRef{{Filters: []gatewayv1.HTTPRouteFilter{
					{Type: gatewayv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{Remove: []string{"Server"}}}}},
					{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{}}}}}},
				{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
					Scheme: ptr("https"), Hostname: &host, Port: &port, StatusCode: &code,
					Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.FullPathHTTPPathModifier, ReplaceFullPath: ptr("/x")}}}}},
				{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterCORS, CORS: &gatewayv1.HTTPCORSFilter{}}}},
			},
		},
	}
	got := route(meshroute.Route{Kind: meshroute.KindHTTPRoute, HTTPRoute: rt}, nil, nil, map[string][]services.Port{})
	wantParents := []proxyapi.ParentRef{{Service: "producer/echo", Consumer: "consumer"}, {Service: "consumer/local"}}
	if !reflect.DeepEqual(got.Parents, wantParents) {
		t.Errorf("parents %+v, want %+v", got.Parents, wantParents)
	}
	want := []*proxyapi.Filters{
		{RequestHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-Set", Value: "v"}}, Add: []proxyapi.Header{{Name: "X-Add", Value: "a"}}, Remove: []string{"X-Gone"}},
			Rewrite: &proxyapi.Rewrite{Path: &proxyapi.PathModifier{Type: proxyapi.ReplacePrefixMatch, Value: "/new"}}},
		{Redirect: &proxyapi.Redirect{Scheme: "https", Hostname: "example.org", Port: 8083, StatusCode: 301,
			Path: &proxyapi.PathModifier{Type: proxyapi.ReplaceFullPath, Value: "/x"}}},
		{Unsupported: "filter CORS is not implemented by shunt's proxy"},
	}
	for i, w := range want {
		if !reflect.DeepEqual(got.Rules[i].Filters, w) {
			t.Errorf("rule %d: filters %+v, want %+v", i, got.Rules[i].Filters, w)
		}
	}
	if f := got.Rules[0].Backends[0].Filters; f == nil || !reflect.DeepEqual(f.ResponseHeaders, &proxyapi.HeaderModifier{Remove: []string{"Server"}}) {
		t.Errorf("the backendRef's filters: %+v", f)
	}
	if f := got.Rules[0].Backends[1].Filters; f == nil || f.Unsupported != "filter URLRewrite (on a backendRef) is not implemented by shunt's proxy" {
		t.Errorf("a backendRef's URLRewrite: %+v, want it named unsupported", f)
	}
}

// A GRPCRoute on a Service port reaches the proxy as a route of kind
// GRPCRoute whose method match is the path "/service/method", with its
// weights; an HTTPRoute created after it on the same Service port is
// rejected there (the oldest of the two kinds is accepted) and keeps its
// other parents.
func TestGRPCRouteAndConflictWithHTTPRoute(t *testing.T) {
	svcKind := gatewayv1.Kind("Service")
	port := func(p gatewayv1.PortNumber) *gatewayv1.PortNumber { return &p }
	weight := func(w int32) *int32 { return &w }
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: "echo", CreationTimestamp: metav1.NewTime(t0)},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &svcKind, Name: "echo", Port: port(7070)}}},
			Rules: []gatewayv1.GRPCRouteRule{{
				Matches: []gatewayv1.GRPCRouteMatch{{Method: &gatewayv1.GRPCMethodMatch{Service: new("echo.Echo"), Method: new("Echo")},
					Headers: []gatewayv1.GRPCHeaderMatch{{Name: "x-version", Value: "2"}}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{
					{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "echo-v1", Port: port(7070)}, Weight: weight(70)}},
					{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "echo-v2", Port: port(7070)}, Weight: weight(30)}},
				},
			}},
		},
	}
	h := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: "echo", CreationTimestamp: metav1.NewTime(t0.Add(time.Minute))},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &svcKind, Name: "echo"}, {Kind: &svcKind, Name: "echo-v2", Port: port(80)}}},
			Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{
				{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "echo-v1", Port: port(7070)}}}}}},
		},
	}
	store := model.NewStore([]manifest.Object{{Obj: g}, {Obj: h}})
	if len(store.GRPCRoutes()) != 1 || len(store.HTTPRoutes()) != 1 {
		t.Fatalf("store: %d GRPCRoutes, %d HTTPRoutes, want 1 and 1", len(store.GRPCRoutes()), len(store.HTTPRoutes()))
	}
	var ports []services.Port
	for i, name := range []string{"echo", "echo-v1", "echo-v2"} {
		for _, p := range []uint16{80, 7070} {
			sp := services.Port{Name: fmt.Sprintf("mesh/%s:%d", name, p), Backends: []services.Backend{{IP: netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)}), Port: p}}}
			sp.Frontend = services.Frontend{VIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), Port: p, Proto: tcp}
			ports = append(ports, sp)
		}
	}
	res := Compute(Input{Store: store, Ports: ports})
	if len(res.Config.Routes) != 2 {
		t.Fatalf("routes %+v, want the HTTPRoute and the GRPCRoute", res.Config.Routes)
	}
	hr, gr := res.Config.Routes[0], res.Config.Routes[1]
	if hr.Kind != "" || gr.Kind != "GRPCRoute" || gr.Name != "mesh/echo" {
		t.Fatalf("routes %+v, %+v: want the HTTPRoute first, then the GRPCRoute mesh/echo", hr, gr)
	}
	if want := []proxyapi.ParentRef{{Service: "mesh/echo", Port: 7070}}; !reflect.DeepEqual(gr.Parents, want) {
		t.Errorf("GRPCRoute parents %+v, want %+v", gr.Parents, want)
	}
	if want := []proxyapi.ParentRef{{Service: "mesh/echo-v2", Port: 80}}; !reflect.DeepEqual(hr.Parents, want) {
		t.Errorf("HTTPRoute parents %+v, want %+v (echo is the older GRPCRoute's)", hr.Parents, want)
	}
	wantRule := proxyapi.RouteRule{
		Matches: []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchExact, Value: "/echo.Echo/Echo"},
			Headers: []proxyapi.HeaderMatch{{Type: proxyapi.MatchExact, Name: "x-version", Value: "2"}}}},
		Backends: []proxyapi.RouteBackend{{Service: "mesh/echo-v1", Port: 7070, Weight: 70}, {Service: "mesh/echo-v2", Port: 7070, Weight: 30}},
	}
	if !reflect.DeepEqual(gr.Rules, []proxyapi.RouteRule{wantRule}) {
		t.Errorf("GRPCRoute rules %+v, want %+v", gr.Rules, wantRule)
	}
	// echo:7070 (the GRPCRoute's), echo-v2:80 (the HTTPRoute's); not echo:80.
	want := []netip.AddrPort{netip.MustParseAddrPort("10.96.0.1:7070"), netip.MustParseAddrPort("10.96.0.3:80")}
	if !reflect.DeepEqual(res.Redirects, want) {
		t.Errorf("redirects %v, want %v", res.Redirects, want)
	}
}

// A filter whose text holds a control byte (the standard CRD lets a header
// value or a path hold a CR LF) reaches the proxy as an unsupported filter
// naming the filter and field: its rule, or its backendRef's share, is
// answered 500 and nothing of it is written; the proxy's configuration
// stays valid, so other routes are still served. A tab in a value is kept.
func TestRouteFilterControlBytes(t *testing.T) {
	svcKind := gatewayv1.Kind("Service")
	ptr := func(s string) *string { return &s }
	host := gatewayv1.PreciseHostname("evil\r\nSet-Cookie: a=b")
	header := func(value string) gatewayv1.HTTPRouteFilter {
		return gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
			Set: []gatewayv1.HTTPHeader{{Name: "X-Ok", Value: "fine"}, {Name: "X-Tag", Value: value}}}}
	}
	rt := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "r"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &svcKind, Name: "echo"}}},
			Rules: []gatewayv1.HTTPRouteRule{
				{Filters: []gatewayv1.HTTPRouteFilter{header("a\r\nX-Evil: 1")}},
				{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
					Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.FullPathHTTPPathModifier, ReplaceFullPath: ptr("/x\x00")}}}}},
				{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{Hostname: &host}}}},
				{Filters: []gatewayv1.HTTPRouteFilter{header("a\tb")}, BackendRefs: []gatewayv1.HTTPBackendRef{{Filters: []gatewayv1.HTTPRouteFilter{
					{Type: gatewayv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{Add: []gatewayv1.HTTPHeader{{Name: "X-Del", Value: "\x7f"}}}}}}}},
			},
		},
	}
	got := route(meshroute.Route{Kind: meshroute.KindHTTPRoute, HTTPRoute: rt}, nil, nil, map[string][]services.Port{})
	for i, want := range []string{
		`filters[0] (RequestHeaderModifier).set[1].value: "a\r\nX-Evil: 1" has a CR (0x0d) at byte 1`,
		`filters[0] (URLRewrite).path.replaceFullPath: "/x\x00" has a NUL (0x00) at byte 2`,
		`filters[0] (RequestRedirect).hostname: "evil\r\nSet-Cookie: a=b" has a CR (0x0d) at byte 4`,
	} {
		f := got.Rules[i].Filters
		if f == nil || !strings.HasPrefix(f.Unsupported, want) || !reflect.DeepEqual(*f, proxyapi.Filters{Unsupported: f.Unsupported}) {
			t.Errorf("rule %d: filters %+v, want only Unsupported starting %q", i, f, want)
		}
	}
	if f := got.Rules[3].Filters; f == nil || f.Unsupported != "" || f.RequestHeaders.Set[1].Value != "a\tb" {
		t.Errorf("rule 3 (a tab in a value): filters %+v, want the header kept", f)
	}
	if f := got.Rules[3].Backends[0].Filters; f == nil || !strings.HasPrefix(f.Unsupported, `filters[0] (ResponseHeaderModifier).add[0].value: "\x7f" has a DEL (0x7f)`) || f.ResponseHeaders != nil {
		t.Errorf("the backendRef's filters: %+v, want only Unsupported naming the DEL", f)
	}
	for i, rule := range got.Rules {
		all := []*proxyapi.Filters{rule.Filters}
		for _, b := range rule.Backends {
			all = append(all, b.Filters)
		}
		for _, f := range all {
			if p := f.TextProblems(); len(p) > 0 {
				t.Errorf("rule %d: the proxy would refuse the configuration: %v", i, p)
			}
		}
	}
}

// Values the Gateway API's CRD lets through but the proxy cannot apply (a
// regular expression RE2 does not compile, a relative full path) must
// not reach the proxy as they are: it would
// refuse the node's whole configuration, freezing every route of the node
// on its last good one. A rule with such a match is dropped (it keeps its
// index, so the next rules keep theirs); one with such a filter answers
// 500; InvalidRules names both for the route's status.
func TestRouteValuesTheProxyRefuses(t *testing.T) {
	svcKind := gatewayv1.Kind("Service")
	ptr := func(s string) *string { return &s }
	regex := gatewayv1.PathMatchRegularExpression
	headerRegex := gatewayv1.HeaderMatchRegularExpression
	rt := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "r"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &svcKind, Name: "echo"}}},
			Rules: []gatewayv1.HTTPRouteRule{
				{Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: &regex, Value: ptr("/api/(v1")}}}},
				{Matches: []gatewayv1.HTTPRouteMatch{{}, {Headers: []gatewayv1.HTTPHeaderMatch{{Type: &headerRegex, Name: "X-V", Value: "[a-"}}}}},
				{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
					Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.FullPathHTTPPathModifier, ReplaceFullPath: ptr("v2/api")}}}}},
				{BackendRefs: []gatewayv1.HTTPBackendRef{{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect,
					RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{Hostname: (*gatewayv1.PreciseHostname)(ptr("elsewhere"))}}}}}},
				{Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: &regex, Value: ptr("/api/v[0-9]+")}}}},
			},
		},
	}
	got := route(meshroute.Route{Kind: meshroute.KindHTTPRoute, HTTPRoute: rt}, nil, nil, map[string][]services.Port{})
	if len(got.Rules) != 5 {
		t.Fatalf("%d rules, want 5 (a dropped rule keeps its place)", len(got.Rules))
	}
	for i, want := range []string{
		`matches[0].path.value: "/api/(v1" is not an RE2 regular expression`,
		`matches[1].headers[0].value: "[a-" is not an RE2 regular expression`,
	} {
		if r := got.Rules[i]; !strings.HasPrefix(r.Dropped, want) || r.Matches != nil {
			t.Errorf("rule %d: %+v, want dropped, no matches, saying %q", i, r, want)
		}
	}
	if f := got.Rules[2].Filters; f == nil || !strings.HasPrefix(f.Unsupported, `filters[0] (URLRewrite).path.replaceFullPath: "v2/api" must start with /`) || f.Rewrite != nil {
		t.Errorf("rule 2 (relative full path): filters %+v, want only Unsupported naming the path", f)
	}
	if f := got.Rules[3].Backends[0].Filters; f == nil || f.Unsupported != "filter RequestRedirect (on a backendRef) is not implemented by shunt's proxy" || f.Redirect != nil {
		t.Errorf("rule 3 (a redirect on a backendRef): filters %+v, want only Unsupported naming it", f)
	}
	if r := got.Rules[4]; r.Dropped != "" || len(r.Matches) != 1 || r.Matches[0].Path.Value != "/api/v[0-9]+" {
		t.Errorf("rule 4 (a good regular expression): %+v, want kept", r)
	}
	// What reaches the proxy is what it accepts.
	for i, rule := range got.Rules {
		if rule.Dropped != "" {
			continue
		}
		for _, m := range rule.Matches {
			if p := m.Problems(); len(p) > 0 {
				t.Errorf("rule %d: the proxy would refuse its match: %v", i, p)
			}
		}
		if p := rule.Filters.Problems(rule.PrefixOnly(), false); len(p) > 0 {
			t.Errorf("rule %d: the proxy would refuse its filters: %v", i, p)
		}
		for _, b := range rule.Backends {
			if p := b.Filters.Problems(rule.PrefixOnly(), true); len(p) > 0 {
				t.Errorf("rule %d: the proxy would refuse a backendRef's filters: %v", i, p)
			}
		}
	}
	rules, problems := InvalidRules(rt)
	if !reflect.DeepEqual(rules, []int{0, 1, 2, 3}) || len(problems) != 4 || !strings.HasPrefix(problems[0], "rules[0].matches[0].path.value:") ||
		!strings.HasPrefix(problems[2], "rules[2].filters[0] (URLRewrite).path.replaceFullPath:") ||
		problems[3] != "rules[3].backendRefs[0].filters[0] (RequestRedirect): not implemented by shunt's proxy on a backendRef" {
		t.Errorf("InvalidRules: %v %q, want rules 0-3 named (rule 3: a filter not implemented)", rules, problems)
	}
	// A filter type the proxy does not implement is named too (its rule
	// answers 500): the route's status says so, not only the flows.
	cors := &gatewayv1.HTTPRoute{Spec: gatewayv1.HTTPRouteSpec{Rules: []gatewayv1.HTTPRouteRule{{}, {Filters: []gatewayv1.HTTPRouteFilter{
		{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{}},
		{Type: gatewayv1.HTTPRouteFilterCORS, CORS: &gatewayv1.HTTPCORSFilter{}}}}}}}
	if rules, problems := InvalidRules(cors); !reflect.DeepEqual(rules, []int{1}) ||
		!reflect.DeepEqual(problems, []string{"rules[1].filters[1] (CORS): not implemented by shunt's proxy"}) {
		t.Errorf("InvalidRules of a CORS filter: %v %q, want rule 1 naming it", rules, problems)
	}
}

// RequestMirror filters: each resolved one is listed with its share
// (Percent, Fraction, or every request), its Service among the proxy's
// services; one whose ref does not resolve or whose share is 0 is dropped
// (the rule still forwards); on a backendRef it is not implemented.
func TestRouteMirrors(t *testing.T) {
	port, pct := gatewayv1.PortNumber(8080), int32(25)
	den := int32(1000)
	other := gatewayv1.Namespace("elsewhere")
	mirrorTo := func(name gatewayv1.ObjectName, ns *gatewayv1.Namespace) gatewayv1.BackendObjectReference {
		return gatewayv1.BackendObjectReference{Name: name, Namespace: ns, Port: &port}
	}
	filter := func(mf gatewayv1.HTTPRequestMirrorFilter) gatewayv1.HTTPRouteFilter {
		return gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &mf}
	}
	zero := int32(0)
	rt := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "shadow"},
		Spec: gatewayv1.HTTPRouteSpec{Rules: []gatewayv1.HTTPRouteRule{{
			Filters: []gatewayv1.HTTPRouteFilter{
				filter(gatewayv1.HTTPRequestMirrorFilter{BackendRef: mirrorTo("shadow-all", nil)}),
				filter(gatewayv1.HTTPRequestMirrorFilter{BackendRef: mirrorTo("shadow-some", nil), Percent: &pct}),
				filter(gatewayv1.HTTPRequestMirrorFilter{BackendRef: mirrorTo("shadow-few", nil), Fraction: &gatewayv1.Fraction{Numerator: 5, Denominator: &den}}),
				filter(gatewayv1.HTTPRequestMirrorFilter{BackendRef: mirrorTo("missing", nil)}),
				filter(gatewayv1.HTTPRequestMirrorFilter{BackendRef: mirrorTo("shadow-all", &other)}), // no ReferenceGrant
				filter(gatewayv1.HTTPRequestMirrorFilter{BackendRef: mirrorTo("shadow-all", nil), Percent: &zero}),
			},
			BackendRefs: []gatewayv1.HTTPBackendRef{
				{BackendRef: gatewayv1.BackendRef{BackendObjectReference: mirrorTo("web", nil)}},
				{BackendRef: gatewayv1.BackendRef{BackendObjectReference: mirrorTo("web", nil)},
					Filters: []gatewayv1.HTTPRouteFilter{filter(gatewayv1.HTTPRequestMirrorFilter{BackendRef: mirrorTo("shadow-all", nil)})}},
			},
		}}},
	}
	byName := map[string][]services.Port{}
	for _, name := range []string{"shop/web", "shop/shadow-all", "shop/shadow-some", "shop/shadow-few", "elsewhere/shadow-all"} {
		byName[name] = []services.Port{{Name: name + ":8080", Frontend: services.Frontend{Port: 8080, Proto: tcp}}}
	}
	got := route(meshroute.Route{Kind: meshroute.KindHTTPRoute, HTTPRoute: rt}, nil, meshroute.NewGrants(nil), byName)
	want := &proxyapi.Filters{Mirrors: []proxyapi.Mirror{
		{Service: "shop/shadow-all", Port: 8080, Percent: 100},
		{Service: "shop/shadow-some", Port: 8080, Percent: 25},
		{Service: "shop/shadow-few", Port: 8080, Percent: 0.5},
	}}
	if f := got.Rules[0].Filters; !reflect.DeepEqual(f, want) {
		t.Errorf("rule filters %+v, want %+v", f, want)
	}
	if f := got.Rules[0].Filters; len(f.Problems(false, false)) > 0 {
		t.Errorf("the proxy would refuse the mirrors: %v", f.Problems(false, false))
	}
	if f := got.Rules[0].Backends[1].Filters; f == nil || f.Unsupported != "filter RequestMirror (on a backendRef) is not implemented by shunt's proxy" {
		t.Errorf("a backendRef's RequestMirror: %+v, want it named unsupported", f)
	}
	if rules, problems := InvalidRules(rt); !reflect.DeepEqual(rules, []int{0}) ||
		!reflect.DeepEqual(problems, []string{"rules[0].backendRefs[1].filters[0] (RequestMirror): not implemented by shunt's proxy on a backendRef"}) {
		t.Errorf("InvalidRules: %v %q, want only the backendRef's mirror", rules, problems)
	}
}

// A backendRef to another namespace's Service that no ReferenceGrant
// permits is kept unresolved (its share of requests answered 500), with
// the reason; with a grant it resolves; the route's own parent Service
// needs none (GAMMA's consumer routes).
func TestCrossNamespaceBackendNeedsGrant(t *testing.T) {
	port := gatewayv1.PortNumber(80)
	shop, producer := gatewayv1.Namespace("shop"), gatewayv1.Namespace("producer")
	kind := gatewayv1.Kind("Service")
	rt := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "r"},
		Spec: gatewayv1.HTTPRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{
			ParentRefs: []gatewayv1.ParentReference{{Kind: &kind, Name: "echo", Namespace: &producer}}}}}
	ref := func(ns *gatewayv1.Namespace, name string) gatewayv1.BackendRef {
		return gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(name), Namespace: ns, Port: &port}}
	}
	byName := map[string][]services.Port{
		"shop/web":      {{Frontend: services.Frontend{Port: 80}}},
		"producer/echo": {{Frontend: services.Frontend{Port: 80}}},
	}
	if b := backend(meshroute.KindHTTPRoute, rt, ref(&shop, "web"), nil, byName); !strings.Contains(b.Unresolved, "no ReferenceGrant of namespace shop") {
		t.Errorf("shop/web without a grant: %+v, want unresolved for want of a ReferenceGrant", b)
	}
	if b := backend(meshroute.KindHTTPRoute, rt, ref(&producer, "echo"), nil, byName); b.Unresolved != "" {
		t.Errorf("the route's parent producer/echo: %+v, want resolved without a grant", b)
	}
	grants := meshroute.NewGrants([]*gatewayv1beta1.ReferenceGrant{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "g"},
		Spec: gatewayv1beta1.ReferenceGrantSpec{
			From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: "default"}},
			To:   []gatewayv1beta1.ReferenceGrantTo{{Kind: "Service"}}}}})
	if b := backend(meshroute.KindHTTPRoute, rt, ref(&shop, "web"), grants, byName); b.Unresolved != "" || b.Service != "shop/web" {
		t.Errorf("shop/web with a grant: %+v, want resolved", b)
	}
	if b := backend(meshroute.KindGRPCRoute, rt, ref(&shop, "web"), grants, byName); b.Unresolved == "" {
		t.Errorf("shop/web from a GRPCRoute, granted to HTTPRoutes only: %+v, want unresolved", b)
	}
}
