package meshroute

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func ptr[T any](v T) *T { return &v }

// Method matches become path matches that take the calls the GRPCRoute
// spec says, and only those.
func TestMethodMatchAsPath(t *testing.T) {
	exact, regex := gatewayv1.GRPCMethodMatchExact, gatewayv1.GRPCMethodMatchRegularExpression
	for _, c := range []struct {
		name      string
		match     gatewayv1.GRPCMethodMatch
		wantType  gatewayv1.PathMatchType
		wantValue string
		takes     []string
		refuses   []string
	}{
		{"service and method", gatewayv1.GRPCMethodMatch{Type: &exact, Service: ptr("grpc.health.v1.Health"), Method: ptr("Check")},
			gatewayv1.PathMatchExact, "/grpc.health.v1.Health/Check",
			[]string{"/grpc.health.v1.Health/Check"}, []string{"/grpc.health.v1.Health/Watch", "/grpc.health.v1.Healthy/Check"}},
		{"service only (type omitted: Exact)", gatewayv1.GRPCMethodMatch{Service: ptr("echo.Echo")},
			gatewayv1.PathMatchPathPrefix, "/echo.Echo",
			[]string{"/echo.Echo/Echo", "/echo.Echo/ForwardEcho"}, []string{"/echo.EchoTest/Echo", "/other.Svc/Echo"}},
		{"method only", gatewayv1.GRPCMethodMatch{Type: &exact, Method: ptr("Echo")},
			gatewayv1.PathMatchRegularExpression, "/[^/]+/Echo",
			[]string{"/echo.Echo/Echo", "/a.B/Echo"}, []string{"/echo.Echo/ForwardEcho", "/echo.Echo/EchoX"}},
		{"regular expressions", gatewayv1.GRPCMethodMatch{Type: &regex, Service: ptr(`echo\..*`), Method: ptr("(Forward)?Echo")},
			gatewayv1.PathMatchRegularExpression, `/(?:echo\..*)/(?:(Forward)?Echo)`,
			[]string{"/echo.Echo/Echo", "/echo.Other/ForwardEcho"}, []string{"/x.Echo/Echo", "/echo.Echo/Echo2"}},
		{"regular expression of the method only", gatewayv1.GRPCMethodMatch{Type: &regex, Method: ptr("Ec.o")},
			gatewayv1.PathMatchRegularExpression, `/[^/]+/(?:Ec.o)`,
			[]string{"/a.B/Echo"}, []string{"/a.B/Echos"}},
	} {
		m := httpMatch(gatewayv1.GRPCRouteMatch{Method: &c.match})
		if m.Path == nil || *m.Path.Type != c.wantType || *m.Path.Value != c.wantValue {
			t.Errorf("%s: path match %+v, want %s %q", c.name, m.Path, c.wantType, c.wantValue)
			continue
		}
		// The proxy's reading of each type (internal/proxy/routes.go).
		takes := func(path string) bool {
			switch c.wantType {
			case gatewayv1.PathMatchExact:
				return path == c.wantValue
			case gatewayv1.PathMatchPathPrefix:
				return path == c.wantValue || strings.HasPrefix(path, c.wantValue+"/")
			}
			return regexp.MustCompile("^(?:" + c.wantValue + ")$").MatchString(path)
		}
		for _, p := range c.takes {
			if !takes(p) {
				t.Errorf("%s: %s not taken", c.name, p)
			}
		}
		for _, p := range c.refuses {
			if takes(p) {
				t.Errorf("%s: %s taken", c.name, p)
			}
		}
	}
	if m := httpMatch(gatewayv1.GRPCRouteMatch{}); m.Path != nil {
		t.Errorf("no method match: path %+v, want none (every call)", m.Path)
	}
}

