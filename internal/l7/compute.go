// Package l7 computes what the node proxy serves and which connections the
// socket hooks send to it, from the cluster's objects, the service table and
// the policy result. It is pure: the reconciler hands the outcome to the
// datapath (redirect entries) and to the proxy (a proxyapi.Config).
//
// A connection goes to the proxy only when its destination needs it:
//   - a service port that an HTTPRoute names as its parent (GAMMA: the
//     route applies to every client of the service);
//   - a pod port with HTTP policy rules, dialled directly or through a
//     service whose backends include it: a local pod's, and another node's
//     (Input.Cluster), whose requests this node's proxy judges as that
//     pod's policies read (the client's connection is seen only here).
//
// Everything else keeps the kernel path and its cost.
package l7

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/meshroute"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/proxyapi"
	"github.com/shuntnet/shunt/internal/services"
)

// Input is what the proxy's configuration depends on.
type Input struct {
	Store  *model.Store
	Ports  []services.Port // the service table
	Policy *policy.Result
	// Cluster is policy.ClusterL7: the L7 ports of other nodes' pods (nil:
	// none).
	Cluster *policy.Result
	// NativeRouting: other nodes' pods' L7 ports are not redirected to
	// this node's proxy (their node steers their clients' connections to
	// its own, bpf/lib/steer.h); the proxy still judges the requests it
	// sends there for a route or a service with a local L7 backend, as
	// Cluster's rules read, since its connection carries the client's
	// identity (bpf/lib/carried_identity.h) and is not steered again.
	NativeRouting bool
	// Endpoints are the local pods with their addresses; NodeAddrs the
	// node's own (clients with the host identity).
	Endpoints []model.Endpoint
	NodeAddrs []netip.Addr
}

// Result is the node proxy's configuration (without version, listener and
// mark, which the agent owns), the destinations whose connects go to it,
// and the inbound redirects pods asked for to their own proxies.
type Result struct {
	Config     proxyapi.Config
	Redirects  []netip.AddrPort // to the node proxy, sorted
	PodProxies []PodProxy       // sorted by pod
	Warnings   []string         // annotations that could not be used
}

// InboundRedirectAnnotation asks, on a pod, that TCP connections to its
// port P go to its port Q instead, where a proxy of its own listens ("P:Q",
// comma-separated): iptables REDIRECT without iptables. The proxy gets the
// original destination with getsockopt(SOL_IP, SO_ORIGINAL_DST) and marks
// its own connections (SO_MARK with the node's proxy mark) so they are not
// redirected again. Connections are redirected where a socket hook sees
// them connect: from local pods and the node's processes.
const InboundRedirectAnnotation = "shunt.io/inbound-redirect"

// PodProxy is a pod's own inbound proxy.
type PodProxy struct {
	Pod       string // namespace/name
	Redirects []PortRedirect
}

// PortRedirect sends connects to From to To.
type PortRedirect struct{ From, To netip.AddrPort }

const tcp = 6

