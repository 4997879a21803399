package proxy

import (
	"bufio"
	"bytes"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
)

var requestHeadSeeds = []string{
	"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET /a/b?x=1&y=%20 HTTP/1.1\r\nHost: svc:8080\r\nUser-Agent: t\r\nAccept: */*\r\nX-Multi: 1\r\nx-multi: 2\r\n\r\n",
	"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello",
	"GET /%7Euser/a%2Fb HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
	"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
	"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.2.3.4\r\nKeep-Alive: 5\r\n\r\n",
	"GET /a#frag HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nhOST: a\r\ncontent-length: +1\r\n\r\n",
}

// FuzzParseRequestHead checks the fast path's request parser against
// net/http's: whatever the fast path takes, net/http reads the same way
// (method, path, query, host, headers, length); nothing panics.
func FuzzParseRequestHead(f *testing.F) {
	for _, s := range requestHeadSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, st := findHead(data)
		if st != headComplete {
			return
		}
		var fr fastRequest
		if !fr.parse(string(data[:n])) {
			return
		}
		std, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data[:n])))
		if err != nil {
			t.Fatalf("the fast path took a head net/http refuses (%v): %q", err, data[:n])
		}
		r := &fr.req
		if r.Method != std.Method || r.URL.Path != std.URL.Path || r.URL.RawQuery != std.URL.RawQuery ||
			r.Host != std.Host || r.ContentLength != std.ContentLength || r.Close != std.Close ||
			r.RequestURI != std.RequestURI {
			t.Fatalf("%q:\nfast     %s %q %q host %q length %d close %v\nnet/http %s %q %q host %q length %d close %v", data[:n],
				r.Method, r.URL.Path, r.URL.RawQuery, r.Host, r.ContentLength, r.Close,
				std.Method, std.URL.Path, std.URL.RawQuery, std.Host, std.ContentLength, std.Close)
		}
		if !maps.EqualFunc(r.Header, std.Header, slices.Equal) {
			t.Fatalf("%q: headers\nfast     %v\nnet/http %v", data[:n], r.Header, std.Header)
		}
		// The head sent upstream is the request line and the forwarded
		// lines, which net/http reads as the same request less hop-by-hop
		// headers.
		fc := &fastConn{req: fr}
		up, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(fc.req.appendUpstreamHead(nil, &target{}))))
		if err != nil || up.URL.Path != std.URL.Path || up.Host != std.Host || up.Header.Get("Connection") != "" ||
			up.Header.Get("Keep-Alive") != "" || up.ContentLength != std.ContentLength {
			t.Fatalf("%q: upstream head %q read as %v (%v)", data[:n], fc.req.appendUpstreamHead(nil, &target{}), up, err)
		}
	})
}

func TestParseRequestHeadRefusesWhatNetHTTPMustHandle(t *testing.T) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nTrailer: X\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\n",
		"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: X-Secret\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
	} {
		n, st := findHead([]byte(s))
		var fr fastRequest
		if st == headComplete && fr.parse(s[:n]) {
			t.Errorf("the fast path took %q", s)
		}
	}
	if _, st := findHead([]byte("GET / HTTP/1.1\nHost: a\n\n")); st != headRefused {
		t.Errorf("bare LF: %v, want refused at once", st)
	}
	if _, st := findHead([]byte("GET / HTTP/1.1\r\nHost: a\r\n")); st != headIncomplete {
		t.Errorf("half a head: %v, want incomplete", st)
	}
}

func TestParseResponseHead(t *testing.T) {
	for _, c := range []struct {
		head           string
		status         int
		length         int64
		chunked, close bool
		forwarded      string
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n", 200, 5, false, false, "Content-Length: 5\r\nX-A: 1\r\n"},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n", 200, -1, true, true, "Transfer-Encoding: chunked\r\n"},
		{"HTTP/1.0 404 Not Found\r\nkeep-alive: timeout=5\r\n\r\n", 404, -1, false, true, ""},
		{"HTTP/1.1 204\r\n\r\n", 204, -1, false, false, ""},
		{"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 200, -1, true, false, "X-A: 1\r\nTransfer-Encoding: chunked\r\n"},
	} {
		var r fastResponse
		if err := r.parse([]byte(c.head)); err != nil {
			t.Errorf("%q: %v", c.head, err)
			continue
		}
		var fwd strings.Builder
		for _, s := range r.forward {
			fwd.Write(r.text[s.start:s.end])
		}
		if r.status != c.status || r.contentLength != c.length || r.chunked != c.chunked || r.close != c.close || fwd.String() != c.forwarded {
			t.Errorf("%q: %d %d chunked=%v close=%v %q", c.head, r.status, r.contentLength, r.chunked, r.close, fwd.String())
		}
	}
	for _, bad := range []string{"HTTP/2 200 OK\r\n\r\n", "HTTP/1.1 20 OK\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 200 OK\r\nNoColon\r\n\r\n"} {
		var r fastResponse
		if r.parse([]byte(bad)) == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
