package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// echoHeaders answers with the request's Host, path and headers, one
// "name: value" line each, sorted.
func echoHeaders(w http.ResponseWriter, r *http.Request) {
	lines := []string{"host: " + r.Host, "path: " + r.URL.RequestURI()}
	for name, vs := range r.Header {
		lines = append(lines, strings.ToLower(name)+": "+strings.Join(vs, ","))
	}
	slices.Sort(lines)
	w.Header().Set("X-Backend-Set", "backend")
	w.Header().Set("X-Backend-Remove", "backend")
	fmt.Fprint(w, strings.Join(lines, "\n"))
}

// filtersHarness: the echo service's route, the mesh suite's filters on
// its rules (rule filters, a backendRef's header modifier, a redirect, a
// rewrite).
func filtersHarness(t *testing.T) *harness {
	echo := startBackend(t, "echo-v1", "127.0.1.1", echoHeaders)
	prefix := func(p string) []proxyapi.Match {
		return []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: p}}}
	}
	to := []proxyapi.RouteBackend{{Service: "default/echo-v1", Port: 8080, Weight: 1}}
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(echo),
		Services: []proxyapi.Service{svcPort("default/echo", "10.96.0.10", 80, echo), svcPort("default/echo-v1", "10.96.0.11", 8080, echo)},
		Routes: []proxyapi.Route{{Name: "default/echo", Parents: []proxyapi.ParentRef{{Service: "default/echo"}},
			Rules: []proxyapi.RouteRule{
				{Matches: prefix("/headers"), Backends: to, Filters: &proxyapi.Filters{
					RequestHeaders: &proxyapi.HeaderModifier{
						Set: []proxyapi.Header{{Name: "X-Set", Value: "set"}}, Add: []proxyapi.Header{{Name: "X-Add", Value: "added"}},
						Remove: []string{"X-Remove"},
					},
					ResponseHeaders: &proxyapi.HeaderModifier{
						Set: []proxyapi.Header{{Name: "X-Backend-Set", Value: "proxy"}}, Add: []proxyapi.Header{{Name: "X-Response-Add", Value: "added"}},
						Remove: []string{"X-Backend-Remove"},
					},
				}},
				{Matches: prefix("/backend"), Backends: []proxyapi.RouteBackend{{Service: "default/echo-v1", Port: 8080, Weight: 1,
					Filters: &proxyapi.Filters{RequestHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-Backend-Ref", Value: "yes"}}}}}}},
				{Matches: prefix("/prefix/one"), Backends: to, Filters: &proxyapi.Filters{
					Rewrite: &proxyapi.Rewrite{Hostname: "rewritten.example", Path: &proxyapi.PathModifier{Type: proxyapi.ReplacePrefixMatch, Value: "/one"}}}},
				{Matches: prefix("/strip"), Backends: to, Filters: &proxyapi.Filters{
					Rewrite: &proxyapi.Rewrite{Path: &proxyapi.PathModifier{Type: proxyapi.ReplacePrefixMatch, Value: ""}}}},
				{Matches: prefix("/full"), Backends: to, Filters: &proxyapi.Filters{
					Rewrite: &proxyapi.Rewrite{Path: &proxyapi.PathModifier{Type: proxyapi.ReplaceFullPath, Value: "/replaced"}}}},
				{Matches: prefix("/redirect"), Filters: &proxyapi.Filters{Redirect: &proxyapi.Redirect{Hostname: "example.org", StatusCode: 301},
					ResponseHeaders: &proxyapi.HeaderModifier{Add: []proxyapi.Header{{Name: "X-Redirected", Value: "yes"}}}}},
				{Matches: prefix("/scheme"), Filters: &proxyapi.Filters{Redirect: &proxyapi.Redirect{Scheme: "https"}}},
				{Matches: prefix("/port"), Filters: &proxyapi.Filters{Redirect: &proxyapi.Redirect{Port: 8083,
					Path: &proxyapi.PathModifier{Type: proxyapi.ReplacePrefixMatch, Value: "/moved"}}}},
				{Matches: prefix("/cors"), Backends: to, Filters: &proxyapi.Filters{Unsupported: "filter CORS is not implemented"}},
				{Matches: prefix("/backend-rewrite"), Backends: []proxyapi.RouteBackend{{Service: "default/echo-v1", Port: 8080, Weight: 1,
					Filters: &proxyapi.Filters{Unsupported: "filter URLRewrite (on a backendRef) is not implemented"}}}},
				{Backends: to},
			}}},
	})
	h.dials(frontend, "10.96.0.10:80")
	return h
}

// noRedirects is a client that shows redirects instead of following them.
func noRedirects(c *http.Client) *http.Client {
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

// The filters on every path: HTTP/1.1 on the fast paths (the event loop,
// or with SHUNT_PROXY_NO_EVENT_LOOP=1 the goroutine per connection),
// which apply them without handing the connection to net/http, and on
// net/http's; h2c on net/http's.
func TestRouteFilters(t *testing.T) { onPaths(t, testRouteFilters) }

func testRouteFilters(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "h2c"}[h2c], func(t *testing.T) {
			h := filtersHarness(t)
			c := noRedirects(h.client(frontend, h2c))
			do := func(path string, header ...string) (*http.Response, string) {
				t.Helper()
				req, _ := http.NewRequest("GET", "http://echo"+path, nil)
				for i := 0; i+1 < len(header); i += 2 {
					req.Header.Add(header[i], header[i+1])
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatalf("GET %s: reading the body: %v", path, err)
				}
				return resp, string(body)
			}
			resp, body := do("/headers", "X-Set", "client", "X-Add", "client", "X-Remove", "client")
			for _, want := range []string{"x-set: set", "x-add: client,added"} {
				if !strings.Contains(body, want+"\n") && !strings.HasSuffix(body, want) {
					t.Errorf("request headers: want %q in\n%s", want, body)
				}
			}
			if strings.Contains(body, "x-remove") {
				t.Errorf("X-Remove reached the backend:\n%s", body)
			}
			if got := resp.Header.Get("X-Backend-Set"); got != "proxy" {
				t.Errorf("response X-Backend-Set %q, want proxy", got)
			}
			if got := resp.Header.Get("X-Response-Add"); got != "added" {
				t.Errorf("response X-Response-Add %q, want added", got)
			}
			if got := resp.Header.Values("X-Backend-Remove"); len(got) != 0 {
				t.Errorf("response X-Backend-Remove %q, want none", got)
			}

			if _, body := do("/backend"); !strings.Contains(body, "x-backend-ref: yes") {
				t.Errorf("the backendRef's header modifier: want x-backend-ref: yes in\n%s", body)
			}
			if _, body := do("/headers-not"); strings.Contains(body, "x-set") {
				t.Errorf("/headers-not is not under /headers, yet got its filter:\n%s", body)
			}

			for path, want := range map[string]string{
				"/prefix/one":         "path: /one",
				"/prefix/one/two?q=1": "path: /one/two?q=1",
				"/full/x":             "path: /replaced",
				"/strip/a/b":          "path: /a/b",
				"/strip":              "path: /",
			} {
				if _, body := do(path); !strings.Contains(body, want+"\n") && !strings.HasSuffix(body, want) {
					t.Errorf("GET %s: want %q in\n%s", path, want, body)
				}
			}
			if _, body := do("/prefix/one"); !strings.Contains(body, "host: rewritten.example") {
				t.Errorf("the rewritten Host: want host: rewritten.example in\n%s", body)
			}

			for path, want := range map[string]struct {
				code     int
				location string
			}{
				"/redirect/x?a=b": {301, "http://example.org/redirect/x?a=b"},
				"/scheme":         {302, "https://echo/scheme"},
				"/port/a":         {302, "http://echo:8083/moved/a"},
			} {
				resp, body := do(path)
				if resp.StatusCode != want.code || resp.Header.Get("Location") != want.location || body != "" {
					t.Errorf("GET %s: %d Location %q body %q, want %d %q and no body", path, resp.StatusCode, resp.Header.Get("Location"), body, want.code, want.location)
				}
				if redirected := resp.Header.Get("X-Redirected"); (path == "/redirect/x?a=b") != (redirected == "yes") {
					t.Errorf("GET %s: X-Redirected %q: the rule's response header modifier is not applied to its redirect alone", path, redirected)
				}
			}
			if resp, body := do("/cors"); resp.StatusCode != http.StatusInternalServerError || !strings.Contains(body, "CORS") {
				t.Errorf("a rule with an unsupported filter: %d %q, want 500 naming it", resp.StatusCode, body)
			}
			if resp, body := do("/backend-rewrite"); resp.StatusCode != http.StatusInternalServerError || !strings.Contains(body, "URLRewrite (on a backendRef)") {
				t.Errorf("a backendRef with an unsupported filter: %d %q, want 500 naming it", resp.StatusCode, body)
			}
			if !h2c && !netHTTPOnly {
				expectFastOnly(t, h)
			}
		})
	}
}

