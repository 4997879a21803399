package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// The fast paths' header modifiers against net/http's path: each case's
// head goes through foldFilters and the fast paths' head writers, and
// through modifyHeaders the way net/http's path applies it (then what
// net/http's writers send of the result); both must read the same.

type modifier = proxyapi.HeaderModifier
type hdr = proxyapi.Header

func hv(name, value string) hdr { return hdr{Name: name, Value: value} }

func TestFastRequestHeaderFilters(t *testing.T) {
	for name, tc := range map[string]struct {
		head          string
		rule, backend *modifier
	}{
		"set add remove": {"GET / HTTP/1.1\r\nHost: a\r\nX-Set: client\r\nX-Add: client\r\nX-Remove: client\r\nX-Keep: k\r\n\r\n",
			&modifier{Set: []hdr{hv("X-Set", "set")}, Add: []hdr{hv("X-Add", "added"), hv("X-New", "new")}, Remove: []string{"X-Remove"}}, nil},
		"names in any case": {"GET / HTTP/1.1\r\nHost: a\r\nx-set: client\r\nX-REMOVE: client\r\nx-add: client\r\n\r\n",
			&modifier{Set: []hdr{hv("X-SET", "set")}, Add: []hdr{hv("X-ADD", "added")}, Remove: []string{"x-Remove"}}, nil},
		"repeated header added to": {"GET / HTTP/1.1\r\nHost: a\r\nX-Multi: 1\r\nX-Other: o\r\nX-Multi: 2\r\n\r\n",
			&modifier{Add: []hdr{hv("X-Multi", "3")}}, nil},
		"set on a header present twice": {"GET / HTTP/1.1\r\nHost: a\r\nX-Twice: 1\r\nX-Twice: 2\r\n\r\n",
			&modifier{Set: []hdr{hv("X-Twice", "one")}}, nil},
		"remove a header present twice": {"GET / HTTP/1.1\r\nHost: a\r\nX-Twice: 1\r\nAccept: */*\r\nX-Twice: 2\r\n\r\n",
			&modifier{Remove: []string{"X-Twice", "X-Absent"}}, nil},
		"set then add then remove in one modifier": {"GET / HTTP/1.1\r\nHost: a\r\nX-A: client\r\n\r\n",
			&modifier{Set: []hdr{hv("X-A", "set"), hv("X-B", "set")}, Add: []hdr{hv("X-A", "added"), hv("X-B", "added")}, Remove: []string{"X-A"}}, nil},
		"Host set": {"GET / HTTP/1.1\r\nX-Before: b\r\nHost: a.example\r\nX-After: a\r\n\r\n",
			&modifier{Set: []hdr{hv("host", "b.example")}}, nil},
		"Host added or removed: ignored as net/http does": {"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n",
			&modifier{Add: []hdr{hv("Host", "b.example")}}, &modifier{Remove: []string{"Host"}}},
		"Content-Length removed: the body keeps its framing": {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
			&modifier{Remove: []string{"Content-Length"}}, nil},
		"Content-Length or Transfer-Encoding set: ignored": {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
			&modifier{Set: []hdr{hv("Content-Length", "7")}, Add: []hdr{hv("Transfer-Encoding", "chunked")}}, nil},
		"User-Agent set and removed": {"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: curl\r\n\r\n",
			&modifier{Set: []hdr{hv("User-Agent", "proxy")}}, &modifier{Remove: []string{"User-Agent"}}},
		"backendRef after the rule": {"GET / HTTP/1.1\r\nHost: a\r\nX-A: client\r\nX-B: client\r\nX-C: client\r\n\r\n",
			&modifier{Add: []hdr{hv("X-A", "rule"), hv("X-C", "rule")}, Set: []hdr{hv("X-B", "rule")}},
			&modifier{Set: []hdr{hv("X-A", "backend")}, Remove: []string{"X-B"}, Add: []hdr{hv("X-C", "backend")}}},
		"hop-by-hop removed: already gone": {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n",
			&modifier{Remove: []string{"Keep-Alive", "Connection"}}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			rule := &proxyapi.Filters{RequestHeaders: tc.rule}
			var backendRef *proxyapi.Filters
			if tc.backend != nil {
				backendRef = &proxyapi.Filters{RequestHeaders: tc.backend}
			}
			edits, fast := foldFilters(rule, backendRef)
			if !fast {
				t.Fatal("the fast paths refused the filters")
			}
			var fr fastRequest
			if !fr.parse(tc.head) {
				t.Fatalf("the fast parser refused %q", tc.head)
			}
			body := strings.Repeat("b", int(fr.contentLength))
			out := fr.appendUpstreamHead(nil, &target{edits: edits})
			got, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(out) + body)))
			if err != nil {
				t.Fatalf("the upstream head %q: %v", out, err)
			}

			in, err := http.ReadRequest(bufio.NewReader(strings.NewReader(tc.head + body)))
			if err != nil {
				t.Fatal(err)
			}
			want, host := netHTTPRequestHeader(in, tc.rule, tc.backend)
			if got.Host != host || got.ContentLength != in.ContentLength || !maps.EqualFunc(got.Header, want, slices.Equal) {
				t.Errorf("upstream head\n%s\nHost %q, Content-Length %d, header %v;\nnet/http's path: Host %q, Content-Length %d, header %v",
					out, got.Host, got.ContentLength, got.Header, host, in.ContentLength, want)
			}
		})
	}
}

