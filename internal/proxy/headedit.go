package proxy

import (
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// The HTTPRoute filters on the fast paths (the event loop and the
// goroutine per connection), applied to the raw heads they pass: the
// upstream request head the proxy writes and the response head it copies
// back. A rule's filters and a backendRef's are folded, when the table is
// compiled, into what they do to any head (headEdits): which header lines
// go, which lines come after the kept ones, the Host and the path. A
// request then costs a name comparison per header line and one append.
//
// The result is net/http's path's (filters.go's modifyHeaders on
// http.Header, then net/http's writers), but for the order of the lines
// (the head's order, the filters' lines after them, as HAProxy does).
// Where net/http's writers ignore what a filter did, the fast paths ignore
// it too: a request's Content-Length and Transfer-Encoding are written
// from the body's framing, never from the header map, and adding or
// removing Host changes nothing (Host is the request's field). On a
// response net/http reframes the body it copies (a removed Content-Length
// becomes a computed one or chunked); the fast paths copy the upstream's
// framing as it came, so the client gets the same body: a filter's
// Content-Length or Transfer-Encoding is ignored there too, never allowed
// to break the framing. What has no fast equivalent leaves the rule to
// net/http's path, as before (foldFilters, needsFilters).

// headEdits is what a rule's filters, then its backendRef's, do to the
// heads of one request (nil: nothing).
type headEdits struct {
	request, response headEdit
	// path: the rule's URL rewrite of the path (nil: none).
	path *proxyapi.PathModifier
}

// headEdit is a chain of header modifiers folded: the head's lines named
// in drop go, lines come after the kept ones.
type headEdit struct {
	drop  []string // canonical names set or removed by the chain
	lines []byte   // "Name: value\r\n" lines the chain leaves, in order
	// host (request only): the Host the upstream gets, when hostSet.
	host    string
	hostSet bool
}

// framingHeaders are ignored by the fast paths' filters, as net/http's
// writers ignore them (see above).
var framingHeaders = []string{"Content-Length", "Transfer-Encoding"}

// slowHeaders are names a filter may not set or add on the fast paths:
// hop-by-hop headers (which change what the connection or the body's
// trailers do), Expect (which changes how a request is sent). A rule
// whose filters set or add one keeps net/http's path.
var slowHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Upgrade", "Expect"}

// foldFilters folds a rule's filters and a backendRef's (either nil) into
// what the fast paths apply; fast is false when the fast paths cannot
// apply them (the rule then keeps net/http's path). A redirect answers
// the request on either path (exchange.appendRedirect).
func foldFilters(rule, backendRef *proxyapi.Filters) (e *headEdits, fast bool) {
	if rule == nil && backendRef == nil {
		return nil, true
	}
	e = &headEdits{}
	var reqMods, respMods []*proxyapi.HeaderModifier
	for _, f := range []*proxyapi.Filters{rule, backendRef} {
		if f == nil {
			continue
		}
		reqMods, respMods = append(reqMods, f.RequestHeaders), append(respMods, f.ResponseHeaders)
	}
	if rule != nil && rule.Redirect != nil {
		rd := rule.Redirect
		if !validFieldValue(rd.Hostname) || rd.Path != nil && !validFieldValue(rd.Path.Value) {
			return nil, false // net/http's writer mends the Location's bytes; the fast paths would pass them
		}
	}
	if rule != nil && rule.Rewrite != nil {
		e.path = rule.Rewrite.Path
		if h := rule.Rewrite.Hostname; h != "" {
			if !writableHost(h) {
				return nil, false
			}
			e.request.host, e.request.hostSet = h, true
		}
	}
	if !e.request.fold(reqMods, true) || !e.response.fold(respMods, false) {
		return nil, false
	}
	return e, true
}

// fold applies modifiers in order, as modifyHeaders applies them to an
// http.Header: set replaces, add appends, remove deletes. ok is false for
// what the fast paths do not take (slowHeaders; a value net/http would
// refuse or rewrite; a request's User-Agent added, of which net/http
// sends the first value only; an empty or invalid Host).
func (e *headEdit) fold(mods []*proxyapi.HeaderModifier, request bool) (ok bool) {
	var kept []proxyapi.Header // the chain's own lines so far
	drop := func(name string) {
		kept = slices.DeleteFunc(kept, func(h proxyapi.Header) bool { return h.Name == name })
		if !slices.Contains(e.drop, name) {
			e.drop = append(e.drop, name)
		}
	}
	// ignored: a name whose change net/http's writers do not send.
	ignored := func(name string) bool {
		return slices.Contains(framingHeaders, name) || request && name == "Host"
	}
	takes := func(h proxyapi.Header) bool {
		return !slices.Contains(slowHeaders, h.Name) && validFieldValue(h.Value)
	}
	for _, m := range mods {
		if m == nil {
			continue
		}
		for _, s := range m.Set {
			s.Name = textproto.CanonicalMIMEHeaderKey(s.Name)
			switch {
			case request && s.Name == "Host" && !writableHost(s.Value):
				// net/http's writer sends the backend's address for an
				// empty Host, and refuses an invalid one (502).
				return false
			case request && s.Name == "Host":
				e.host, e.hostSet = s.Value, true
				continue
			case ignored(s.Name):
				continue
			case !takes(s):
				return false
			}
			drop(s.Name)
			kept = append(kept, s)
		}
		for _, a := range m.Add {
			a.Name = textproto.CanonicalMIMEHeaderKey(a.Name)
			switch {
			case ignored(a.Name):
				continue
			case !takes(a), request && a.Name == "User-Agent":
				return false
			}
			kept = append(kept, a)
		}
		for _, name := range m.Remove {
			if name = textproto.CanonicalMIMEHeaderKey(name); !ignored(name) {
				drop(name)
			}
		}
	}
	for _, h := range kept {
		h.Value = textproto.TrimString(h.Value) // as net/http's writers send it
		e.lines = append(append(append(append(e.lines, h.Name...), ": "...), h.Value...), "\r\n"...)
	}
	return true
}

// writableHost says whether net/http's request writer sends host as it
// is: not empty, and only the bytes its Host check allows (httpguts'
// ValidHostHeader; it turns other names into punycode or refuses them).
func writableHost(host string) bool {
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!$%&'()*+,-.:;=[]_~", c) >= 0) {
			return false
		}
	}
	return host != ""
}