// Compute builds the result.
func Compute(in Input) Result {
	var res Result
	res.PodProxies, res.Warnings = podProxies(in)
	routes := meshroute.Routes(in.Store.HTTPRoutes(), in.Store.GRPCRoutes())
	grants := meshroute.NewGrants(in.Store.ReferenceGrants())
	conflicts := meshroute.Conflicting(routes)
	if len(routes) == 0 && (in.Policy == nil || len(in.Policy.L7) == 0) && (in.Cluster == nil || len(in.Cluster.L7) == 0) {
		return res
	}
	byName := map[string][]services.Port{} // "ns/name" -> its TCP ports
	for _, p := range in.Ports {
		if p.Proto != tcp {
			continue
		}
		name, _, _ := strings.Cut(p.Name, ":")
		byName[name] = append(byName[name], p)
	}
	redirect := map[netip.AddrPort]bool{}
	usedServices := map[string]bool{}

	for _, rt := range routes {
		r := route(rt, conflicts, grants, byName)
		if len(r.Parents) == 0 {
			continue
		}
		for _, parent := range r.Parents {
			usedServices[parent.Service] = true
			for _, p := range byName[parent.Service] {
				if parent.Port == 0 || parent.Port == p.Port {
					redirect[netip.AddrPortFrom(p.VIP, p.Port)] = true
				}
			}
		}
		for _, rule := range r.Rules {
			for _, b := range rule.Backends {
				usedServices[b.Service] = true
			}
			if rule.Filters != nil {
				for _, m := range rule.Filters.Mirrors {
					usedServices[m.Service] = true
				}
			}
		}
		res.Config.Routes = append(res.Config.Routes, r)
	}

	// Pod ports with HTTP rules, and the service ports that reach them.
	l7Ports := map[netip.AddrPort]bool{}
	if in.Policy != nil {
		for _, lp := range in.Policy.L7 {
			ap := netip.AddrPortFrom(lp.Endpoint, lp.Port)
			l7Ports[ap] = true
			redirect[ap] = true
			res.Config.Policies = append(res.Config.Policies, PortPolicy(lp, in.Policy))
		}
	}
	if in.Cluster != nil {
		for _, lp := range in.Cluster.L7 {
			ap := netip.AddrPortFrom(lp.Endpoint, lp.Port)
			if l7Ports[ap] || (in.Policy != nil && in.Policy.Endpoint(lp.Pod).IP.IsValid()) {
				continue // a local pod's: its node's own computation has it
			}
			res.Config.Policies = append(res.Config.Policies, PortPolicy(lp, in.Cluster))
			if in.NativeRouting {
				continue
			}
			l7Ports[ap] = true
			redirect[ap] = true
		}
	}
	for name, ports := range byName {
		for _, p := range ports {
			if slices.ContainsFunc(p.Backends, func(b services.Backend) bool { return l7Ports[netip.AddrPortFrom(b.IP, b.Port)] }) {
				redirect[netip.AddrPortFrom(p.VIP, p.Port)] = true
				usedServices[name] = true
			}
		}
	}

	podByIP := map[netip.Addr]string{}
	for _, p := range in.Store.Pods() {
		if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			podByIP[ip] = p.Namespace + "/" + p.Name
		}
	}
	for _, name := range slices.Sorted(maps.Keys(usedServices)) {
		for _, p := range byName[name] {
			res.Config.Services = append(res.Config.Services, service(name, p, podByIP))
		}
	}
	res.Config.Endpoints = endpoints(in, podByIP)
	if in.Policy != nil {
		for _, c := range in.Policy.State.CIDRIdentities {
			res.Config.CIDRIdentities = append(res.Config.CIDRIdentities, proxyapi.CIDRIdentity{Prefix: c.Prefix.String(), Identity: c.Identity})
		}
	}
	res.Redirects = slices.SortedFunc(maps.Keys(redirect), func(a, b netip.AddrPort) int { return a.Compare(b) })
	return res
}