// netHTTPRequestHeader is what net/http's path sends upstream of in's
// header with the modifiers (forward.go's Rewrite, then net/http's request
// writer): the header without hop-by-hop fields, modified, then without
// what the writer does not take from the map (it writes the body's own
// framing and one User-Agent).
func netHTTPRequestHeader(in *http.Request, mods ...*modifier) (http.Header, string) {
	h, host := in.Header.Clone(), in.Host
	for _, name := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		h.Del(name)
	}
	for _, m := range mods {
		modifyHeaders(m, h, &host)
	}
	if ua := h.Get("User-Agent"); ua != "" { // the writer sends the first value, if not empty
		h["User-Agent"] = []string{ua}
	} else {
		h.Del("User-Agent")
	}
	// The framing is the body's whatever the filters did: the client's
	// Content-Length (the fast paths pass it as it came; net/http writes
	// the body's own, the same but for an empty body, where it goes by the
	// method whatever the filters).
	for _, vs := range h { // the writer trims values
		for i, v := range vs {
			vs[i] = textproto.TrimString(v)
		}
	}
	h.Del("Host") // a Host added lands in the map, which the writer does not send
	h.Del("Transfer-Encoding")
	h.Del("Content-Length")
	if cl, ok := in.Header["Content-Length"]; ok {
		h["Content-Length"] = cl
	}
	return h, host
}

func TestFastResponseHeaderFilters(t *testing.T) {
	for name, tc := range map[string]struct {
		head          string
		rule, backend *modifier
	}{
		"set add remove": {"HTTP/1.1 200 OK\r\nX-Set: up\r\nX-Remove: up\r\nContent-Length: 0\r\n\r\n",
			&modifier{Set: []hdr{hv("X-Set", "proxy")}, Add: []hdr{hv("X-Add", "added")}, Remove: []string{"X-Remove"}}, nil},
		"names in any case, repeated headers": {"HTTP/1.1 200 OK\r\nset-cookie: a=1\r\nSet-Cookie: b=2\r\nx-keep: k\r\nContent-Length: 0\r\n\r\n",
			&modifier{Add: []hdr{hv("SET-COOKIE", "c=3")}}, &modifier{Set: []hdr{hv("X-KEEP", "set")}}},
		"Content-Length removed: the body keeps its framing": {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: a\r\n\r\n",
			&modifier{Remove: []string{"Content-Length", "X-A"}}, nil},
		"chunked, Content-Length set: ignored": {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
			&modifier{Set: []hdr{hv("Content-Length", "3")}, Remove: []string{"Transfer-Encoding"}}, nil},
		"Host is a header like others": {"HTTP/1.1 204 No Content\r\nHost: up\r\n\r\n",
			&modifier{Set: []hdr{hv("Host", "proxy")}}, nil},
		"backendRef after the rule": {"HTTP/1.1 200 OK\r\nX-A: up\r\nContent-Length: 0\r\n\r\n",
			&modifier{Remove: []string{"X-A"}}, &modifier{Add: []hdr{hv("X-A", "backend")}}},
	} {
		t.Run(name, func(t *testing.T) {
			edits, fast := foldFilters(&proxyapi.Filters{ResponseHeaders: tc.rule}, &proxyapi.Filters{ResponseHeaders: tc.backend})
			if !fast {
				t.Fatal("the fast paths refused the filters")
			}
			var fr fastResponse
			if err := fr.parse([]byte(tc.head)); err != nil {
				t.Fatal(err)
			}
			up, err := http.ReadResponse(bufio.NewReader(strings.NewReader(tc.head)), nil)
			if err != nil {
				t.Fatal(err)
			}
			expectNetHTTPResponse(t, fr.appendHead(nil, &edits.response, false), up, tc.rule, tc.backend)
		})
	}
}

