package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// The event loop's own cases; the rest of the suite runs through the loop
// too (SHUNT_PROXY_NO_EVENT_LOOP=1 runs it without).

func skipWithoutLoop(t *testing.T) {
	t.Helper()
	if netHTTPOnly || noEventLoop {
		t.Skip("the event loop is off (SHUNT_PROXY_NET_HTTP_ONLY=1 or SHUNT_PROXY_NO_EVENT_LOOP=1)")
	}
	t.Setenv("SHUNT_PROXY_EVENT_LOOPS", "1") // one even where GOMAXPROCS=1 (then without holding its P)
}

// scriptBackend accepts connections and lets script write each response
// as it likes (in pieces, then close, ...), after reading the request.
func scriptBackend(t *testing.T, ip string, script func(c net.Conn, req *http.Request)) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					script(c, req)
				}
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

func loopHarness(t *testing.T, b *testBackend) *harness {
	h := newHarness(t, echoConfig(b))
	h.dials(frontend, "10.96.0.80:80")
	return h
}

func TestEventLoopServesPlainRequests(t *testing.T) {
	skipWithoutLoop(t)
	b := echoBackend(t, "echo", "127.0.9.1")
	h := loopHarness(t, b)
	conn, br := rawClient(t, h, frontend)
	for i := 0; i < 5; i++ {
		fmt.Fprintf(conn, "GET /a%d HTTP/1.1\r\nHost: echo\r\n\r\n", i)
		if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || body != fmt.Sprintf("/a%d", i) {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		fl := h.nextFlow()
		if fl.HTTP.Status != 200 || fl.HTTP.Path != fmt.Sprintf("/a%d", i) || fl.Destination.Pod != "default/echo" || fl.Verdict != "FORWARDED" {
			t.Errorf("flow %d: %+v %+v", i, fl, fl.HTTP)
		}
	}
	conn.Write([]byte("POST /p HTTP/1.1\r\nHost: echo\r\nContent-Length: 5\r\n\r\nhello"))
	if resp, body := readResponse(t, br, "POST"); resp.StatusCode != 200 || !strings.HasPrefix(body, "5 ") {
		t.Fatalf("POST: %d %q", resp.StatusCode, body)
	}
	if n := h.p.loops.served.Load(); n != 6 {
		t.Errorf("the loops served %d requests, want 6", n)
	}
	if n := h.p.stats.handoffs.total(pathLoop); n != 0 {
		t.Errorf("%d connections handed to goroutines, want 0", n)
	}
	if n := len(b.requests()); n != 6 {
		t.Errorf("the backend saw %d requests, want 6", n)
	}
}

// Two requests in one read, or a request sent while one is in flight:
// the connection goes to the goroutine path, and every response comes,
// in order.
func TestEventLoopHandsPipelinedRequestsToGoroutines(t *testing.T) {
	skipWithoutLoop(t)
	release := make(chan struct{})
	b := startBackend(t, "echo", "127.0.9.2", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		fmt.Fprint(w, r.URL.Path)
	})
	h := loopHarness(t, b)

	conn, br := rawClient(t, h, frontend)
	conn.Write([]byte("GET /one HTTP/1.1\r\nHost: echo\r\n\r\nGET /two HTTP/1.1\r\nHost: echo\r\n\r\n"))
	expectServed(t, h, br, []string{"/one", "/two"}, 1, 0)

	conn2, br2 := rawClient(t, h, frontend)
	conn2.Write([]byte("GET /slow HTTP/1.1\r\nHost: echo\r\n\r\n"))
	for deadline := time.Now().Add(5 * time.Second); len(b.requests()) < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slow request did not reach the backend")
		}
	}
	conn2.Write([]byte("GET /after HTTP/1.1\r\nHost: echo\r\n\r\n"))
	time.Sleep(50 * time.Millisecond) // the loop sees the second request in flight
	close(release)
	expectServed(t, h, br2, []string{"/slow", "/after"}, 2, 1) // the loop served /slow
}

// expectServed reads responses with these bodies, in order, and checks
// how many connections the loops handed to goroutines and how many
// requests they served themselves so far.
func expectServed(t *testing.T, h *harness, br *bufio.Reader, bodies []string, handoffs, served uint64) {
	t.Helper()
	for _, want := range bodies {
		if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || body != want {
			t.Fatalf("%d %q, want %q", resp.StatusCode, body, want)
		}
	}
	if n := h.p.stats.handoffs.total(pathLoop); n != handoffs {
		t.Errorf("%d connections handed to goroutines, want %d", n, handoffs)
	}
	if n := h.p.loops.served.Load(); n != served {
		t.Errorf("the loops served %d requests, want %d", n, served)
	}
}