// route turns an HTTPRoute or a GRPCRoute (in HTTPRoute form) into the
// proxy's form: parents that are services (but those a route of the other
// kind holds), rules with their matches, backends (refs that name no
// service port, or one of another namespace no ReferenceGrant permits, are
// kept with the reason, so their share gets 500), timeouts and retries.
func route(mr meshroute.Route, conflicts meshroute.Conflicts, grants meshroute.Grants, byName map[string][]services.Port) proxyapi.Route {
	rt := mr.HTTPRoute
	r := proxyapi.Route{Name: rt.Namespace + "/" + rt.Name, Created: rt.CreationTimestamp.Time}
	if mr.Kind != meshroute.KindHTTPRoute {
		r.Kind = mr.Kind
	}
	for i, pr := range rt.Spec.ParentRefs {
		if !meshroute.IsService(pr.Group, pr.Kind) || conflicts.Rejected(mr, i) != "" {
			continue
		}
		ns := meshroute.ParentNamespace(rt, pr)
		parent := proxyapi.ParentRef{Service: ns + "/" + string(pr.Name)}
		if ns != rt.Namespace {
			parent.Consumer = rt.Namespace
		}
		if pr.Port != nil {
			parent.Port = uint16(*pr.Port)
		}
		r.Parents = append(r.Parents, parent)
	}
	for _, rule := range rt.Spec.Rules {
		if bad := InvalidMatches(rule.Matches); len(bad) > 0 {
			r.Rules = append(r.Rules, proxyapi.RouteRule{Dropped: strings.Join(bad, "; ")})
			continue
		}
		out := proxyapi.RouteRule{Matches: matches(rule.Matches)}
		prefixOnly := out.PrefixOnly()
		out.Filters = filters(rule.Filters, prefixOnly, false, func(mf *gatewayv1.HTTPRequestMirrorFilter) (proxyapi.Mirror, bool) {
			b := backend(mr.Kind, rt, gatewayv1.BackendRef{BackendObjectReference: mf.BackendRef}, grants, byName)
			return proxyapi.Mirror{Service: b.Service, Port: b.Port, Percent: mirrorPercent(mf)}, b.Unresolved == ""
		})
		for _, br := range rule.BackendRefs {
			b := backend(mr.Kind, rt, br.BackendRef, grants, byName)
			b.Filters = filters(br.Filters, prefixOnly, true, nil)
			out.Backends = append(out.Backends, b)
		}
		if rule.Timeouts != nil && rule.Timeouts.Request != nil {
			if d, err := time.ParseDuration(string(*rule.Timeouts.Request)); err == nil {
				out.Timeout = proxyapi.Duration(d)
			}
		}
		if rt := rule.Retry; rt != nil {
			retry := &proxyapi.Retry{}
			if rt.Attempts != nil {
				retry.Attempts = *rt.Attempts
			}
			for _, c := range rt.Codes {
				retry.Codes = append(retry.Codes, int(c))
			}
			if rt.Backoff != nil {
				if d, err := time.ParseDuration(string(*rt.Backoff)); err == nil {
					retry.Backoff = proxyapi.Duration(d)
				}
			}
			out.Retry = retry
		}
		r.Rules = append(r.Rules, out)
	}
	return r
}

// filters turns HTTPRoute filters into the proxy's form (nil: none). A
// filter type the proxy does not implement is named in Unsupported. A
// filter the proxy will not apply (InvalidFilters: text it will not write
// into a head, a relative path...)
// is named there too, with nothing of the filters kept: the rule (or the
// backendRef's share) is answered 500, rather than the proxy refusing the
// node's whole configuration. prefixOnly: every match of the rule is a
// PathPrefix (ReplacePrefixMatch needs it). mirror resolves a rule's
// RequestMirror; one whose ref does not resolve is dropped, as the Gateway
// API asks (the route's ResolvedRefs condition names it), and so is one
// with a share of 0.
func filters(in []gatewayv1.HTTPRouteFilter, prefixOnly, backendRef bool,
	mirror func(*gatewayv1.HTTPRequestMirrorFilter) (proxyapi.Mirror, bool)) *proxyapi.Filters {
	if len(in) == 0 {
		return nil
	}
	if invalid := InvalidFilters(in, prefixOnly); len(invalid) > 0 {
		return &proxyapi.Filters{Unsupported: strings.Join(invalid, "; ")}
	}
	out := &proxyapi.Filters{}
	var unsupported []string
	for _, f := range in {
		if what := notImplemented(f, backendRef); what != "" {
			unsupported = append(unsupported, what)
			continue
		}
		// A later filter of a type replaces an earlier one's settings.
		one := proxyFilter(f)
		if one.RequestHeaders != nil {
			out.RequestHeaders = one.RequestHeaders
		}
		if one.ResponseHeaders != nil {
			out.ResponseHeaders = one.ResponseHeaders
		}
		if one.Redirect != nil {
			out.Redirect = one.Redirect
		}
		if one.Rewrite != nil {
			out.Rewrite = one.Rewrite
		}
		// Mirrors add up (the Gateway API's HTTPRouteRequestMultipleMirrors).
		if f.Type == gatewayv1.HTTPRouteFilterRequestMirror && f.RequestMirror != nil && mirror != nil {
			if m, ok := mirror(f.RequestMirror); ok && m.Percent > 0 {
				out.Mirrors = append(out.Mirrors, m)
			}
		}
	}
	if len(unsupported) > 0 {
		out.Unsupported = "filter " + strings.Join(unsupported, ", ") + " is not implemented by shunt's proxy"
	}
	return out
}

