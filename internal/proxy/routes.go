package proxy

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// rule is one compiled route rule; parents of the route share it, so its
// weighted round robin spans every service port the route is attached to.
type rule struct {
	route    string // namespace/name
	index    int
	backends []ruleBackend
	wrr      *wrr
	timeout  time.Duration
	retry    *proxyapi.Retry
	filters  *proxyapi.Filters // nil: none (filters.go)
	// edits: the rule's own filters folded for the fast paths (a
	// redirect's answer); each backendRef has its own with them.
	edits *headEdits
	// slowFilters: the rule or one of its backendRefs has filters the fast
	// paths do not apply (foldFilters, mirrors), which only net/http's
	// path does.
	slowFilters bool
	mirrors     []ruleMirror // mirror.go
}

type ruleBackend struct {
	svc        *service // nil when unresolved
	label      string   // namespace/name:port
	unresolved string
	filters    *proxyapi.Filters // the backendRef's header modifiers
	edits      *headEdits        // the rule's filters, then the backendRef's, folded
}

// matchEntry is one match of a rule, with what the Gateway API's
// precedence looks at; each parent service port of the route lists it.
type matchEntry struct {
	rule      *rule
	created   time.Time
	pathType  string // Exact, PathPrefix, RegularExpression
	path      string
	pathRegex *regexp.Regexp
	method    string
	headers   []valueMatch
	query     []valueMatch
	// consumer: the namespace whose clients a consumer route serves (""
	// for the Service's own routes).
	consumer string
}

type valueMatch struct {
	name  string // canonical header name, or query parameter name
	value string
	regex *regexp.Regexp // RegularExpression; nil: Exact
}

// Path precedence among path types. The Gateway API ranks Exact before
// PathPrefix and leaves RegularExpression to implementations: it comes
// between them, so a regular expression is not shadowed by a catch-all
// prefix "/".
var pathRank = map[string]int{proxyapi.MatchExact: 3, proxyapi.MatchRegularExpr: 2, proxyapi.MatchPathPrefix: 1}

func (t *table) compileRoutes(errs *problems) {
	seen := map[string]bool{}
	for i, r := range t.cfg.Routes {
		field := fmt.Sprintf("routes[%d] (%s)", i, r.Name)
		// An HTTPRoute and a GRPCRoute may have one name.
		key := r.Kind + "/" + r.Name
		if r.Name == "" {
			errs.add(field+".name", "required (namespace/name)")
		} else if seen[key] {
			errs.add(field+".name", "%s %s is listed twice", cmp.Or(r.Kind, "HTTPRoute"), r.Name)
		}
		if r.Kind != "" && r.Kind != "GRPCRoute" {
			errs.add(field+".kind", "%q: use GRPCRoute, or leave it out for an HTTPRoute", r.Kind)
		}
		seen[key] = true
		parents := map[*service]string{} // a port named twice (by number and by 0) gets the route once; its consumer namespace
		for _, pr := range r.Parents {
			for key, svc := range t.byName {
				if key.name == pr.Service && (pr.Port == 0 || pr.Port == key.port) {
					parents[svc] = pr.Consumer
				}
			}
		}
		for j, rr := range r.Rules {
			if rr.Dropped != "" {
				continue // its place kept: the next rules keep their indexes
			}
			rl := t.compileRule(errs, fmt.Sprintf("%s.rules[%d]", field, j), r.Name, j, rr)
			matches := rr.Matches
			if len(matches) == 0 { // the Gateway API's default: every request
				matches = []proxyapi.Match{{}}
			}
			for k, m := range matches {
				e, ok := compileMatch(errs, fmt.Sprintf("%s.rules[%d].matches[%d]", field, j, k), m)
				if !ok || rl == nil {
					continue
				}
				e.rule, e.created = rl, r.Created
				t.slowFilters = t.slowFilters || rl.slowFilters
				for svc, consumer := range parents {
					pe := *e
					pe.consumer = consumer
					svc.routes = append(svc.routes, &pe)
					if consumer != "" {
						svc.consumerEntries++
						if svc.consumers == nil {
							svc.consumers = map[string]bool{}
						}
						svc.consumers[consumer] = true
					}
				}
			}
		}
	}
	for _, svc := range t.byName {
		slices.SortStableFunc(svc.routes, precedence)
	}
}