// expectNetHTTPResponse checks that out, the head the fast paths write
// for the client of upstream response up with the modifiers, reads as
// net/http's path's: the transport's header without hop-by-hop fields,
// modified, values trimmed by the server's writer; the framing the
// upstream's (the server frames the body itself, the same body).
func expectNetHTTPResponse(t *testing.T, out []byte, up *http.Response, mods ...*modifier) {
	t.Helper()
	got, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
	if err != nil {
		t.Fatalf("the head for the client %q: %v", out, err)
	}
	want := up.Header.Clone()
	for _, name := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Upgrade"} {
		want.Del(name)
	}
	for _, m := range mods {
		modifyHeaders(m, want, nil)
	}
	for _, vs := range want {
		for i, v := range vs {
			vs[i] = textproto.TrimString(v)
		}
	}
	for _, h := range []http.Header{want, got.Header} {
		h.Del("Content-Length")
		h.Del("Transfer-Encoding")
	}
	if !maps.EqualFunc(got.Header, want, slices.Equal) {
		t.Errorf("head for the client\n%s\nheader %v, net/http's path %v", out, got.Header, want)
	}
	if got.ContentLength != up.ContentLength || !slices.Equal(got.TransferEncoding, up.TransferEncoding) {
		t.Errorf("head for the client\n%s\nframing: Content-Length %d, Transfer-Encoding %q; the upstream's %d %q",
			out, got.ContentLength, got.TransferEncoding, up.ContentLength, up.TransferEncoding)
	}
}

// Filters the fast paths do not apply leave the rule to net/http's path.
func TestSlowFilters(t *testing.T) {
	for name, f := range map[string]*proxyapi.Filters{
		"Connection set":                    {RequestHeaders: &modifier{Set: []hdr{hv("Connection", "close")}}},
		"Upgrade added":                     {ResponseHeaders: &modifier{Add: []hdr{hv("upgrade", "h2c")}}},
		"Trailer set":                       {ResponseHeaders: &modifier{Set: []hdr{hv("Trailer", "X-T")}}},
		"Expect set":                        {RequestHeaders: &modifier{Set: []hdr{hv("Expect", "100-continue")}}},
		"a request's UA added":              {RequestHeaders: &modifier{Add: []hdr{hv("User-Agent", "proxy")}}},
		"a value with a CRLF":               {RequestHeaders: &modifier{Set: []hdr{hv("X-A", "a\r\nX-Injected: 1")}}},
		"an empty Host":                     {RequestHeaders: &modifier{Set: []hdr{hv("Host", "")}}},
		"a redirect's hostname with a CRLF": {Redirect: &proxyapi.Redirect{Hostname: "a\r\nX-Injected: 1"}},
		"a value with a NUL":                {ResponseHeaders: &modifier{Add: []hdr{hv("X-A", "a\x00")}}},
		"a value with a DEL":                {ResponseHeaders: &modifier{Add: []hdr{hv("X-A", "a\x7f")}}},
		"a response UA is fine":             nil,
	} {
		t.Run(name, func(t *testing.T) {
			if f == nil {
				if _, fast := foldFilters(&proxyapi.Filters{ResponseHeaders: &modifier{Add: []hdr{hv("User-Agent", "x")}}}, nil); !fast {
					t.Error("a response's User-Agent is an ordinary header, yet refused")
				}
				return
			}
			if _, fast := foldFilters(f, nil); fast {
				t.Error("taken by the fast paths")
			}
			if _, fast := foldFilters(nil, f); fast && f.Redirect == nil { // (a backendRef has no redirect: compileFilters)
				t.Error("taken by the fast paths as a backendRef's")
			}
		})
	}
}