// proxyFilter is f alone in the proxy's form: the one field of its type
// set, none for a type the proxy does not implement (notImplemented).
func proxyFilter(f gatewayv1.HTTPRouteFilter) proxyapi.Filters {
	var one proxyapi.Filters
	switch {
	case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
		one.RequestHeaders = headerModifier(f.RequestHeaderModifier)
	case f.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil:
		one.ResponseHeaders = headerModifier(f.ResponseHeaderModifier)
	case f.Type == gatewayv1.HTTPRouteFilterRequestRedirect && f.RequestRedirect != nil:
		rr := f.RequestRedirect
		one.Redirect = &proxyapi.Redirect{Path: pathModifier(rr.Path), Scheme: deref(rr.Scheme), Hostname: string(deref(rr.Hostname)),
			StatusCode: deref(rr.StatusCode)}
		if rr.Port != nil {
			one.Redirect.Port = uint16(*rr.Port)
		}
	case f.Type == gatewayv1.HTTPRouteFilterURLRewrite && f.URLRewrite != nil:
		one.Rewrite = &proxyapi.Rewrite{Path: pathModifier(f.URLRewrite.Path), Hostname: string(deref(f.URLRewrite.Hostname))}
	}
	return one
}

// notImplemented names f when shunt's proxy does not implement it ("" when
// it does): CORS, ExtensionRef, ExternalAuth, a filter without its
// settings, and on a backendRef (backendRef) a redirect, a rewrite or a
// mirror, which the Gateway API leaves to implementations there.
func notImplemented(f gatewayv1.HTTPRouteFilter, backendRef bool) string {
	switch {
	case backendRef && (f.Type == gatewayv1.HTTPRouteFilterRequestRedirect || f.Type == gatewayv1.HTTPRouteFilterURLRewrite ||
		f.Type == gatewayv1.HTTPRouteFilterRequestMirror):
		return string(f.Type) + " (on a backendRef)"
	case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil,
		f.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil,
		f.Type == gatewayv1.HTTPRouteFilterRequestRedirect && f.RequestRedirect != nil,
		f.Type == gatewayv1.HTTPRouteFilterURLRewrite && f.URLRewrite != nil,
		f.Type == gatewayv1.HTTPRouteFilterRequestMirror && f.RequestMirror != nil:
		return ""
	}
	return string(f.Type)
}

// unimplementedFilters names the filters of in shunt's proxy does not
// implement (notImplemented), as "filters[1] (CORS): ...".
func unimplementedFilters(in []gatewayv1.HTTPRouteFilter, backendRef bool) []string {
	var out []string
	for i, f := range in {
		if notImplemented(f, backendRef) != "" {
			where := ""
			if backendRef {
				where = " on a backendRef"
			}
			out = append(out, fmt.Sprintf("filters[%d] (%s): not implemented by shunt's proxy%s", i, f.Type, where))
		}
	}
	return out
}

// InvalidFilters names the fields of filters the proxy will not apply
// (proxyapi.Filters.Problems: a header name that is not a token, a control
// byte in a value, hostname or path, a path that is not absolute,
// ReplacePrefixMatch without PathPrefix matches (prefixOnly false)), as
// "filters[1]
// (RequestHeaderModifier).set[0].value: ...". The Gateway API's standard
// CRD lets a header value or a path hold a CR or LF, and a full path be
// relative. A redirect or rewrite on a backendRef is not invalid: the
// Gateway API leaves it to implementations, and filters names it as one
// shunt's proxy does not implement.
func InvalidFilters(in []gatewayv1.HTTPRouteFilter, prefixOnly bool) []string {
	var out []string
	for i, f := range in {
		one := proxyFilter(f)
		var path *proxyapi.PathModifier
		switch {
		case one.Redirect != nil:
			path = one.Redirect.Path
		case one.Rewrite != nil:
			path = one.Rewrite.Path
		}
		for _, p := range one.Problems(prefixOnly, false) {
			// The proxy's field less its first part ("requestHeaders",
			// "redirect"), which the filter's type names.
			_, field, _ := strings.Cut(p.Field, ".")
			if field == "path.value" && path.Type != "" { // the HTTPRoute's field is named for the type
				field = "path." + strings.ToLower(path.Type[:1]) + path.Type[1:]
			}
			if field != "" {
				field = "." + field
			}
			out = append(out, fmt.Sprintf("filters[%d] (%s)%s: %s", i, f.Type, field, p.Message))
		}
	}
	return out
}