// expectFastOnly checks that the fast paths served every request of h's
// proxy so far: no connection went to net/http's path, and the event loop
// (when on) served them itself.
func expectFastOnly(t *testing.T, h *harness) {
	t.Helper()
	if n, m := h.p.stats.handoffs.total(pathFast), h.p.stats.handoffs.total(pathLoop); n != 0 || m != 0 {
		t.Errorf("%d connections handed to net/http, %d from the event loop to goroutines: the fast paths left filters to net/http", n, m)
	}
	if served := h.p.loops.served.Load(); h.p.EventLoops() > 0 && served != h.p.stats.requests.Load() {
		t.Errorf("the event loop served %d of %d requests", served, h.p.stats.requests.Load())
	}
}

func TestReplacePrefix(t *testing.T) {
	for _, tc := range []struct{ path, prefix, value, want string }{
		{"/prefix/one", "/prefix/one", "/one", "/one"},
		{"/prefix/one/two", "/prefix/one", "/one", "/one/two"},
		{"/prefix/one/two", "/prefix/one", "/", "/two"},
		{"/prefix/one", "/prefix/one", "/", "/"},
		{"/prefix/one/", "/prefix/one", "/one/", "/one/"},
		{"/foo", "/", "/bar", "/bar/foo"},
		// The Gateway API's own examples of an empty value.
		{"/foo/bar", "/foo", "", "/bar"},
		{"/foo/", "/foo", "", "/"},
		{"/foo", "/foo", "", "/"},
	} {
		if got := replacePrefix(tc.path, tc.prefix, tc.value); got != tc.want {
			t.Errorf("replacePrefix(%q, %q, %q) = %q, want %q", tc.path, tc.prefix, tc.value, got, tc.want)
		}
	}
}

func TestFilterConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		rule proxyapi.RouteRule
		want string
	}{
		"prefix rewrite after an exact match": {proxyapi.RouteRule{
			Matches: []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchExact, Value: "/x"}}},
			Filters: &proxyapi.Filters{Rewrite: &proxyapi.Rewrite{Path: &proxyapi.PathModifier{Type: proxyapi.ReplacePrefixMatch, Value: "/y"}}},
		}, "ReplacePrefixMatch needs every match"},
		"redirect status": {proxyapi.RouteRule{Filters: &proxyapi.Filters{Redirect: &proxyapi.Redirect{StatusCode: 200}}}, "200: use one of"},
		"redirect scheme": {proxyapi.RouteRule{Filters: &proxyapi.Filters{Redirect: &proxyapi.Redirect{Scheme: "ftp"}}}, `"ftp": use http or https`},
		"header name":     {proxyapi.RouteRule{Filters: &proxyapi.Filters{RequestHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "a b"}}}}}, "is not a header name"},
		"backendRef redirect": {proxyapi.RouteRule{Backends: []proxyapi.RouteBackend{{Service: "default/s", Port: 80, Weight: 1,
			Filters: &proxyapi.Filters{Redirect: &proxyapi.Redirect{}}}}}, "a backendRef takes header modifiers only"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := proxyapi.Config{Version: 1, Mark: testMark,
				Services: []proxyapi.Service{{Name: "default/s", VIP: "10.96.0.1", Port: 80}},
				Routes:   []proxyapi.Route{{Name: "default/r", Parents: []proxyapi.ParentRef{{Service: "default/s"}}, Rules: []proxyapi.RouteRule{tc.rule}}},
			}
			_, err := compile(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A consumer route (GAMMA: a route of another namespace than its parent
// Service's) applies to its namespace's clients only, and replaces the
// Service's own routes for them; other clients of a Service with consumer
// routes only reach its backends as if it had no route (the mesh suite's
// MeshConsumerRoute).
func TestConsumerRoutes(t *testing.T) {
	consumerApp := client{"127.0.0.4", 1003, "consumer/app"}
	echo := startBackend(t, "echo-v1", "127.0.1.1", nil)
	marked := func(name string) *proxyapi.Filters {
		return &proxyapi.Filters{ResponseHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-Route", Value: name}}}}
	}
	to := []proxyapi.RouteBackend{{Service: "producer/echo", Port: 80, Weight: 1}}
	eps := append(endpoints(echo), proxyapi.Endpoint{IP: consumerApp.ip, Identity: consumerApp.identity, Pod: consumerApp.pod})
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: eps,
		Services: []proxyapi.Service{svcPort("producer/echo", "10.96.0.10", 80, echo), svcPort("producer/solo", "10.96.0.11", 80, echo)},
		Routes: []proxyapi.Route{
			{Name: "producer/own", Parents: []proxyapi.ParentRef{{Service: "producer/echo"}},
				Rules: []proxyapi.RouteRule{{Backends: to, Filters: marked("producer")}}},
			{Name: "consumer/mine", Parents: []proxyapi.ParentRef{{Service: "producer/echo", Consumer: "consumer"}, {Service: "producer/solo", Consumer: "consumer"}},
				Rules: []proxyapi.RouteRule{{Backends: to, Filters: marked("consumer")}}},
		},
	})
	for _, tc := range []struct {
		c         client
		dst, want string
	}{
		{frontend, "10.96.0.10:80", "producer"}, {consumerApp, "10.96.0.10:80", "consumer"},
		{frontend, "10.96.0.11:80", ""}, {consumerApp, "10.96.0.11:80", "consumer"},
	} {
		h.dials(tc.c, tc.dst)
		c := h.client(tc.c, false)
		resp, err := c.Get("http://echo.producer/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		c.CloseIdleConnections()
		if got := resp.Header.Get("X-Route"); resp.StatusCode != 200 || got != tc.want {
			t.Errorf("client %s to %s: %d X-Route %q, want 200 %q", tc.c.pod, tc.dst, resp.StatusCode, got, tc.want)
		}
	}
}

// A redirect answers a request with a body, and a HEAD, and the
// connection carries the next request (the body read away).
func TestRedirectKeepsTheConnection(t *testing.T) { onPaths(t, testRedirectKeepsTheConnection) }

func testRedirectKeepsTheConnection(t *testing.T) {
	h := filtersHarness(t)
	conn, br := rawClient(t, h, frontend)
	fmt.Fprint(conn, "POST /redirect/p HTTP/1.1\r\nHost: echo\r\nContent-Length: 10\r\n\r\n0123456789")
	if resp, body := readResponse(t, br, "POST"); resp.StatusCode != 301 || resp.Header.Get("Location") != "http://example.org/redirect/p" ||
		resp.ContentLength != 0 || body != "" {
		t.Errorf("POST: %d Location %q Content-Length %d body %q, want 301 to http://example.org/redirect/p, empty", resp.StatusCode, resp.Header.Get("Location"), resp.ContentLength, body)
	}
	fmt.Fprint(conn, "HEAD /scheme HTTP/1.1\r\nHost: echo\r\n\r\n")
	if resp, _ := readResponse(t, br, "HEAD"); resp.StatusCode != 302 || resp.Header.Get("Location") != "https://echo/scheme" || resp.Header.Get("Content-Length") != "" {
		t.Errorf("HEAD: %d Location %q Content-Length %q, want 302 to https://echo/scheme and no length", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Content-Length"))
	}
	fmt.Fprint(conn, "GET /headers HTTP/1.1\r\nHost: echo\r\n\r\n")
	if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || !strings.Contains(body, "x-set: set") {
		t.Errorf("GET after the redirects: %d %q", resp.StatusCode, body)
	}
	if !netHTTPOnly {
		expectFastOnly(t, h)
	}
}

// Every text a filter writes into a head is refused with a control byte
// in it, naming the field, and the configuration is not served; a value
// with a horizontal tab (allowed in a field value) is taken.
func TestFilterControlBytes(t *testing.T) {
	const rulePath = "routes[0] (default/r).rules[0]"
	headers := func(h proxyapi.Header) *proxyapi.HeaderModifier {
		return &proxyapi.HeaderModifier{Set: []proxyapi.Header{h}}
	}
	fields := map[string]struct {
		filters func(s string) *proxyapi.Filters
		backend bool // the backendRef's filters
	}{
		"filters.requestHeaders.set[0].value": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{RequestHeaders: headers(proxyapi.Header{Name: "X-A", Value: "v" + s + "X-Evil: 1"})}
		}},
		"filters.requestHeaders.set[0].name": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{RequestHeaders: headers(proxyapi.Header{Name: "X-A" + s + "X-B", Value: "v"})}
		}},
		"filters.requestHeaders.add[0].value": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{RequestHeaders: &proxyapi.HeaderModifier{Add: []proxyapi.Header{{Name: "X-A", Value: s}}}}
		}},
		"filters.requestHeaders.remove[0]": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{RequestHeaders: &proxyapi.HeaderModifier{Remove: []string{"X-A" + s}}}
		}},
		"filters.responseHeaders.set[0].value": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{ResponseHeaders: headers(proxyapi.Header{Name: "X-A", Value: "v" + s})}
		}},
		"filters.redirect.hostname": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{Redirect: &proxyapi.Redirect{Hostname: "example.com" + s + "Set-Cookie: a=b"}}
		}},
		"filters.redirect.path.value": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{Redirect: &proxyapi.Redirect{Path: &proxyapi.PathModifier{Type: proxyapi.ReplaceFullPath, Value: "/x" + s}}}
		}},
		"filters.rewrite.hostname": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{Rewrite: &proxyapi.Rewrite{Hostname: "h" + s}}
		}},
		"filters.rewrite.path.value": {filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{Rewrite: &proxyapi.Rewrite{Path: &proxyapi.PathModifier{Type: proxyapi.ReplacePrefixMatch, Value: "/x" + s + "y"}}}
		}},
		"backends[0].filters.responseHeaders.set[0].value": {backend: true, filters: func(s string) *proxyapi.Filters {
			return &proxyapi.Filters{ResponseHeaders: headers(proxyapi.Header{Name: "X-A", Value: s})}
		}},
	}
	compileRule := func(backend bool, f *proxyapi.Filters) error {
		rule := proxyapi.RouteRule{Backends: []proxyapi.RouteBackend{{Service: "default/s", Port: 80, Weight: 1}}}
		if backend {
			rule.Backends[0].Filters = f
		} else {
			rule.Filters = f
			if f.Redirect != nil {
				rule.Backends = nil
			}
		}
		_, err := compile(proxyapi.Config{Version: 1, Listen: "127.0.0.1:15001", Mark: testMark,
			Services: []proxyapi.Service{{Name: "default/s", VIP: "10.96.0.1", Port: 80}},
			Routes:   []proxyapi.Route{{Name: "default/r", Parents: []proxyapi.ParentRef{{Service: "default/s"}}, Rules: []proxyapi.RouteRule{rule}}},
		})
		return err
	}
	for field, tc := range fields {
		for _, bad := range []struct{ s, name string }{{"\r", "CR"}, {"\n", "LF"}, {"\r\n", "CR"}, {"\x00", "NUL"}, {"\x7f", "DEL"}, {"\x1b", "0x1b"}} {
			t.Run(field+"/"+bad.name, func(t *testing.T) {
				err := compileRule(tc.backend, tc.filters(bad.s))
				var ce *ConfigError
				if !errors.As(err, &ce) || len(ce.Problems) != 1 {
					t.Fatalf("error %v, want one problem", err)
				}
				if want := rulePath + "." + field + ": "; !strings.HasPrefix(ce.Problems[0], want) || !strings.Contains(ce.Problems[0], bad.name) {
					t.Errorf("problem %q, want one starting %q naming %s", ce.Problems[0], want, bad.name)
				}
			})
		}
	}
	t.Run("tab", func(t *testing.T) {
		for _, f := range []*proxyapi.Filters{
			{RequestHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-A", Value: "a\tb"}}, Add: []proxyapi.Header{{Name: "X-B", Value: "\tc"}}}},
			{ResponseHeaders: headers(proxyapi.Header{Name: "X-A", Value: "a\tb"})},
		} {
			if err := compileRule(false, f); err != nil {
				t.Errorf("a value with a tab: %v", err)
			}
		}
	})
}