// A URL rewrite is a new request line (the path as net/http writes it)
// and Host; a header modifier's Host wins over the rewrite's, as on
// net/http's path.
func TestFastRewriteRequestLine(t *testing.T) {
	prefix := &matchEntry{pathType: proxyapi.MatchPathPrefix, path: "/prefix"}
	for _, tc := range []struct {
		head   string
		rw     *proxyapi.Rewrite
		set    *modifier
		line   string
		host   string
		header string // a header line that must be there
	}{
		{"GET /prefix/a?q=1 HTTP/1.1\r\nHost: a\r\nX-K: k\r\n\r\n",
			&proxyapi.Rewrite{Path: &proxyapi.PathModifier{Type: proxyapi.ReplacePrefixMatch, Value: "/new"}}, nil,
			"GET /new/a?q=1 HTTP/1.1", "a", "X-K: k"},
		{"GET /prefix/a%20b HTTP/1.1\r\nHost: a\r\n\r\n",
			&proxyapi.Rewrite{Path: &proxyapi.PathModifier{Type: proxyapi.ReplaceFullPath, Value: "/full path"}, Hostname: "rw.example"}, nil,
			"GET /full%20path HTTP/1.1", "rw.example", ""},
		{"GET /prefix HTTP/1.1\r\nHost: a\r\n\r\n",
			&proxyapi.Rewrite{Hostname: "rw.example"}, &modifier{Set: []hdr{hv("Host", "set.example")}},
			"GET /prefix HTTP/1.1", "set.example", ""},
	} {
		edits, fast := foldFilters(&proxyapi.Filters{Rewrite: tc.rw, RequestHeaders: tc.set}, nil)
		if !fast {
			t.Fatalf("%+v: refused", tc.rw)
		}
		var fr fastRequest
		if !fr.parse(tc.head) {
			t.Fatalf("the fast parser refused %q", tc.head)
		}
		out := string(fr.appendUpstreamHead(nil, &target{edits: edits, match: prefix}))
		line, _, _ := strings.Cut(out, "\r\n")
		got, err := http.ReadRequest(bufio.NewReader(strings.NewReader(out)))
		if err != nil || line != tc.line || got.Host != tc.host || !strings.Contains(out, "\r\n"+tc.header) {
			t.Errorf("%q rewritten: %q (%v), want line %q, Host %q, %q kept", tc.head, out, err, tc.line, tc.host, tc.header)
		}
	}
}

// Header modifiers on responses of every framing (Content-Length,
// chunked, to the end of the connection) and on a request with a body,
// their Content-Length removed by the filters: the bodies pass whole, the
// fast paths serve them without net/http, and a rule with a filter they
// do not apply still gets it, from net/http's path.
func TestFiltersKeepFraming(t *testing.T) { onPaths(t, testFiltersKeepFraming) }

