package proxy

import (
	"cmp"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/shuntnet/shunt/internal/proxy/l7policy"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// refusal is a request the proxy answers itself instead of forwarding it.
type refusal struct {
	status int
	reason string // the flow's drop reason
	msg    string // one line: the answer's body
	rule   string // the policy rule that decided, if one did
}

// Drop reasons of requests the proxy answers itself, beside l7policy's.
const (
	reasonIdentity      = "identity-not-carried"
	reasonNoRoute       = "route-no-match"
	reasonNoWeight      = "route-no-backend"
	reasonUnresolved    = "backend-unresolved"
	reasonNoServicePort = "no-service-port"
	reasonNoEndpoints   = "no-endpoints"
)

// target is where a request goes: a service port's ready backends (picked
// per attempt) or the pod address the client dialled.
type target struct {
	rule   *rule    // the route rule that chose the backend; nil: no route applies
	pool   *service // the backend service port; nil: direct
	direct backend
	label  string // the backend for metrics: a service port or a pod
	// match is the route match that chose the rule (its path, for a
	// filter's ReplacePrefixMatch); backendFilters the backendRef's.
	match          *matchEntry
	backendFilters *proxyapi.Filters
	// edits: the filters folded for the fast paths (nil: none).
	edits *headEdits
}

// resolve finds where a request to the original destination goes: the
// routes of its service port (404 when none matches), the rule's backend by
// weight (500 when it does not resolve), or, without routes, the service
// port's own backends; a pod address is used as dialled.
func (t *table) resolve(orig netip.AddrPort, r *http.Request, clientNS string) (target, *refusal) {
	svc := t.byVIP[orig]
	if svc == nil {
		if t.vips[orig.Addr()] {
			return target{}, &refusal{status: http.StatusServiceUnavailable, reason: reasonNoServicePort,
				msg: fmt.Sprintf("service address %s has no port %d in the proxy's configuration", orig.Addr(), orig.Port())}
		}
		b := backend{addr: orig}
		if ep := t.endpoints[orig.Addr()]; ep != nil {
			b.pod = ep.Pod
		}
		return target{direct: b, label: cmp.Or(b.pod, orig.String())}, nil
	}
	tg := target{pool: svc, label: svc.label}
	if m, routed := svc.route(r, clientNS); routed {
		if m == nil {
			return tg, &refusal{status: http.StatusNotFound, reason: reasonNoRoute,
				msg: fmt.Sprintf("no route of %s matches %s %s", svc.label, r.Method, r.URL.Path)}
		}
		tg.rule, tg.match = m.rule, m
		if f := m.rule.filters; f != nil && f.Unsupported != "" {
			return tg, &refusal{status: http.StatusInternalServerError, reason: reasonUnsupportedFilter,
				msg: fmt.Sprintf("route %s rule %d: %s", m.rule.route, m.rule.index, f.Unsupported)}
		}
		if f := m.rule.filters; f != nil && f.Redirect != nil {
			tg.edits = m.rule.edits
			return tg, nil // answered by the proxy (Proxy.redirect): no backend
		}
		rb, ok := m.rule.pick()
		if !ok {
			return tg, &refusal{status: http.StatusInternalServerError, reason: reasonNoWeight,
				msg: fmt.Sprintf("route %s rule %d has no backend with a weight", m.rule.route, m.rule.index)}
		}
		tg.label, tg.backendFilters, tg.edits = rb.label, rb.filters, rb.edits
		if f := rb.filters; f != nil && f.Unsupported != "" {
			return tg, &refusal{status: http.StatusInternalServerError, reason: reasonUnsupportedFilter,
				msg: fmt.Sprintf("route %s rule %d backend %s: %s", m.rule.route, m.rule.index, rb.label, f.Unsupported)}
		}
		if rb.svc == nil {
			return tg, &refusal{status: http.StatusInternalServerError, reason: reasonUnresolved,
				msg: fmt.Sprintf("route %s: %s", m.rule.route, rb.unresolved)}
		}
		tg.pool = rb.svc
	}
	if len(tg.pool.backends) == 0 {
		return tg, &refusal{status: http.StatusServiceUnavailable, reason: reasonNoEndpoints,
			msg: fmt.Sprintf("service %s has no ready endpoint", tg.pool.label)}
	}
	return tg, nil
}

// pick chooses the backend of one attempt.
func (tg *target) pick() backend {
	if tg.pool == nil {
		return tg.direct
	}
	b, _ := tg.pool.pick() // resolve made sure the pool has backends
	return b
}

// judge asks the L7 policy of the backend port, if it has one.
func (t *table) judge(peer l7policy.Peer, b backend, r *http.Request) (rule string, ref *refusal) {
	pol := t.policies[b.addr]
	if pol == nil {
		return "", nil
	}
	d := pol.Decide(peer, l7policy.Request{Method: r.Method, Path: r.URL.Path, Header: r.Header})
	if d.Allowed {
		return d.Rule, nil
	}
	return d.Rule, &refusal{status: http.StatusForbidden, reason: d.DropReason, msg: d.Explanation, rule: d.Rule}
}