// A client that does not read: the proxy's writes fill its socket and
// wait (EPOLLOUT), the upstream is not read meanwhile, and every byte
// arrives when the client reads.
func TestEventLoopPartialWrites(t *testing.T) {
	skipWithoutLoop(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 512<<10) // 8 MiB
	b := startBackend(t, "big", "127.0.9.3", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		w.Write(big)
	})
	h := loopHarness(t, b)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(frontend.ip)}, Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReaderSize(conn, 1024)
	for i := 0; i < 2; i++ {
		conn.Write([]byte("GET /big HTTP/1.1\r\nHost: big\r\n\r\n"))
		time.Sleep(200 * time.Millisecond) // the proxy's writes meet a full socket
		resp, body := readResponse(t, br, "GET")
		if resp.StatusCode != 200 || body != string(big) {
			t.Fatalf("request %d: %d, %d bytes, want %d", i, resp.StatusCode, len(body), len(big))
		}
	}
	if n := h.p.loops.served.Load(); n != 2 {
		t.Errorf("the loops served %d requests, want 2", n)
	}
}

// A chunked response written in awkward pieces (a chunk line split, the
// CRLF after data split, trailers) passes whole, and the connection
// stays for the next request.
func TestEventLoopChunkedInPieces(t *testing.T) {
	skipWithoutLoop(t)
	pieces := []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n", "5", "\r\nhel", "lo\r", "\n6;ext=1\r\n wor", "ld\r\n0\r\nX-Sum: 11", "\r\n\r\n"}
	addr := scriptBackend(t, "127.0.9.4", func(c net.Conn, req *http.Request) {
		for _, p := range pieces {
			c.Write([]byte(p))
			time.Sleep(5 * time.Millisecond)
		}
	})
	h := loopHarness(t, &testBackend{name: "pieces", addr: addr})
	conn, br := rawClient(t, h, frontend)
	for i := 0; i < 3; i++ {
		conn.Write([]byte("GET / HTTP/1.1\r\nHost: pieces\r\n\r\n"))
		resp, body := readResponse(t, br, "GET")
		if resp.StatusCode != 200 || body != "hello world" || resp.Trailer.Get("X-Sum") != "11" {
			t.Fatalf("request %d: %d %q trailer %v", i, resp.StatusCode, body, resp.Trailer)
		}
	}
	if n := h.p.loops.served.Load(); n != 3 {
		t.Errorf("the loops served %d requests, want 3", n)
	}
}

func TestChunkScanner(t *testing.T) {
	body := "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Sum: 11\r\n\r\n"
	for split := 1; split <= len(body); split++ {
		var s chunkScanner
		passed, done := 0, false
		for pos := 0; pos < len(body) && !done; pos += split {
			piece := []byte(body[pos:min(pos+split, len(body))])
			if pos+split >= len(body) {
				piece = append(piece, "NEXT"...) // what follows the body is not taken
			}
			n, d, err := s.scan(piece)
			if err != nil {
				t.Fatalf("split %d: %v", split, err)
			}
			if !d && n != len(piece) {
				t.Fatalf("split %d: took %d of a %d-byte piece before the end", split, n, len(piece))
			}
			passed, done = passed+n, d
		}
		if !done || passed != len(body) {
			t.Fatalf("split %d: passed %d of %d, done %v", split, passed, len(body), done)
		}
	}
	for _, bad := range []string{"zz\r\n", "5\nhello", "5\r\nhelloXY", "0\r\nX: 1\n"} {
		var s chunkScanner
		if _, _, err := s.scan([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	var s chunkScanner
	if _, _, err := s.scan(bytes.Repeat([]byte("1"), maxChunkLine+1)); err == nil {
		t.Error("a chunk line longer than maxChunkLine: no error")
	}
}

// An upstream that closes in the middle of a response: the client gets
// what came and its connection closed (it cannot tell the end otherwise),
// the flow says upstream-error; the proxy serves on.
func TestEventLoopUpstreamClosingMidResponse(t *testing.T) {
	skipWithoutLoop(t)
	addr := scriptBackend(t, "127.0.9.5", func(c net.Conn, req *http.Request) {
		if req.URL.Path == "/ok" {
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
			return
		}
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"))
		time.Sleep(20 * time.Millisecond)
		c.Close()
	})
	h := loopHarness(t, &testBackend{name: "cut", addr: addr})
	conn, br := rawClient(t, h, frontend)
	conn.Write([]byte("GET /cut HTTP/1.1\r\nHost: cut\r\n\r\n"))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if string(got) != "0123456789" || err != io.ErrUnexpectedEOF {
		t.Errorf("body %q %v, want the 10 bytes that came and an unexpected EOF", got, err)
	}
	fl := h.nextFlow()
	if fl.Reason != "upstream-error" || fl.HTTP.Status != 200 || !strings.Contains(fl.HTTP.Error, "broke off") {
		t.Errorf("flow %+v %+v", fl, fl.HTTP)
	}
	// Before the head: 502, and the connection stays.
	addr2 := scriptBackend(t, "127.0.9.6", func(c net.Conn, req *http.Request) { c.Write([]byte("HTTP/1.1 200")); c.Close() })
	h2 := loopHarness(t, &testBackend{name: "half", addr: addr2})
	conn2, br2 := rawClient(t, h2, frontend)
	for i := 0; i < 2; i++ {
		conn2.Write([]byte("POST /x HTTP/1.1\r\nHost: half\r\nContent-Length: 1\r\n\r\nx"))
		if resp, body := readResponse(t, br2, "POST"); resp.StatusCode != http.StatusBadGateway {
			t.Errorf("a head cut short: %d %q, want 502", resp.StatusCode, body)
		}
		if fl := h2.nextFlow(); fl.Reason != "upstream-error" || fl.HTTP.Status != http.StatusBadGateway {
			t.Errorf("flow %+v %+v", fl, fl.HTTP)
		}
	}
	if code, body := get(t, h.client(frontend, false), "GET", "http://cut/ok"); code != 200 || body != "ok" {
		t.Errorf("after: %d %q", code, body)
	}
}

// A client that leaves while its request waits for the upstream: a
// client-gone flow without a status, the upstream connection closed.
func TestEventLoopClientClosingBeforeTheResponse(t *testing.T) {
	skipWithoutLoop(t)
	arrived := make(chan struct{}, 1)
	gone := make(chan struct{})
	b := startBackend(t, "wait", "127.0.9.7", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // the proxy closed the upstream connection
		close(gone)
	})
	h := loopHarness(t, b)
	conn, _ := rawClient(t, h, frontend)
	conn.Write([]byte("GET /wait HTTP/1.1\r\nHost: wait\r\n\r\n"))
	<-arrived
	conn.Close()
	fl := h.nextFlow()
	if fl.Reason != "client-gone" || fl.HTTP.Status != 0 {
		t.Errorf("flow %+v %+v", fl, fl.HTTP)
	}
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Error("the upstream request went on after the client left")
	}
	for deadline := time.Now().Add(5 * time.Second); h.p.loops.live() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections left in the loops", h.p.loops.live())
		}
	}
}