func testFiltersKeepFraming(t *testing.T) {
	backend := scriptBackend(t, "127.0.13.1", func(c net.Conn, req *http.Request) {
		// What the backend got, for the test to check.
		seen := fmt.Sprintf("host=%s x-req=%s length=%d connection=%v", req.Host, req.Header.Get("X-Req"), req.ContentLength, req.Close)
		switch req.URL.Path {
		case "/chunked":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-Up: up\r\nTransfer-Encoding: chunked\r\n\r\n5\r\npart1\r\n%x\r\n%s\r\n0\r\n\r\n", len(seen), seen)
		case "/eof":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-Up: up\r\n\r\n%s", seen)
			c.Close()
		default:
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-Up: up\r\nContent-Length: %d\r\n\r\n%s", len(seen), seen)
		}
	})
	rule := &proxyapi.Filters{
		RequestHeaders: &modifier{Set: []hdr{hv("Host", "new.example")}, Add: []hdr{hv("X-Req", "r")}, Remove: []string{"Content-Length"}},
		ResponseHeaders: &modifier{Set: []hdr{hv("X-Up", "proxy")}, Add: []hdr{hv("X-Added", "a")},
			Remove: []string{"Content-Length", "Transfer-Encoding"}},
	}
	to := []proxyapi.RouteBackend{{Service: "default/raw", Port: 80, Weight: 1,
		Filters: &proxyapi.Filters{ResponseHeaders: &modifier{Add: []hdr{hv("X-Backend", "b")}}}}}
	slow := *rule
	slow.RequestHeaders = &modifier{Set: []hdr{hv("Connection", "close"), hv("Host", "new.example")}, Add: []hdr{hv("X-Req", "r")}}
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(),
		Services: []proxyapi.Service{{Name: "default/raw", VIP: "10.96.0.13", Port: 80,
			Backends: []proxyapi.Backend{{IP: backend.Addr().String(), Port: backend.Port(), Pod: "default/raw"}}}},
		Routes: []proxyapi.Route{{Name: "default/raw", Parents: []proxyapi.ParentRef{{Service: "default/raw"}},
			Rules: []proxyapi.RouteRule{
				{Matches: []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: "/slow"}}}, Backends: to, Filters: &slow},
				{Backends: to, Filters: rule},
			}}},
	})
	h.dials(frontend, "10.96.0.13:80")
	conn, br := rawClient(t, h, frontend)
	check := func(method, path, body, wantConnection string) {
		t.Helper()
		if path == "/eof" || path == "/slow" { // a connection of its own (the /eof response ends it)
			conn, br = rawClient(t, h, frontend)
		}
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: raw\r\nContent-Length: %d\r\n\r\n%s", method, path, len(body), body)
		resp, got := readResponse(t, br, method)
		want := fmt.Sprintf("host=new.example x-req=r length=%d connection=%s", len(body), wantConnection)
		if path == "/chunked" {
			want = "part1" + want
		}
		if resp.StatusCode != 200 || got != want {
			t.Errorf("%s %s: %d %q, want 200 %q", method, path, resp.StatusCode, got, want)
		}
		for name, want := range map[string]string{"X-Up": "proxy", "X-Added": "a", "X-Backend": "b"} {
			if got := resp.Header.Values(name); len(got) != 1 || got[0] != want {
				t.Errorf("%s %s: %s %q, want %q", method, path, name, got, want)
			}
		}
	}
	check("GET", "/length", "", "false")
	check("POST", "/length", "hello", "false")
	check("GET", "/chunked", "", "false")
	check("POST", "/chunked", "hello", "false")
	check("GET", "/eof", "", "false")
	if !netHTTPOnly {
		expectFastOnly(t, h)
	}
	check("GET", "/slow", "", "true") // net/http's path sends Connection: close as the filter asks
	if n := h.p.stats.handoffs.total(pathFast) + h.p.stats.handoffs.total(pathLoop); !netHTTPOnly && n == 0 {
		t.Error("a rule setting Connection was served by the fast path, which does not apply it")
	}
}

// fuzzModifiers are a rule's and a backendRef's modifiers: ops has two
// bits per modifier and name (0 none, 1 set, 2 add, 3 remove).
func fuzzModifiers(name1, name2, value string, ops uint8) [2]*modifier {
	mods := [2]*modifier{{}, {}}
	for i, name := range []string{name1, name2, name1, name2} {
		m := mods[i/2]
		switch ops >> (2 * i) & 3 {
		case 1:
			m.Set = append(m.Set, hv(name, value))
		case 2:
			m.Add = append(m.Add, hv(name, value))
		case 3:
			m.Remove = append(m.Remove, name)
		}
	}
	return mods
}

