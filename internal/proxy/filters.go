package proxy

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// The Gateway API's HTTPRoute filters: a rule's request and response
// header modifiers, redirect and URL rewrite, and a backendRef's header
// modifiers (applied after the rule's when that backend is chosen).
// net/http's path applies them here; the fast paths apply header
// modifiers, redirects and rewrites to the raw heads (headedit.go), and
// send the requests of a rule with any other filter to net/http's path
// (needsFilters).

// reasonUnsupportedFilter: the rule has a filter the proxy cannot apply.
const reasonUnsupportedFilter = "route-filter-unsupported"

// compileFilters checks filters (nil: none) with proxyapi's
// Filters.Problems, which the agent asks too; prefixOnly says whether every
// match of the rule is a PathPrefix, which ReplacePrefixMatch needs.
func compileFilters(errs *problems, field string, f *proxyapi.Filters, prefixOnly, backendRef bool) bool {
	ok := true
	for _, p := range f.Problems(prefixOnly, backendRef) {
		errs.add(field+"."+p.Field, "%s", p.Message)
		ok = false
	}
	return ok
}

// needsFilters says whether the request's route rule has filters which
// only net/http's path applies. It picks nothing (no weighted choice).
func (t *table) needsFilters(orig, client netip.AddrPort, r *http.Request) bool {
	if !t.slowFilters {
		return false
	}
	svc := t.byVIP[orig]
	if svc == nil || len(svc.routes) == 0 {
		return false
	}
	m, _ := svc.route(r, t.clientNamespace(client.Addr()))
	return m != nil && m.rule.slowFilters
}

// modify applies a header modifier: set replaces, add appends a value,
// remove deletes. The Host header is the request's Host field (host:
// non-nil for a request).
func modifyHeaders(m *proxyapi.HeaderModifier, h http.Header, host *string) {
	if m == nil {
		return
	}
	for _, s := range m.Set {
		if host != nil && strings.EqualFold(s.Name, "Host") {
			*host = s.Value
			continue
		}
		h.Set(s.Name, s.Value)
	}
	for _, a := range m.Add {
		h.Add(a.Name, a.Value)
	}
	for _, name := range m.Remove {
		h.Del(name)
	}
}

// rewriteRequest applies the rule's URL rewrite and the rule's and
// backendRef's request header modifiers to the upstream request.
func (tg *target) rewriteRequest(out *http.Request) {
	if tg.rule == nil {
		return
	}
	if f := tg.rule.filters; f != nil {
		if rw := f.Rewrite; rw != nil {
			if rw.Hostname != "" {
				out.Host = rw.Hostname
			}
			if rw.Path != nil {
				out.URL.Path = tg.newPath(rw.Path, out.URL.Path)
				out.URL.RawPath = ""
			}
		}
		modifyHeaders(f.RequestHeaders, out.Header, &out.Host)
	}
	if tg.backendFilters != nil {
		modifyHeaders(tg.backendFilters.RequestHeaders, out.Header, &out.Host)
	}
}

// rewriteResponse applies the rule's and the backendRef's response header
// modifiers.
func (tg *target) rewriteResponse(h http.Header) {
	if tg.rule == nil {
		return
	}
	if f := tg.rule.filters; f != nil {
		modifyHeaders(f.ResponseHeaders, h, nil)
	}
	if tg.backendFilters != nil {
		modifyHeaders(tg.backendFilters.ResponseHeaders, h, nil)
	}
}

// newPath is path after a path modifier: the whole path replaced, or the
// prefix the rule's match matched (whole path elements) replaced.
func (tg *target) newPath(p *proxyapi.PathModifier, path string) string {
	switch p.Type {
	case proxyapi.ReplaceFullPath:
		return p.Value
	case proxyapi.ReplacePrefixMatch:
		if tg.match == nil || tg.match.pathType != proxyapi.MatchPathPrefix {
			return path // compileFilters allows it only after PathPrefix matches
		}
		return replacePrefix(path, tg.match.path, p.Value)
	}
	return path
}

// replacePrefix replaces prefix (a PathPrefix match's value without its
// trailing slash; "/" for every path), which matched path element by
// element, with value: "/one/two" with prefix "/one" and value "/x" is
// "/x/two", with value "/" it is "/two".
func replacePrefix(path, prefix, value string) string {
	if prefix == "/" {
		prefix = ""
	}
	rest := strings.TrimPrefix(path, prefix) // "" or "/..."
	out := strings.TrimSuffix(value, "/") + rest
	if out == "" {
		return "/"
	}
	return out
}

// redirectLocation is the Location of a redirect filter's answer to r,
// which the client sent to the service port dialled.
func (tg *target) redirectLocation(rd *proxyapi.Redirect, r *http.Request, dialled uint16) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	// The port: the filter's; else the scheme's own when the filter
	// changes the scheme; else the port the client dialled (the mesh's
	// "listener port").
	port := dialled
	if rd.Scheme != "" {
		scheme = rd.Scheme
		port = map[string]uint16{"http": 80, "https": 443}[scheme]
	}
	if rd.Hostname != "" {
		host = rd.Hostname
	}
	if rd.Port != 0 {
		port = rd.Port
	}
	authority := host
	if strings.Contains(host, ":") { // an IPv6 address
		authority = "[" + host + "]"
	}
	if !(scheme == "http" && port == 80 || scheme == "https" && port == 443) {
		authority = net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	path := r.URL.EscapedPath()
	if rd.Path != nil {
		path = tg.newPath(rd.Path, r.URL.Path)
	}
	loc := scheme + "://" + authority + path
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	return loc
}

// redirect answers the request with the rule's redirect.
func (p *Proxy) redirect(w http.ResponseWriter, r *http.Request, x *exchange) {
	rd := x.target.rule.filters.Redirect
	code := rd.StatusCode
	if code == 0 {
		code = http.StatusFound
	}
	w.Header().Set("Location", x.target.redirectLocation(rd, r, x.conn.orig.Port()))
	x.target.rewriteResponse(w.Header())
	x.status = code
	w.WriteHeader(code)
}

// redirects says whether the proxy answers the request with its rule's
// redirect.
func (tg *target) redirects() bool {
	return tg.rule != nil && tg.rule.filters != nil && tg.rule.filters.Redirect != nil
}

// clientNamespace is the namespace of the pod at ip ("" when it is none).
func (t *table) clientNamespace(ip netip.Addr) string {
	if ep := t.endpoints[ip]; ep != nil {
		return namespace(ep.Pod)
	}
	return ""
}