// appendHeaderLines appends the head's header lines (text's spans) that e
// keeps, then e's own (e nil: every line as it is). Host comes first when
// e sets it (net/http writes it first too).
func appendHeaderLines[T string | []byte](b []byte, e *headEdit, text T, lines []span) []byte {
	if e == nil {
		for _, s := range lines {
			b = append(b, text[s.start:s.end]...)
		}
		return b
	}
	if e.hostSet {
		b = append(append(append(b, "Host: "...), e.host...), "\r\n"...)
	}
	for _, s := range lines {
		if line := text[s.start:s.end]; !dropsLine(e, line) {
			b = append(b, line...)
		}
	}
	return append(b, e.lines...)
}

// dropsLine says whether e takes a header line out of the head.
func dropsLine[T string | []byte](e *headEdit, line T) bool {
	if e.hostSet && lineNamed(line, "Host") {
		return true
	}
	for _, name := range e.drop {
		if lineNamed(line, name) {
			return true
		}
	}
	return false
}

// lineNamed says whether a header line is one of name (canonical; the
// line's in any case).
func lineNamed[T string | []byte](line T, name string) bool {
	return len(line) > len(name) && line[len(name)] == ':' && asciiEqualFold(line[:len(name)], name)
}

// requestEdit and responseEdit are the target's edits of either head (nil:
// none).
func (tg *target) requestEdit() *headEdit {
	if tg.edits == nil {
		return nil
	}
	return &tg.edits.request
}

func (tg *target) responseEdit() *headEdit {
	if tg.edits == nil {
		return nil
	}
	return &tg.edits.response
}

// appendRequestLine is the upstream request's line: the client's, or with
// the rule's rewritten path (written as net/http writes a URL's path).
func (tg *target) appendRequestLine(b []byte, r *fastRequest) []byte {
	if tg.edits == nil || tg.edits.path == nil {
		return append(b, r.requestLine()...)
	}
	u := url.URL{Path: tg.newPath(tg.edits.path, r.url.Path), RawQuery: r.url.RawQuery}
	b = append(append(b, r.req.Method...), ' ')
	return append(append(b, u.RequestURI()...), " HTTP/1.1"...)
}

// appendRedirect is the fast paths' answer for a rule with a redirect:
// what net/http's path writes (Proxy.redirect: the status, Location, Date,
// the response header modifiers, an empty body), Connection: close when
// the client's connection ends after it. code is the status.
func (x *exchange) appendRedirect(b []byte, r *fastRequest, close bool) (out []byte, code int) {
	tg := &x.target
	rd := tg.rule.filters.Redirect
	code = rd.StatusCode
	if code == 0 {
		code = http.StatusFound
	}
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(append(append(b, ' '), http.StatusText(code)...), "\r\n"...)
	// The proxy's own lines, which the filters edit as an upstream's.
	own := append(append([]byte("Location: "), tg.redirectLocation(rd, &r.req, x.conn.orig.Port())...), "\r\n"...)
	location := len(own)
	own = append(time.Now().UTC().AppendFormat(append(own, "Date: "...), http.TimeFormat), "\r\n"...)
	lines := []span{{0, location}, {location, len(own)}}
	b = appendHeaderLines(b, tg.responseEdit(), own, lines)
	if r.req.Method != http.MethodHead { // net/http's server says nothing of a HEAD's empty body
		b = append(b, "Content-Length: 0\r\n"...)
	}
	if close {
		b = append(b, "Connection: close\r\n"...)
	}
	return append(b, "\r\n"...), code
}
