// Package meshroute holds what HTTPRoutes and GRPCRoutes attached to
// Services (GAMMA) share: a GRPCRoute in HTTPRoute form, which the proxy's
// translation (internal/l7) and the status writer (internal/routestatus)
// take as they take an HTTPRoute, and the conflicts between routes of the
// two kinds on one Service port, which the Gateway API settles by age.
//
// gRPC is HTTP/2: a method match is a match on the request path
// "/service/method", a gRPC header match a header match, and the proxy
// carries h2c end to end. So a GRPCRoute needs no proxy of its own, only
// this translation (GEP-1016 expects implementations to build GRPCRoute
// on HTTPRoute this way).
package meshroute

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
)

// Kinds of route, as the Gateway API names them.
const (
	KindHTTPRoute = "HTTPRoute"
	KindGRPCRoute = "GRPCRoute"
)

// HTTPForm is the GRPCRoute as an HTTPRoute of the same name, namespace,
// creation time, generation, parents and status: method matches become path
// matches, header matches and filters keep their meaning, backendRefs their
// weights. The route's status parents are the same type in both kinds.
func HTTPForm(g *gatewayv1.GRPCRoute) *gatewayv1.HTTPRoute {
	rt := &gatewayv1.HTTPRoute{ObjectMeta: *g.ObjectMeta.DeepCopy()}
	rt.Spec.CommonRouteSpec = *g.Spec.CommonRouteSpec.DeepCopy()
	rt.Status.RouteStatus = *g.Status.RouteStatus.DeepCopy()
	for _, rule := range g.Spec.Rules {
		out := gatewayv1.HTTPRouteRule{Name: rule.Name, Filters: httpFilters(rule.Filters)}
		for _, m := range rule.Matches {
			out.Matches = append(out.Matches, httpMatch(m))
		}
		for _, b := range rule.BackendRefs {
			out.BackendRefs = append(out.BackendRefs, gatewayv1.HTTPBackendRef{BackendRef: *b.BackendRef.DeepCopy(), Filters: httpFilters(b.Filters)})
		}
		rt.Spec.Rules = append(rt.Spec.Rules, out)
	}
	return rt
}

// httpMatch is a GRPCRouteMatch as an HTTPRouteMatch. A gRPC call is a
// request to "/service/method":
//   - Exact with service and method: the Exact path;
//   - Exact with the service only: every method of it, the path prefix
//     "/service" (prefixes match whole path elements);
//   - Exact with the method only, and RegularExpression: an RE2 regular
//     expression over the path, an omitted part matching any one element.
//
// No method match matches every call.
func httpMatch(m gatewayv1.GRPCRouteMatch) gatewayv1.HTTPRouteMatch {
	var out gatewayv1.HTTPRouteMatch
	if mm := m.Method; mm != nil {
		service, method := deref(mm.Service), deref(mm.Method)
		regex := mm.Type != nil && *mm.Type == gatewayv1.GRPCMethodMatchRegularExpression
		var typ gatewayv1.PathMatchType
		var value string
		switch {
		case regex:
			typ, value = gatewayv1.PathMatchRegularExpression, "/"+element(service)+"/"+element(method)
		case service != "" && method != "":
			typ, value = gatewayv1.PathMatchExact, "/"+service+"/"+method
		case service != "":
			typ, value = gatewayv1.PathMatchPathPrefix, "/"+service
		case method != "":
			typ, value = gatewayv1.PathMatchRegularExpression, "/[^/]+/"+regexp.QuoteMeta(method)
		}
		if value != "" {
			out.Path = &gatewayv1.HTTPPathMatch{Type: &typ, Value: &value}
		}
	}
	for _, h := range m.Headers {
		hm := gatewayv1.HTTPHeaderMatch{Name: gatewayv1.HTTPHeaderName(h.Name), Value: h.Value}
		if h.Type != nil {
			t := gatewayv1.HeaderMatchType(*h.Type)
			hm.Type = &t
		}
		out.Headers = append(out.Headers, hm)
	}
	return out
}