func (t *table) compileRule(errs *problems, field, route string, index int, rr proxyapi.RouteRule) *rule {
	rl := &rule{route: route, index: index, timeout: time.Duration(rr.Timeout), retry: rr.Retry, filters: rr.Filters}
	var fast bool
	rl.edits, fast = foldFilters(rr.Filters, nil)
	rl.slowFilters = !fast
	prefixOnly := rr.PrefixOnly()
	ok := compileFilters(errs, field+".filters", rr.Filters, prefixOnly, false)
	if rl.timeout < 0 {
		errs.add(field+".timeout", "%s is negative", rl.timeout)
		ok = false
	}
	if r := rr.Retry; r != nil {
		if r.Attempts < 0 {
			errs.add(field+".retry.attempts", "%d is negative", r.Attempts)
			ok = false
		}
		if r.Backoff < 0 {
			errs.add(field+".retry.backoff", "%s is negative", time.Duration(r.Backoff))
			ok = false
		}
		for k, c := range r.Codes {
			if c < 400 || c > 599 {
				errs.add(fmt.Sprintf("%s.retry.codes[%d]", field, k), "%d is not a status 400-599", c)
				ok = false
			}
		}
	}
	if rr.Filters != nil {
		for k, m := range rr.Filters.Mirrors {
			svc := t.byName[serviceKey{m.Service, m.Port}]
			if svc == nil {
				errs.add(fmt.Sprintf("%s.filters.mirrors[%d]", field, k), "service %s port %d is not among services: list it", m.Service, m.Port)
				ok = false
				continue
			}
			rl.mirrors = append(rl.mirrors, ruleMirror{svc: svc, label: fmt.Sprintf("%s:%d", m.Service, m.Port), percent: m.Percent})
		}
		rl.slowFilters = rl.slowFilters || len(rl.mirrors) > 0
	}
	var weights []int32
	for k, b := range rr.Backends {
		bf := fmt.Sprintf("%s.backends[%d]", field, k)
		rb := ruleBackend{label: fmt.Sprintf("%s:%d", b.Service, b.Port), unresolved: b.Unresolved, filters: b.Filters}
		if !compileFilters(errs, bf+".filters", b.Filters, prefixOnly, true) {
			ok = false
		}
		rb.edits, fast = foldFilters(rr.Filters, b.Filters)
		rl.slowFilters = rl.slowFilters || !fast
		if b.Weight < 0 {
			errs.add(bf+".weight", "%d is negative", b.Weight)
			ok = false
		}
		if b.Unresolved == "" {
			rb.svc = t.byName[serviceKey{b.Service, b.Port}]
			if rb.svc == nil {
				errs.add(bf, "service %s port %d is not among services: list it, or say why in unresolved", b.Service, b.Port)
				ok = false
			}
		}
		rl.backends = append(rl.backends, rb)
		weights = append(weights, b.Weight)
	}
	if !ok {
		return nil
	}
	rl.wrr = newWRR(weights)
	return rl
}

func compileMatch(errs *problems, field string, m proxyapi.Match) (*matchEntry, bool) {
	problems := m.Problems()
	for _, p := range problems {
		errs.add(field+"."+p.Field, "%s", p.Message)
	}
	if len(problems) > 0 {
		return nil, false
	}
	e := &matchEntry{pathType: proxyapi.MatchPathPrefix, path: "/", method: m.Method}
	if p := m.Path; p != nil {
		e.pathType, e.path = p.Type, p.Value
		switch p.Type {
		case proxyapi.MatchPathPrefix:
			if len(p.Value) > 1 {
				e.path = strings.TrimSuffix(p.Value, "/") // "/foo/" and "/foo" are the same prefix
			}
		case proxyapi.MatchRegularExpr:
			e.pathRegex, _ = proxyapi.Anchored(p.Value) // Problems compiled it
		}
	}
	e.headers = compileValues(m.Headers, http.CanonicalHeaderKey)
	e.query = compileValues(m.Query, func(s string) string { return s })
	return e, true
}