// FuzzFastRequestHeaderFilters: any request head the fast parser takes,
// with a rule's and a backendRef's modifier of any of set, add and remove
// on two names, reads upstream as net/http's path would send it.
func FuzzFastRequestHeaderFilters(f *testing.F) {
	f.Add("GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\nX-B: b\r\n\r\n", "X-A", "v", "x-b", uint8(0x1b))
	f.Add("POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nUser-Agent: u\r\n\r\n", "content-length", "9", "User-Agent", uint8(0x36))
	f.Add("GET / HTTP/1.1\r\nHost: a.example\r\nAccept: */*\r\n\r\n", "HOST", "b.example", "accept", uint8(0x09))
	f.Fuzz(func(t *testing.T, head, name1, value, name2 string, ops uint8) {
		mods := fuzzModifiers(name1, name2, value, ops)
		if !isToken(name1) || name1 == "" || !isToken(name2) || name2 == "" { // compileFilters refuses them
			return
		}
		edits, fast := foldFilters(&proxyapi.Filters{RequestHeaders: mods[0]}, &proxyapi.Filters{RequestHeaders: mods[1]})
		var fr fastRequest
		n, st := findHead([]byte(head))
		if !fast || st != headComplete || n != len(head) || !fr.parse(head) || fr.contentLength > 0 {
			return
		}
		in, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head)))
		if ua, ok := in.Header["User-Agent"]; err != nil || ok && (len(ua) != 1 || ua[0] == "") {
			// The fast parser took what net/http refuses (h1parse's own
			// fuzz test looks at that), or an empty or repeated User-Agent,
			// which the fast paths pass as it came and net/http's writer
			// drops, with or without filters.
			return
		}
		out := fr.appendUpstreamHead(nil, &target{edits: edits})
		got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(out)))
		if err != nil {
			t.Fatalf("the upstream head %q: %v", out, err)
		}
		want, host := netHTTPRequestHeader(in, mods[0], mods[1])
		if got.Host != host || !maps.EqualFunc(got.Header, want, slices.Equal) {
			t.Errorf("upstream head\n%s\nHost %q, header %v;\nnet/http's path: Host %q, header %v", out, got.Host, got.Header, host, want)
		}
	})
}

// FuzzFastResponseHeaderFilters is FuzzFastRequestHeaderFilters for the
// response head the client gets.
func FuzzFastResponseHeaderFilters(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 3\r\n\r\n", "X-A", "v", "content-length", uint8(0x1b))
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nSet-Cookie: a\r\n\r\n", "set-cookie", "b", "Transfer-Encoding", uint8(0x36))
	f.Fuzz(func(t *testing.T, head, name1, value, name2 string, ops uint8) {
		mods := fuzzModifiers(name1, name2, value, ops)
		if !isToken(name1) || name1 == "" || !isToken(name2) || name2 == "" {
			return
		}
		edits, fast := foldFilters(&proxyapi.Filters{ResponseHeaders: mods[0]}, &proxyapi.Filters{ResponseHeaders: mods[1]})
		var fr fastResponse
		n, st := findHead([]byte(head))
		if !fast || st != headComplete || n != len(head) || fr.parse([]byte(head)) != nil || fr.status < 200 {
			return
		}
		up, err := http.ReadResponse(bufio.NewReader(strings.NewReader(head)), nil)
		if err != nil {
			return
		}
		// Hop-by-hop fields net/http's reverse proxy drops and the fast
		// paths pass, with or without filters: not the filters' business.
		for _, name := range []string{"Te", "Trailer", "Proxy-Authenticate", "Proxy-Authorization"} {
			if _, ok := up.Header[name]; ok {
				return
			}
		}
		expectNetHTTPResponse(t, fr.appendHead(nil, &edits.response, false), up, mods[0], mods[1])
	})
}