// element is one path element of a RegularExpression method match: the
// expression given, or any element when none is.
func element(expr string) string {
	if expr == "" {
		return "[^/]+"
	}
	return "(?:" + expr + ")"
}

// httpFilters are GRPCRoute filters as HTTPRoute filters of the same type:
// the header modifiers are the same filter in both kinds; a mirror or an
// extension keeps its type, which the proxy's translation reports as not
// implemented.
func httpFilters(in []gatewayv1.GRPCRouteFilter) []gatewayv1.HTTPRouteFilter {
	var out []gatewayv1.HTTPRouteFilter
	for _, f := range in {
		out = append(out, gatewayv1.HTTPRouteFilter{
			Type:                   gatewayv1.HTTPRouteFilterType(f.Type),
			RequestHeaderModifier:  f.RequestHeaderModifier.DeepCopy(),
			ResponseHeaderModifier: f.ResponseHeaderModifier.DeepCopy(),
			RequestMirror:          f.RequestMirror.DeepCopy(),
			ExtensionRef:           f.ExtensionRef.DeepCopy(),
		})
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Route names one route of either kind, in HTTPRoute form.
type Route struct {
	Kind string // KindHTTPRoute or KindGRPCRoute
	*gatewayv1.HTTPRoute
}

// Key is "Kind/namespace/name".
func (r Route) Key() string { return r.Kind + "/" + r.Namespace + "/" + r.Name }

// Routes lists the HTTPRoutes and the GRPCRoutes (in HTTPRoute form).
func Routes(http []*gatewayv1.HTTPRoute, grpc []*gatewayv1.GRPCRoute) []Route {
	out := make([]Route, 0, len(http)+len(grpc))
	for _, rt := range http {
		out = append(out, Route{KindHTTPRoute, rt})
	}
	for _, g := range grpc {
		out = append(out, Route{KindGRPCRoute, HTTPForm(g)})
	}
	return out
}

// Conflicts are the parentRefs the Gateway API rejects because a route of
// the other kind holds the same Service port: by route key, by index of the
// parentRef, why.
type Conflicts map[string]map[int]string

// Rejected says why the route's parentRef i is rejected ("": it is not).
func (c Conflicts) Rejected(r Route, i int) string { return c[r.Key()][i] }

// Conflicting finds the conflicts among routes. The Gateway API asks that,
// where an HTTPRoute and a GRPCRoute attach to one parent with hostnames
// that intersect, exactly one of them be accepted: the oldest by creation
// time, then the first by "namespace/name" (GRPCRouteSpec.Hostnames,
// GEP-1016). A mesh ignores hostnames (GEP-1294), so on a Service port every
// pair intersects. Routes are taken oldest first, and a parentRef is
// rejected when an accepted parentRef of a route of the other kind shares a
// port with it: the same Service, ports equal or either omitted (every
// port), and the same clients (a consumer route's namespace, or the
// Service's own routes).
func Conflicting(routes []Route) Conflicts {
	order := slices.Clone(routes)
	slices.SortStableFunc(order, func(a, b Route) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time),
			cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name), cmp.Compare(a.Kind, b.Kind))
	})
	type attachment struct {
		kind, route      string
		service, clients string
		port             gatewayv1.PortNumber // 0: every port
	}
	var accepted []attachment
	out := Conflicts{}
	for _, r := range order {
		for i, pr := range r.Spec.ParentRefs {
			if !IsService(pr.Group, pr.Kind) {
				continue
			}
			ns := ParentNamespace(r.HTTPRoute, pr)
			a := attachment{kind: r.Kind, route: r.Namespace + "/" + r.Name, service: ns + "/" + string(pr.Name)}
			if ns != r.Namespace {
				a.clients = r.Namespace // a consumer route
			}
			if pr.Port != nil {
				a.port = *pr.Port
			}
			holder := slices.IndexFunc(accepted, func(o attachment) bool {
				return o.kind != a.kind && o.service == a.service && o.clients == a.clients && (o.port == 0 || a.port == 0 || o.port == a.port)
			})
			if holder < 0 {
				accepted = append(accepted, a)
				continue
			}
			h := accepted[holder]
			if out[r.Key()] == nil {
				out[r.Key()] = map[int]string{}
			}
			out[r.Key()][i] = fmt.Sprintf("%s %s, older, holds Service %s%s: an HTTPRoute and a GRPCRoute may not share a Service port (the oldest is accepted)",
				h.kind, h.route, pr.Name, portSuffix(h.port))
		}
	}
	return out
}