// InvalidMatches names the fields of matches the proxy cannot match
// requests with (proxyapi.Match.Problems: a regular expression RE2 does
// not compile, which the CRD leaves to implementations, a relative path),
// as "matches[0].path.value: ...": their rule is dropped.
func InvalidMatches(in []gatewayv1.HTTPRouteMatch) []string {
	var out []string
	for i, m := range matches(in) {
		for _, p := range m.Problems() {
			out = append(out, fmt.Sprintf("matches[%d].%s: %s", i, p.Field, p.Message))
		}
	}
	return out
}

// InvalidRules names the rules of rt (an HTTPRoute, or a GRPCRoute in
// HTTPRoute form) the proxy cannot apply as written: a match it cannot
// compile drops the rule (it matches nothing); a filter it will not apply
// (InvalidFilters) or does not implement (CORS, ExtensionRef, ...) makes
// its requests answered 500, a backendRef's its share of them. rules are their indexes; problems one line each,
// "rules[1].filters[0] (RequestHeaderModifier).set[0].value: ...". The
// route's status and the agent's object problems report them.
func InvalidRules(rt *gatewayv1.HTTPRoute) (rules []int, problems []string) {
	for i, rule := range rt.Spec.Rules {
		var ps []string
		for _, p := range InvalidMatches(rule.Matches) {
			ps = append(ps, fmt.Sprintf("rules[%d].%s", i, p))
		}
		prefixOnly := proxyapi.RouteRule{Matches: matches(rule.Matches)}.PrefixOnly()
		for _, p := range append(InvalidFilters(rule.Filters, prefixOnly), unimplementedFilters(rule.Filters, false)...) {
			ps = append(ps, fmt.Sprintf("rules[%d].%s", i, p))
		}
		for j, b := range rule.BackendRefs {
			for _, p := range append(InvalidFilters(b.Filters, prefixOnly), unimplementedFilters(b.Filters, true)...) {
				ps = append(ps, fmt.Sprintf("rules[%d].backendRefs[%d].%s", i, j, p))
			}
		}
		if len(ps) > 0 {
			rules, problems = append(rules, i), append(problems, ps...)
		}
	}
	return rules, problems
}

// mirrorPercent is the share of requests a RequestMirror copies, 0-100:
// Percent, or Fraction (denominator 100 when not given), or every request.
func mirrorPercent(mf *gatewayv1.HTTPRequestMirrorFilter) float64 {
	switch {
	case mf.Percent != nil:
		return min(max(float64(*mf.Percent), 0), 100)
	case mf.Fraction != nil:
		den := int32(100)
		if mf.Fraction.Denominator != nil {
			den = *mf.Fraction.Denominator
		}
		if den <= 0 {
			return 0
		}
		return min(max(100*float64(mf.Fraction.Numerator)/float64(den), 0), 100)
	}
	return 100
}

func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

func headerModifier(h *gatewayv1.HTTPHeaderFilter) *proxyapi.HeaderModifier {
	m := &proxyapi.HeaderModifier{Remove: slices.Clone(h.Remove)}
	for _, s := range h.Set {
		m.Set = append(m.Set, proxyapi.Header{Name: string(s.Name), Value: s.Value})
	}
	for _, a := range h.Add {
		m.Add = append(m.Add, proxyapi.Header{Name: string(a.Name), Value: a.Value})
	}
	return m
}

func pathModifier(p *gatewayv1.HTTPPathModifier) *proxyapi.PathModifier {
	switch {
	case p == nil:
		return nil
	case p.Type == gatewayv1.FullPathHTTPPathModifier && p.ReplaceFullPath != nil:
		return &proxyapi.PathModifier{Type: proxyapi.ReplaceFullPath, Value: *p.ReplaceFullPath}
	case p.Type == gatewayv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch != nil:
		return &proxyapi.PathModifier{Type: proxyapi.ReplacePrefixMatch, Value: *p.ReplacePrefixMatch}
	}
	return &proxyapi.PathModifier{Type: string(p.Type)} // the proxy refuses what it does not know
}