// Many clients at once, each with several requests: every answer right,
// and every connection accounted for once they close.
func TestEventLoopManyConnections(t *testing.T) {
	skipWithoutLoop(t)
	b := echoBackend(t, "echo", "127.0.9.8")
	h := loopHarness(t, b)
	const clients, each = 200, 5
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(frontend.ip)}}
			conn, err := d.Dial("tcp", h.addr)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(conn)
			for j := 0; j < each; j++ {
				path := fmt.Sprintf("/c%d/r%d", i, j)
				fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: echo\r\n\r\n", path)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					errs <- err
					return
				}
				body, _ := io.ReadAll(resp.Body)
				if string(body) != path {
					errs <- fmt.Errorf("%s: got %q", path, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := h.p.loops.served.Load(); n != clients*each {
		t.Errorf("the loops served %d requests, want %d", n, clients*each)
	}
	for deadline := time.Now().Add(5 * time.Second); h.p.loops.live() != 0 || h.p.Status().ActiveConnections != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections left in the loops, %d active", h.p.loops.live(), h.p.Status().ActiveConnections)
		}
	}
}

// A service whose route has a timeout or retries is served by goroutines
// (the loop has no timers), and the rest of the table by the loop.
func TestEventLoopLeavesTimedRoutesToGoroutines(t *testing.T) {
	skipWithoutLoop(t)
	b := echoBackend(t, "echo", "127.0.9.9")
	cfg := echoConfig(b)
	cfg.Services = append(cfg.Services, svcPort("default/timed", "10.96.0.81", 80, b))
	cfg.Routes = []proxyapi.Route{{Name: "default/timed", Parents: []proxyapi.ParentRef{{Service: "default/timed"}},
		Rules: []proxyapi.RouteRule{{Timeout: proxyapi.Duration(time.Second),
			Backends: []proxyapi.RouteBackend{{Service: "default/timed", Port: 80, Weight: 1}}}}}}
	h := newHarness(t, cfg)
	h.dials(frontend, "10.96.0.81:80")
	if code, body := get(t, h.client(frontend, false), "GET", "http://timed/t"); code != 200 || body != "/t" {
		t.Fatalf("timed route: %d %q", code, body)
	}
	if h.p.loops.served.Load() != 0 || h.p.stats.handoffs.total(pathLoop) != 1 {
		t.Errorf("loops served %d, handed %d, want 0 and 1", h.p.loops.served.Load(), h.p.stats.handoffs.total(pathLoop))
	}
}
