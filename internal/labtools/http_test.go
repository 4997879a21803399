package labtools

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// splitServer stands in for a proxy splitting by weight: every fourth
// request, counted over all connections, is answered by "v2", the others
// by "v1". It counts the connections it accepted and notes what it saw.
type splitServer struct {
	*httptest.Server
	conns atomic.Int64

	mu     sync.Mutex
	n      int
	protos map[string]int // "HTTP/1.1", "HTTP/2.0"
	last   *http.Request
}

func newSplitServer(t *testing.T, h2c bool) *splitServer {
	t.Helper()
	s := &splitServer{protos: map[string]int{}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.n++
		pod := "v1"
		if s.n%4 == 0 {
			pod = "v2"
		}
		s.protos[r.Proto]++
		s.last = r
		s.mu.Unlock()
		w.Header().Set("X-Shunt-Pod", pod)
		// A body to drain: the connection is reused only once it was.
		w.Write(bytes.Repeat([]byte("x"), 10000))
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	if h2c {
		s.Config.Protocols = new(http.Protocols)
		s.Config.Protocols.SetHTTP1(true)
		s.Config.Protocols.SetUnencryptedHTTP2(true)
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func TestHTTPLoadCountsByPodOverOneConnection(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		s := newSplitServer(t, h2)
		q := Request{URL: s.URL + "/x", HTTP2: h2, Timeout: 5 * time.Second}
		got := HTTPLoad(q, 100, 1, 0)
		if got.Requests != 100 || got.ByPod["v1"] != 75 || got.ByPod["v2"] != 25 || got.ByStatus["200"] != 100 ||
			got.Errors != 0 || got.Connections != 1 {
			t.Errorf("http2 %v: %+v", h2, got)
		}
		if n := s.conns.Load(); n != 1 {
			t.Errorf("http2 %v: the server accepted %d connections, want 1", h2, n)
		}
		want := "HTTP/1.1"
		if h2 {
			want = "HTTP/2.0"
		}
		if s.protos[want] != 100 {
			t.Errorf("http2 %v: protocols %v", h2, s.protos)
		}
	}
}

func TestHTTPLoadOverSeveralConnections(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		s := newSplitServer(t, h2)
		got := HTTPLoad(Request{URL: s.URL, HTTP2: h2, Timeout: 5 * time.Second}, 42, 4, 0)
		if got.ByPod["v1"]+got.ByPod["v2"] != 42 || got.ByPod["v2"] != 10 || got.Connections != 4 {
			t.Errorf("http2 %v: %+v", h2, got)
		}
		if n := s.conns.Load(); n != 4 {
			t.Errorf("http2 %v: the server accepted %d connections, want 4", h2, n)
		}
	}
	// More connections than requests: one request each.
	s := newSplitServer(t, false)
	if got := HTTPLoad(Request{URL: s.URL, Timeout: 5 * time.Second}, 2, 5, 0); got.Connections != 2 || got.ByStatus["200"] != 2 {
		t.Errorf("2 requests over 5 connections: %+v", got)
	}
}

func TestHTTPLoadSendsTheRequestAsAsked(t *testing.T) {
	s := newSplitServer(t, false)
	h, err := ParseHeaders([]string{"Host: web.example", "X-Canary: yes", "x-canary: again"})
	if err != nil {
		t.Fatal(err)
	}
	got := HTTPLoad(Request{URL: s.URL + "/api?q=1", Method: "POST", Header: h, Timeout: 5 * time.Second}, 1, 1, 0)
	if got.ByStatus["200"] != 1 {
		t.Fatalf("%+v", got)
	}
	r := s.last
	if r.Method != "POST" || r.Host != "web.example" || r.URL.RequestURI() != "/api?q=1" ||
		strings.Join(r.Header.Values("X-Canary"), ",") != "yes,again" {
		t.Errorf("server saw %s %s%s %v", r.Method, r.Host, r.URL.RequestURI(), r.Header)
	}
}

func TestHTTPLoadCountsErrorsAndMissingPods(t *testing.T) {
	// Responses without X-Shunt-Pod count under "", by their status.
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "denied", http.StatusForbidden)
	}))
	defer plain.Close()
	got := HTTPLoad(Request{URL: plain.URL, Timeout: 5 * time.Second}, 3, 1, 0)
	if got.ByPod[""] != 3 || got.ByStatus["403"] != 3 || got.Errors != 0 {
		t.Errorf("no pod header: %+v", got)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String() + "/"
	l.Close()
	got = HTTPLoad(Request{URL: closed, Timeout: time.Second}, 3, 2, 0)
	if got.Errors != 3 || got.Connections != 0 || len(got.ByPod) != 0 || !strings.Contains(got.FirstError, "refused") {
		t.Errorf("closed port: %+v", got)
	}
}

func TestHTTPGet(t *testing.T) {
	var seen *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r
		http.Error(w, "denied by policy", http.StatusForbidden)
	}))
	defer srv.Close()
	h, _ := ParseHeaders([]string{"Host: admin.example", "Authorization: Bearer x"})
	var out bytes.Buffer
	if err := HTTPGet(Request{URL: srv.URL + "/admin", Method: "DELETE", Header: h, Timeout: 5 * time.Second}, &out); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "403\ndenied by policy\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
	if seen.Method != "DELETE" || seen.Host != "admin.example" || seen.Header.Get("Authorization") != "Bearer x" {
		t.Errorf("server saw %s %s %v", seen.Method, seen.Host, seen.Header)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	out.Reset()
	if err := HTTPGet(Request{URL: "http://" + l.Addr().String() + "/", Timeout: time.Second}, &out); err == nil || out.Len() != 0 {
		t.Errorf("closed port: %v, output %q", err, out.String())
	}
}

func TestParseHeaders(t *testing.T) {
	h, err := ParseHeaders([]string{"X-A: 1", "x-a:2", "X-Empty:", "X-Colon: a:b"})
	if err != nil || strings.Join(h.Values("X-A"), ",") != "1,2" || h.Get("X-Colon") != "a:b" || len(h.Values("X-Empty")) != 1 {
		t.Errorf("ParseHeaders: %v %v", h, err)
	}
	for _, bad := range []string{"X-A", ": v", "X A: v"} {
		if _, err := ParseHeaders([]string{bad}); err == nil {
			t.Errorf("ParseHeaders(%q) accepted", bad)
		}
	}
}

func TestServeHTTPSpeaksH2CToo(t *testing.T) {
	a := startServer(t, "pod-a")
	for _, h2 := range []bool{false, true} {
		got := HTTPLoad(Request{URL: "http://" + a["http"] + "/", HTTP2: h2, Timeout: 5 * time.Second}, 3, 1, 0)
		if got.ByPod["pod-a"] != 3 || got.Connections != 1 {
			t.Errorf("http2 %v: %+v", h2, got)
		}
	}
}