// The HTTPRoute form keeps the route's identity, parents, headers,
// filters and weights.
func TestHTTPForm(t *testing.T) {
	svc := gatewayv1.Kind("Service")
	regexHeader := gatewayv1.GRPCHeaderMatchRegularExpression
	created := metav1.NewTime(time.Unix(1000, 0))
	g := &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: "r", Generation: 3, CreationTimestamp: created},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Group: ptr(gatewayv1.Group("")), Kind: &svc, Name: "echo", Port: ptr(gatewayv1.PortNumber(7070))}}},
			Rules: []gatewayv1.GRPCRouteRule{{
				Name:    ptr(gatewayv1.SectionName("weighted")),
				Matches: []gatewayv1.GRPCRouteMatch{{Headers: []gatewayv1.GRPCHeaderMatch{{Name: "version", Value: "2"}, {Type: &regexHeader, Name: "x-tenant", Value: "a.*"}}}},
				Filters: []gatewayv1.GRPCRouteFilter{
					{Type: gatewayv1.GRPCRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Set: []gatewayv1.HTTPHeader{{Name: "x-set", Value: "1"}}}},
					{Type: gatewayv1.GRPCRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{}},
				},
				BackendRefs: []gatewayv1.GRPCBackendRef{
					{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "echo-v1", Port: ptr(gatewayv1.PortNumber(7070))}, Weight: ptr(int32(70))},
						Filters: []gatewayv1.GRPCRouteFilter{{Type: gatewayv1.GRPCRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{Remove: []string{"x-gone"}}}}},
					{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "echo-v2", Port: ptr(gatewayv1.PortNumber(7070))}, Weight: ptr(int32(30))}},
				},
			}},
		},
	}
	rt := HTTPForm(g)
	if rt.Namespace != "mesh" || rt.Name != "r" || rt.Generation != 3 || !rt.CreationTimestamp.Equal(&created) {
		t.Errorf("metadata %+v", rt.ObjectMeta)
	}
	if !reflect.DeepEqual(rt.Spec.ParentRefs, g.Spec.ParentRefs) {
		t.Errorf("parents %+v", rt.Spec.ParentRefs)
	}
	rule := rt.Spec.Rules[0]
	if *rule.Name != "weighted" {
		t.Errorf("rule name %v", rule.Name)
	}
	h := rule.Matches[0].Headers
	if len(h) != 2 || h[0].Name != "version" || h[0].Type != nil || h[0].Value != "2" || *h[1].Type != gatewayv1.HeaderMatchRegularExpression || h[1].Value != "a.*" {
		t.Errorf("headers %+v", h)
	}
	if f := rule.Filters; len(f) != 2 || f[0].Type != gatewayv1.HTTPRouteFilterRequestHeaderModifier || f[0].RequestHeaderModifier.Set[0].Name != "x-set" ||
		f[1].Type != gatewayv1.HTTPRouteFilterRequestMirror {
		t.Errorf("filters %+v", f)
	}
	b := rule.BackendRefs
	if len(b) != 2 || b[0].Name != "echo-v1" || *b[0].Weight != 70 || *b[1].Weight != 30 ||
		len(b[0].Filters) != 1 || b[0].Filters[0].ResponseHeaderModifier.Remove[0] != "x-gone" {
		t.Errorf("backendRefs %+v", b)
	}
	// The translation is a copy: the stored route is shared.
	*rt.Spec.Rules[0].BackendRefs[0].Weight = 1
	if *g.Spec.Rules[0].BackendRefs[0].Weight != 70 {
		t.Errorf("HTTPForm shares the GRPCRoute's weight")
	}
}

// An HTTPRoute and a GRPCRoute on one Service port: the oldest is
// accepted, then the first by namespace/name; routes of one kind share a
// parent, other ports and other consumers do not conflict.
func TestConflicting(t *testing.T) {
	svc := gatewayv1.Kind("Service")
	parent := func(name string, port gatewayv1.PortNumber, ns string) gatewayv1.ParentReference {
		p := gatewayv1.ParentReference{Kind: &svc, Name: gatewayv1.ObjectName(name)}
		if port != 0 {
			p.Port = &port
		}
		if ns != "" {
			p.Namespace = ptr(gatewayv1.Namespace(ns))
		}
		return p
	}
	at := func(kind, ns, name string, created int64, parents ...gatewayv1.ParentReference) Route {
		return Route{kind, &gatewayv1.HTTPRoute{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(time.Unix(created, 0))},
			Spec:       gatewayv1.HTTPRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: parents}},
		}}
	}
	http1 := at(KindHTTPRoute, "mesh", "http1", 10, parent("echo", 80, ""), parent("other", 0, ""))
	http2 := at(KindHTTPRoute, "mesh", "http2", 30, parent("echo", 0, ""))
	grpcOld := at(KindGRPCRoute, "mesh", "grpc-old", 5, parent("grpc", 7070, ""))
	grpcNew := at(KindGRPCRoute, "mesh", "grpc-new", 20, parent("echo", 0, ""), parent("echo2", 7070, ""), parent("grpc", 7070, ""))
	grpcPort := at(KindGRPCRoute, "mesh", "grpc-port", 20, parent("echo", 7070, ""), parent("other", 9, ""))
	httpSameAge := at(KindHTTPRoute, "mesh", "z", 5, parent("grpc", 0, ""))
	consumer := at(KindHTTPRoute, "client", "c", 1, parent("grpc", 7070, "mesh"))
	got := Conflicting([]Route{http1, http2, grpcOld, grpcNew, grpcPort, httpSameAge, consumer})

	for _, c := range []struct {
		r      Route
		parent int
		holder string // "": accepted
	}{
		{http1, 0, ""}, {http1, 1, ""},
		{http2, 0, "GRPCRoute mesh/grpc-port"}, // every port of echo: grpc-port, older, holds 7070
		{grpcOld, 0, ""},
		{grpcNew, 0, "HTTPRoute mesh/http1"}, // every port of echo, http1 holds port 80
		{grpcNew, 1, ""},
		{grpcNew, 2, ""},                            // grpc-old holds grpc:7070, a GRPCRoute too
		{grpcPort, 0, ""},                           // echo:7070: http1 holds 80 only (http2, every port, is newer)
		{grpcPort, 1, "HTTPRoute mesh/http1"},       // other: http1 holds every port
		{httpSameAge, 0, "GRPCRoute mesh/grpc-old"}, // same age: mesh/z sorts after mesh/grpc-old
		{consumer, 0, ""},                           // the clients of namespace client only
	} {
		why := got.Rejected(c.r, c.parent)
		switch {
		case c.holder == "" && why != "":
			t.Errorf("%s parent %d rejected: %s", c.r.Key(), c.parent, why)
		case c.holder != "" && !strings.HasPrefix(why, c.holder+","):
			t.Errorf("%s parent %d: %q, want it held by %s", c.r.Key(), c.parent, why, c.holder)
		}
	}
}