// A configuration whose filter would write a CR LF into a request is
// refused, and the one in force keeps serving: the upstream's bytes show
// the old filter's header and nothing of the refused one, on either path.
func TestRefusedFilterNeverReachesUpstream(t *testing.T) {
	onPaths(t, func(t *testing.T) {
		up := startHeadRecorder(t, "127.0.1.1")
		withHeader := func(version uint64, value string) proxyapi.Config {
			return proxyapi.Config{Version: version, Mark: testMark, Endpoints: []proxyapi.Endpoint{{IP: frontend.ip, Identity: frontend.identity, Pod: frontend.pod}},
				Services: []proxyapi.Service{{Name: "default/echo", VIP: "10.96.0.10", Port: 80,
					Backends: []proxyapi.Backend{{IP: up.addr.Addr().String(), Port: up.addr.Port(), Pod: "default/raw"}}}},
				Routes: []proxyapi.Route{{Name: "default/r", Parents: []proxyapi.ParentRef{{Service: "default/echo"}},
					Rules: []proxyapi.RouteRule{{Backends: []proxyapi.RouteBackend{{Service: "default/echo", Port: 80, Weight: 1}},
						Filters: &proxyapi.Filters{RequestHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-Tag", Value: value}}}}}}}},
			}
		}
		h := newHarness(t, withHeader(1, "kept"))
		bad := withHeader(2, "smuggled\r\nX-Evil: 1")
		bad.Listen = h.addr
		var ce *ConfigError
		if err := h.p.Apply(bad); !errors.As(err, &ce) || !strings.Contains(err.Error(), "requestHeaders.set[0].value") {
			t.Fatalf("applying a filter with CR LF: %v, want a ConfigError naming requestHeaders.set[0].value", err)
		}
		h.dials(frontend, "10.96.0.10:80")
		if code, body := get(t, h.client(frontend, false), "GET", "http://echo/x", "X-Tag", "client"); code != 200 || body != "ok" {
			t.Fatalf("got %d %q, want 200 ok", code, body)
		}
		heads := up.heads()
		if len(heads) != 1 {
			t.Fatalf("upstream got %d requests, want 1", len(heads))
		}
		if !strings.Contains(heads[0], "\r\nX-Tag: kept\r\n") || strings.Contains(heads[0], "Evil") || strings.Contains(heads[0], "smuggled") {
			t.Errorf("upstream got %q, want the version 1 filter's X-Tag: kept and nothing of version 2's", heads[0])
		}
		if st := h.p.Status(); st.Version != 1 || !strings.Contains(st.LastConfigError, "control") && !strings.Contains(st.LastConfigError, "CR") {
			t.Errorf("status: version %d, last error %q; want version 1 in force and the refusal named", st.Version, st.LastConfigError)
		}
	})
}

// headRecorder answers every request head with 200 "ok" and keeps the heads
// as they came, byte for byte (GET requests only: no body is read).
type headRecorder struct {
	addr netip.AddrPort
	mu   sync.Mutex
	got  []string
}

func startHeadRecorder(t *testing.T, ip string) *headRecorder {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	b := &headRecorder{addr: netip.MustParseAddrPort(ln.Addr().String())}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go b.serve(c)
		}
	}()
	return b
}

func (b *headRecorder) serve(c net.Conn) {
	defer c.Close()
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		if i := bytes.Index(buf, []byte("\r\n\r\n")); i >= 0 {
			b.mu.Lock()
			b.got = append(b.got, string(buf[:i+4]))
			b.mu.Unlock()
			buf = buf[i+4:]
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
			continue
		}
		n, err := c.Read(chunk)
		if err != nil {
			return
		}
		buf = append(buf, chunk[:n]...)
	}
}

func (b *headRecorder) heads() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.got)
}