func backend(routeKind string, rt *gatewayv1.HTTPRoute, ref gatewayv1.BackendRef, grants meshroute.Grants, byName map[string][]services.Port) proxyapi.RouteBackend {
	ns := meshroute.RefNamespace(rt, ref.Namespace)
	b := proxyapi.RouteBackend{Service: ns + "/" + string(ref.Name), Weight: 1}
	if ref.Weight != nil {
		b.Weight = *ref.Weight
	}
	if ref.Port != nil {
		b.Port = uint16(*ref.Port)
	}
	kind := "Service"
	if ref.Kind != nil {
		kind = string(*ref.Kind)
	}
	switch {
	case (ref.Group != nil && *ref.Group != "") || kind != "Service":
		b.Unresolved = fmt.Sprintf("backendRef %s is not a core Service", b.Service)
	case !grants.PermitsService(routeKind, rt, ns, string(ref.Name)):
		b.Unresolved = fmt.Sprintf("backendRef %s: no ReferenceGrant of namespace %s permits %ss of %s to refer to it", b.Service, ns, routeKind, rt.Namespace)
	case b.Port == 0:
		b.Unresolved = fmt.Sprintf("backendRef %s names no port", b.Service)
	case len(byName[b.Service]) == 0:
		b.Unresolved = fmt.Sprintf("service %s not found (or has no ClusterIP)", b.Service)
	case !slices.ContainsFunc(byName[b.Service], func(p services.Port) bool { return p.Port == b.Port }):
		b.Unresolved = fmt.Sprintf("service %s has no TCP port %d", b.Service, b.Port)
	}
	return b
}

func matches(in []gatewayv1.HTTPRouteMatch) []proxyapi.Match {
	var out []proxyapi.Match
	for _, m := range in {
		pm := proxyapi.Match{}
		if m.Path != nil {
			pm.Path = &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: "/"}
			if m.Path.Type != nil {
				pm.Path.Type = string(*m.Path.Type)
			}
			if m.Path.Value != nil {
				pm.Path.Value = *m.Path.Value
			}
		}
		if m.Method != nil {
			pm.Method = string(*m.Method)
		}
		for _, h := range m.Headers {
			hm := proxyapi.HeaderMatch{Type: proxyapi.MatchExact, Name: string(h.Name), Value: h.Value}
			if h.Type != nil {
				hm.Type = string(*h.Type)
			}
			pm.Headers = append(pm.Headers, hm)
		}
		for _, q := range m.QueryParams {
			qm := proxyapi.HeaderMatch{Type: proxyapi.MatchExact, Name: string(q.Name), Value: q.Value}
			if q.Type != nil {
				qm.Type = string(*q.Type)
			}
			pm.Query = append(pm.Query, qm)
		}
		out = append(out, pm)
	}
	return out
}

// service is one service port with its ready backends, named by pod.
func service(name string, p services.Port, podByIP map[netip.Addr]string) proxyapi.Service {
	s := proxyapi.Service{Name: name, VIP: p.VIP.String(), Port: p.Port, External: p.Kind.External()}
	for _, b := range p.Backends {
		s.Backends = append(s.Backends, proxyapi.Backend{IP: b.IP.String(), Port: b.Port, Pod: podByIP[b.IP]})
	}
	return s
}

// PortPolicy is the proxy's form of an L7 port's policy (also what
// `shunt policy trace` decides HTTP requests with).
func PortPolicy(lp policy.L7Port, pol *policy.Result) proxyapi.PortPolicy {
	pp := proxyapi.PortPolicy{Endpoint: lp.Endpoint.String(), Port: lp.Port, Isolated: lp.Isolated}
	for _, r := range lp.Rules {
		rule := proxyapi.L7Rule{
			Name: pol.Rules[r.RuleID].String(), Action: r.Action, AnyPeer: r.AnyPeer, Identities: r.Identities,
			Builtin: pol.Rules[r.RuleID].Kind == "",
		}
		for _, h := range r.HTTP {
			rule.HTTP = append(rule.HTTP, proxyapi.HTTPRule{Method: h.Method, Path: h.Path, Headers: maps.Clone(h.Headers)})
		}
		pp.Rules = append(pp.Rules, rule)
	}
	return pp
}