func portSuffix(p gatewayv1.PortNumber) string {
	if p == 0 {
		return ""
	}
	return fmt.Sprintf(" port %d", p)
}

// IsService says whether a parentRef's group and kind name a core Service.
func IsService(group *gatewayv1.Group, kind *gatewayv1.Kind) bool {
	return (group == nil || *group == "") && kind != nil && *kind == "Service"
}

// ParentNamespace is the namespace of a parentRef's Service: the route's
// unless it names another (a consumer route).
func ParentNamespace(rt *gatewayv1.HTTPRoute, pr gatewayv1.ParentReference) string {
	if pr.Namespace != nil && *pr.Namespace != "" {
		return string(*pr.Namespace)
	}
	return rt.Namespace
}

// RefNamespace is the namespace a reference of rt names (a backendRef's),
// the route's when it names none.
func RefNamespace(rt *gatewayv1.HTTPRoute, ns *gatewayv1.Namespace) string {
	if ns != nil && *ns != "" {
		return string(*ns)
	}
	return rt.Namespace
}

// Grants are the cluster's ReferenceGrants, by the namespace they grant
// references into. A route's backendRef to a Service of another namespace
// resolves only when one of that namespace permits it (GEP-709); without
// one the ref is RefNotPermitted and its share of requests is answered
// 500, as for any ref that does not resolve.
type Grants map[string][]*gatewayv1beta1.ReferenceGrant

// NewGrants indexes grants by namespace.
func NewGrants(grants []*gatewayv1beta1.ReferenceGrant) Grants {
	g := Grants{}
	for _, rg := range grants {
		g[rg.Namespace] = append(g[rg.Namespace], rg)
	}
	return g
}

// PermitsService says whether route rt, of kind, may send to Service name
// of namespace ns: always within its own namespace, and always to a
// Service it is a parent of (a consumer route sending its clients where
// they were going: GAMMA's consumer routes, which the mesh conformance
// suite runs with no grant); otherwise when a grant of ns names the
// route's group, kind and namespace as from, and core Services (all of
// them, or this one) as to.
func (g Grants) PermitsService(kind string, rt *gatewayv1.HTTPRoute, ns, name string) bool {
	routeNS := rt.Namespace
	if ns == routeNS || slices.ContainsFunc(rt.Spec.ParentRefs, func(pr gatewayv1.ParentReference) bool {
		return IsService(pr.Group, pr.Kind) && ParentNamespace(rt, pr) == ns && string(pr.Name) == name
	}) {
		return true
	}
	for _, rg := range g[ns] {
		from := slices.ContainsFunc(rg.Spec.From, func(f gatewayv1beta1.ReferenceGrantFrom) bool {
			return f.Group == gatewayv1.GroupName && string(f.Kind) == kind && string(f.Namespace) == routeNS
		})
		to := slices.ContainsFunc(rg.Spec.To, func(t gatewayv1beta1.ReferenceGrantTo) bool {
			return t.Group == "" && t.Kind == "Service" && (t.Name == nil || *t.Name == "" || string(*t.Name) == name)
		})
		if from && to {
			return true
		}
	}
	return false
}