// compileValues compiles header or query matches Match.Problems found
// nothing wrong with. Only the first of several matches on one name
// counts, as the Gateway API says.
func compileValues(in []proxyapi.HeaderMatch, canonical func(string) string) []valueMatch {
	var out []valueMatch
	for _, h := range in {
		v := valueMatch{name: canonical(h.Name), value: h.Value}
		if h.Type == proxyapi.MatchRegularExpr {
			v.regex, _ = proxyapi.Anchored(h.Value)
		}
		if !slices.ContainsFunc(out, func(o valueMatch) bool { return o.name == v.name }) {
			out = append(out, v)
		}
	}
	return out
}

func isToken(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, r) })
}

// precedence orders matches as the Gateway API asks: exact path, then
// (regular expression, longest first, see pathRank) longest prefix, method,
// most header matches, most query matches; then the oldest route, the
// route first by name, the first rule.
func precedence(a, b *matchEntry) int {
	return cmp.Or(
		-cmp.Compare(pathRank[a.pathType], pathRank[b.pathType]),
		-cmp.Compare(len(a.path), len(b.path)),
		-cmp.Compare(given(a.method), given(b.method)),
		-cmp.Compare(len(a.headers), len(b.headers)),
		-cmp.Compare(len(a.query), len(b.query)),
		a.created.Compare(b.created),
		cmp.Compare(a.rule.route, b.rule.route),
		cmp.Compare(a.rule.index, b.rule.index),
	)
}

// pick chooses the rule's backend for one request; ok is false when the
// rule has no backend with a weight.
func (r *rule) pick() (b ruleBackend, ok bool) {
	i := r.wrr.pick()
	if i < 0 {
		return ruleBackend{}, false
	}
	return r.backends[i], true
}

func given(s string) int {
	if s != "" {
		return 1
	}
	return 0
}

// matches says whether a request meets every condition of the match.
// query is the request's parsed query, parsed here by the first match
// that has query conditions (most routes have none: parsing it costs a
// map and its strings per request).
func (e *matchEntry) matches(r *http.Request, query *url.Values) bool {
	path := r.URL.Path
	switch e.pathType {
	case proxyapi.MatchExact:
		if path != e.path {
			return false
		}
	case proxyapi.MatchPathPrefix:
		// Element by element: "/foo" matches "/foo" and "/foo/bar", not "/foobar".
		if e.path != "/" && path != e.path && !strings.HasPrefix(path, e.path+"/") {
			return false
		}
	case proxyapi.MatchRegularExpr:
		if !e.pathRegex.MatchString(path) {
			return false
		}
	}
	if e.method != "" && r.Method != e.method {
		return false
	}
	for _, h := range e.headers {
		var v string
		if h.name == "Host" {
			v = r.Host // net/http moves Host out of the header map
		} else {
			vs, ok := r.Header[h.name]
			if !ok {
				return false
			}
			v = strings.Join(vs, ",")
		}
		if !h.matches(v) {
			return false
		}
	}
	if len(e.query) > 0 && *query == nil {
		*query = r.URL.Query()
	}
	for _, q := range e.query {
		vs, ok := (*query)[q.name]
		if !ok || !q.matches(vs[0]) {
			return false
		}
	}
	return true
}

func (v valueMatch) matches(s string) bool {
	if v.regex != nil {
		return v.regex.MatchString(s)
	}
	return s == v.value
}

// route returns the first match of the service's routes for r from a
// client of namespace clientNS: the consumer routes of that namespace if
// it has any for the service (GAMMA: they replace the producer's for
// their namespace), else the service's own routes. routed is false when
// no route is for this client (the service's backends serve it, as
// without routes); then m is nil.
func (s *service) route(r *http.Request, clientNS string) (m *matchEntry, routed bool) {
	consumer := ""
	if clientNS != "" && s.consumers[clientNS] {
		consumer = clientNS
	}
	if consumer == "" && len(s.routes) == s.consumerEntries {
		return nil, false // consumer routes of other namespaces only
	}
	var query url.Values
	for _, e := range s.routes {
		if e.consumer == consumer && e.matches(r, &query) {
			return e, true
		}
	}
	return nil, true
}