// endpoints names the proxy's possible clients and backends: local pods
// and the node.
//
// Other nodes' pods and addresses are listed too (from the ipcache): the tc
// programs give the proxy their connections to local pods' ports with HTTP
// rules (bpf/lib/steer.h), and their identity is what those rules judge.
func endpoints(in Input, podByIP map[netip.Addr]string) []proxyapi.Endpoint {
	var out []proxyapi.Endpoint
	if in.Policy != nil {
		for _, e := range in.Policy.State.IPCache {
			a := e.Prefix.Addr()
			if !e.Tunnel.IsValid() || e.Prefix.Bits() != a.BitLen() {
				continue // not another node's (local pods and the node come next)
			}
			ep := proxyapi.Endpoint{IP: a.String(), Identity: e.Identity, Pod: podByIP[a],
				CIDRIdentity: in.Policy.CIDRIdentityOf(a), Labels: identityLabels(in.Policy, e.Identity)}
			if e.Identity == policy.IdentityRemoteNode {
				ep.Labels = []string{"reserved:remote-node"}
			}
			out = append(out, ep)
		}
	}
	for _, ep := range in.Endpoints {
		e := proxyapi.Endpoint{IP: ep.IP.String(), Pod: ep.Pod}
		if in.Policy != nil {
			e.Identity = in.Policy.Endpoint(ep.Pod).Identity
			e.CIDRIdentity = in.Policy.CIDRIdentityOf(ep.IP)
			e.Labels = identityLabels(in.Policy, e.Identity)
		}
		out = append(out, e)
	}
	for _, a := range in.NodeAddrs {
		out = append(out, proxyapi.Endpoint{IP: a.String(), Identity: policy.IdentityHost, Labels: []string{"reserved:host"}})
	}
	slices.SortFunc(out, func(a, b proxyapi.Endpoint) int { return cmp.Compare(a.IP, b.IP) })
	return out
}

func identityLabels(pol *policy.Result, id uint32) []string {
	for _, i := range pol.Identities {
		if i.ID == id {
			var out []string
			for _, k := range slices.Sorted(maps.Keys(i.Labels)) {
				out = append(out, k+"="+i.Labels[k])
			}
			return out
		}
	}
	return nil
}

// podProxies reads the inbound redirects local pods ask for.
func podProxies(in Input) ([]PodProxy, []string) {
	var out []PodProxy
	var warnings []string
	for _, ep := range in.Endpoints {
		p, ok := in.Store.Pod(model.SplitName(ep.Pod))
		if !ok || p.Annotations[InboundRedirectAnnotation] == "" {
			continue
		}
		pairs, err := ParseInboundRedirect(p.Annotations[InboundRedirectAnnotation])
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("pod %s: annotation %s: %v", ep.Pod, InboundRedirectAnnotation, err))
			continue
		}
		pp := PodProxy{Pod: ep.Pod}
		for _, pr := range pairs {
			pp.Redirects = append(pp.Redirects, PortRedirect{From: netip.AddrPortFrom(ep.IP, pr[0]), To: netip.AddrPortFrom(ep.IP, pr[1])})
		}
		out = append(out, pp)
	}
	slices.SortFunc(out, func(a, b PodProxy) int { return cmp.Compare(a.Pod, b.Pod) })
	return out, warnings
}

// ParseInboundRedirect reads "P:Q[,P:Q...]": ports 1-65535, P != Q, each P
// once.
func ParseInboundRedirect(v string) ([][2]uint16, error) {
	var out [][2]uint16
	seen := map[uint16]bool{}
	for _, item := range strings.Split(v, ",") {
		from, to, ok := strings.Cut(strings.TrimSpace(item), ":")
		if !ok {
			return nil, fmt.Errorf("%q: want PORT:PROXYPORT, e.g. 8080:15006", item)
		}
		var ports [2]uint16
		for i, s := range []string{from, to} {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("%q: %q is not a port (1-65535)", item, s)
			}
			ports[i] = uint16(n)
		}
		if ports[0] == ports[1] {
			return nil, fmt.Errorf("%q: a port redirected to itself would loop", item)
		}
		if seen[ports[0]] {
			return nil, fmt.Errorf("port %d is redirected twice", ports[0])
		}
		seen[ports[0]] = true
		out = append(out, ports)
	}
	return out, nil
}
