package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// The fast path's own cases, each run on both paths (onPaths) so the two
// answer alike; the rest of the suite runs on the fast path by default and
// on net/http's with SHUNT_PROXY_NET_HTTP_ONLY=1.

// rawClient is a connection from c's address to the proxy, for requests
// written byte by byte.
func rawClient(t *testing.T, h *harness, c client) (net.Conn, *bufio.Reader) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(c.ip)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { conn.Close() })
	return conn, bufio.NewReader(conn)
}

func readResponse(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading a response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading a response body: %v", err)
	}
	return resp, string(b)
}

// echoBackend answers the path, and for POST the body's length and hash.
func echoBackend(t *testing.T, name, ip string) *testBackend {
	return startBackend(t, name, ip, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			hash := sha256.New()
			n, _ := io.Copy(hash, r.Body)
			fmt.Fprintf(w, "%d %x", n, hash.Sum(nil))
			return
		}
		fmt.Fprint(w, r.URL.Path)
	})
}

func echoConfig(b *testBackend) proxyapi.Config {
	return proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(b),
		Services: []proxyapi.Service{svcPort("default/echo", "10.96.0.80", 80, b)}}
}

func TestFastPathTakesPlainHTTP11AndHandsOffTheRest(t *testing.T) {
	if netHTTPOnly {
		t.Skip("the fast path is off (SHUNT_PROXY_NET_HTTP_ONLY=1)")
	}
	b := echoBackend(t, "echo", "127.0.7.1")
	h := newHarness(t, echoConfig(b))
	h.dials(frontend, "10.96.0.80:80")
	for i := 0; i < 3; i++ {
		if code, body := get(t, h.client(frontend, false), "GET", "http://echo/x"); code != 200 || body != "/x" {
			t.Fatalf("GET: %d %q", code, body)
		}
	}
	if n := h.p.stats.handoffs.total(pathFast); n != 0 {
		t.Fatalf("%d plain HTTP/1.1 connections handed to net/http, want 0", n)
	}
	for _, c := range []struct {
		name, req string
		want      int
	}{
		{"HTTP/1.0", "GET /a HTTP/1.0\r\nHost: echo\r\n\r\n", 200},
		{"Expect", "POST /a HTTP/1.1\r\nHost: echo\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi", 200},
		{"chunked request body", "POST /a HTTP/1.1\r\nHost: echo\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 200},
		{"absolute-form", "GET http://echo/a HTTP/1.1\r\nHost: echo\r\n\r\n", 200},
		{"no Host", "GET /a HTTP/1.1\r\n\r\n", 400},
		{"bare LF", "GET /a HTTP/1.1\nHost: echo\n\n", 200},
		{"obsolete folding", "GET /a HTTP/1.1\r\nHost: echo\r\nX-A: 1\r\n 2\r\n\r\n", 200},
	} {
		before := h.p.stats.handoffs.total(pathFast)
		conn, br := rawClient(t, h, frontend)
		conn.Write([]byte(c.req))
		resp, body := readResponse(t, br, "GET")
		if resp.StatusCode == http.StatusContinue {
			resp, body = readResponse(t, br, "GET")
		}
		if resp.StatusCode != c.want {
			t.Errorf("%s: %d %q, want %d from net/http", c.name, resp.StatusCode, body, c.want)
		}
		if h.p.stats.handoffs.total(pathFast) != before+1 {
			t.Errorf("%s: not handed to net/http", c.name)
		}
	}
	// h2c (prior knowledge) goes to net/http too.
	if code, _ := get(t, h.client(frontend, true), "GET", "http://echo/h2"); code != 200 {
		t.Errorf("h2c: %d", code)
	}
}

// Both paths record the same flows for the same requests: forwarded,
// split, refused by a route, by the L7 policy and for want of endpoints.
func TestBothPathsRecordTheSameFlows(t *testing.T) {
	v1 := startBackend(t, "v1", "127.0.7.2", nil)
	v2 := startBackend(t, "v2", "127.0.7.3", nil)
	cfg := proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(v1, v2),
		Services: []proxyapi.Service{
			svcPort("default/web", "10.96.0.81", 80, v1, v2),
			svcPort("default/v1", "10.96.0.82", 80, v1),
			svcPort("default/v2", "10.96.0.83", 80, v2),
			svcPort("default/empty", "10.96.0.84", 80),
		},
		Routes: []proxyapi.Route{{Name: "default/web", Parents: []proxyapi.ParentRef{{Service: "default/web"}},
			Rules: []proxyapi.RouteRule{{
				Matches:  []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: "/api"}}},
				Backends: []proxyapi.RouteBackend{{Service: "default/v1", Port: 80, Weight: 3}, {Service: "default/v2", Port: 80, Weight: 1}},
			}}}},
		Policies: []proxyapi.PortPolicy{{Endpoint: v2.addr.Addr().String(), Port: v2.addr.Port(), Isolated: true, Rules: []proxyapi.L7Rule{
			{Name: "ShuntNetworkPolicy default/v2-http ingress[0] (allow)", Action: "allow", Identities: []uint32{frontend.identity},
				HTTP: []proxyapi.HTTPRule{{Method: "GET", Path: "/api/open"}}},
		}}},
	}
	requests := []struct{ dst, method, path string }{
		// The 3:1 split picks v1, v1, v2, v1, then again.
		{"10.96.0.81:80", "GET", "/api/open"}, {"10.96.0.81:80", "GET", "/api/open?q=1"},
		{"10.96.0.81:80", "GET", "/api/closed"}, {"10.96.0.81:80", "GET", "/api/closed"},
		{"10.96.0.81:80", "POST", "/api/x"}, {"10.96.0.81:80", "GET", "/other"},
		{"10.96.0.84:80", "GET", "/"}, {"127.0.7.99:1", "GET", "/"},
		{v2.addr.String(), "DELETE", "/api/open"}, {v1.addr.String(), "GET", "/direct"},
	}
	record := func(t *testing.T) []flows.Flow {
		h := newHarness(t, cfg)
		var got []flows.Flow
		for _, r := range requests {
			h.dials(frontend, r.dst)
			get(t, h.client(frontend, false), r.method, "http://web"+r.path)
			fl := h.nextFlow()
			// What differs from run to run: time, latency, the client's port.
			fl.Time, fl.HTTP.LatencyMicros, fl.Source.Port = time.Time{}, 0, 0
			got = append(got, fl)
		}
		if h.p.stats.handoffs.total(pathFast) != 0 {
			t.Errorf("%d connections handed to net/http", h.p.stats.handoffs.total(pathFast))
		}
		return got
	}
	var byPath [2][]flows.Flow
	onPaths(t, func(t *testing.T) {
		byPath[map[bool]int{false: 0, true: 1}[netHTTPOnly]] = record(t)
	})
	fast, std := byPath[0], byPath[1]
	if len(fast) != len(requests) || len(std) != len(requests) {
		t.Fatalf("flows: %d fast, %d net/http, want %d each", len(fast), len(std), len(requests))
	}
	statuses := ""
	for i := range requests {
		statuses += strconv.Itoa(fast[i].HTTP.Status) + " "
		if !reflect.DeepEqual(fast[i], std[i]) || !reflect.DeepEqual(*fast[i].HTTP, *std[i].HTTP) ||
			!reflect.DeepEqual(fast[i].Service, std[i].Service) {
			t.Errorf("request %d %+v:\nfast     %+v %+v %+v\nnet/http %+v %+v %+v", i, requests[i],
				fast[i], *fast[i].HTTP, fast[i].Service, std[i], *std[i].HTTP, std[i].Service)
		}
	}
	if want := "200 200 403 200 200 404 503 503 403 200 "; statuses != want {
		t.Errorf("statuses %q, want %q", statuses, want)
	}
}

func TestPipelinedRequests(t *testing.T) {
	onPaths(t, func(t *testing.T) {
		b := echoBackend(t, "echo", "127.0.7.4")
		h := newHarness(t, echoConfig(b))
		h.dials(frontend, "10.96.0.80:80")
		conn, br := rawClient(t, h, frontend)
		var reqs bytes.Buffer
		for i := 0; i < 20; i++ {
			fmt.Fprintf(&reqs, "GET /r%d HTTP/1.1\r\nHost: echo\r\n\r\n", i)
		}
		fmt.Fprintf(&reqs, "POST /p HTTP/1.1\r\nHost: echo\r\nContent-Length: 5\r\n\r\nhello")
		fmt.Fprintf(&reqs, "HEAD /h HTTP/1.1\r\nHost: echo\r\n\r\nGET /last HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n")
		if _, err := conn.Write(reqs.Bytes()); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 20; i++ {
			if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || body != fmt.Sprintf("/r%d", i) {
				t.Fatalf("response %d: %d %q", i, resp.StatusCode, body)
			}
		}
		sum := sha256.Sum256([]byte("hello"))
		if resp, body := readResponse(t, br, "POST"); resp.StatusCode != 200 || body != fmt.Sprintf("5 %x", sum) {
			t.Errorf("POST: %d %q", resp.StatusCode, body)
		}
		if resp, body := readResponse(t, br, "HEAD"); resp.StatusCode != 200 || body != "" {
			t.Errorf("HEAD: %d %q", resp.StatusCode, body)
		}
		if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || body != "/last" || !resp.Close {
			t.Errorf("last: %d %q close=%v", resp.StatusCode, body, resp.Close)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("after Connection: close, the connection gave %v, want EOF", err)
		}
	})
}

func TestChunkedResponseWithTrailers(t *testing.T) {
	onPaths(t, func(t *testing.T) {
		b := startBackend(t, "chunky", "127.0.7.5", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			for i := 0; i < 5; i++ {
				fmt.Fprintf(w, "part%d;", i)
				w.(http.Flusher).Flush()
				time.Sleep(5 * time.Millisecond)
			}
			w.Header().Set("X-Sum", "5")
		})
		h := newHarness(t, echoConfig(b))
		h.dials(frontend, "10.96.0.80:80")
		conn, br := rawClient(t, h, frontend)
		for i := 0; i < 3; i++ { // keep-alive after a chunked body
			conn.Write([]byte("GET / HTTP/1.1\r\nHost: chunky\r\n\r\n"))
			resp, body := readResponse(t, br, "GET")
			if resp.StatusCode != 200 || body != "part0;part1;part2;part3;part4;" || resp.Trailer.Get("X-Sum") != "5" ||
				len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
				t.Fatalf("request %d: %d %q trailer %v encoding %v", i, resp.StatusCode, body, resp.Trailer, resp.TransferEncoding)
			}
		}
	})
}

// A streamed response reaches the client as it is written, not when it
// ends: the fast path flushes before it waits for the upstream.
func TestStreamedResponseIsNotHeldBack(t *testing.T) {
	onPaths(t, func(t *testing.T) {
		release := make(chan struct{})
		b := startBackend(t, "stream", "127.0.7.6", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "first;")
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprint(w, "second")
		})
		defer close(release)
		h := newHarness(t, echoConfig(b))
		h.dials(frontend, "10.96.0.80:80")
		conn, br := rawClient(t, h, frontend)
		conn.Write([]byte("GET / HTTP/1.1\r\nHost: stream\r\n\r\n"))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 6)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first;" {
			t.Fatalf("the first part: %q %v", buf, err)
		}
	})
}

func TestLargeBodies(t *testing.T) {
	onPaths(t, func(t *testing.T) {
		big := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB
		b := startBackend(t, "big", "127.0.7.7", func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				hash := sha256.New()
				n, _ := io.Copy(hash, r.Body)
				fmt.Fprintf(w, "%d %x", n, hash.Sum(nil))
				return
			}
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			w.Write(big)
		})
		h := newHarness(t, echoConfig(b))
		h.dials(frontend, "10.96.0.80:80")
		c := h.client(frontend, false)
		for i := 0; i < 2; i++ {
			code, body := get(t, c, "GET", "http://big/")
			if code != 200 || body != string(big) {
				t.Fatalf("GET %d: %d, %d bytes, want %d", i, code, len(body), len(big))
			}
			req, _ := http.NewRequest("POST", "http://big/", bytes.NewReader(big))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := fmt.Sprintf("%d %x", len(big), sha256.Sum256(big)); string(got) != want {
				t.Fatalf("POST %d: %q, want %q", i, got, want)
			}
		}
		if n := h.p.Status().Connections; n != 1 {
			t.Errorf("%d client connections, want 1 (kept alive through large bodies)", n)
		}
	})
}

// A client that leaves in the middle of a response: the flow says so, the
// upstream request ends, the proxy serves on.
func TestClientClosingMidResponse(t *testing.T) {
	onPaths(t, func(t *testing.T) {
		var ended atomic.Bool
		b := startBackend(t, "endless", "127.0.7.8", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/ok" {
				fmt.Fprint(w, "ok")
				return
			}
			chunk := bytes.Repeat([]byte("x"), 32<<10)
			for i := 0; i < 2000; i++ {
				if _, err := w.Write(chunk); err != nil {
					break
				}
				w.(http.Flusher).Flush()
				time.Sleep(time.Millisecond)
			}
			ended.Store(true)
		})
		h := newHarness(t, echoConfig(b))
		h.dials(frontend, "10.96.0.80:80")
		conn, br := rawClient(t, h, frontend)
		conn.Write([]byte("GET /endless HTTP/1.1\r\nHost: endless\r\n\r\n"))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(resp.Body, make([]byte, 100<<10)); err != nil {
			t.Fatal(err)
		}
		conn.Close()
		fl := h.nextFlow()
		if fl.Reason != "client-gone" || fl.HTTP.Status != 200 || !strings.Contains(fl.HTTP.Error, "went away") {
			t.Errorf("flow %+v %+v", fl, fl.HTTP)
		}
		for deadline := time.Now().Add(5 * time.Second); !ended.Load() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if !ended.Load() {
			t.Error("the upstream response went on after the client left")
		}
		if code, body := get(t, h.client(frontend, false), "GET", "http://endless/ok"); code != 200 || body != "ok" {
			t.Errorf("after: %d %q", code, body)
		}
	})
}

// rawBackend answers one request per connection and closes it without
// saying Connection: close, as a backend whose keep-alive timeout struck.
func rawBackend(t *testing.T, ip string) (netip.AddrPort, *atomic.Int32) {
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				body, _ := io.ReadAll(req.Body)
				msg := req.Method + " " + req.URL.Path + " " + string(body)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String()), &conns
}

// A backend closing a kept-alive connection: a bodyless idempotent request
// is sent again on a new connection if it met the closed one (net/http's
// transport does the same); any other request is sent only on a connection
// seen open just before.
func TestBackendClosingKeepAlive(t *testing.T) {
	onPaths(t, func(t *testing.T) {
		addr, conns := rawBackend(t, "127.0.7.9")
		b := &testBackend{name: "closer", addr: addr}
		h := newHarness(t, echoConfig(b))
		h.dials(frontend, "10.96.0.80:80")
		c := h.client(frontend, false)
		for i := 0; i < 10; i++ {
			method, want := "GET", fmt.Sprintf("GET /%d ", i)
			var body io.Reader
			if i%2 == 1 {
				method, want, body = "POST", fmt.Sprintf("POST /%d data%d", i, i), strings.NewReader(fmt.Sprintf("data%d", i))
			}
			req, _ := http.NewRequest(method, fmt.Sprintf("http://closer/%d", i), body)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(got) != want {
				t.Errorf("request %d: %d %q, want 200 %q", i, resp.StatusCode, got, want)
			}
			time.Sleep(10 * time.Millisecond) // the backend's FIN arrives
		}
		if n := conns.Load(); n < 10 {
			t.Errorf("the backend saw %d connections for 10 requests", n)
		}
	})
}

func TestL7DenialIs403OnBothPaths(t *testing.T) {
	onPaths(t, func(t *testing.T) {
		h, _ := backendHarness(t, testMark)
		h.dials(frontend, "10.96.0.20:8080")
		conn, br := rawClient(t, h, frontend)
		// A denied POST with a body: the body is read away and the
		// connection serves the next request.
		conn.Write([]byte("POST /metrics HTTP/1.1\r\nHost: backend\r\nContent-Length: 4\r\n\r\nbodyGET /metrics HTTP/1.1\r\nHost: backend\r\n\r\n"))
		resp, body := readResponse(t, br, "POST")
		if resp.StatusCode != 403 || body != "no rule of ShuntNetworkPolicy default/backend-http allows POST /metrics\n" ||
			resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Errorf("denied: %d %q %v", resp.StatusCode, body, resp.Header)
		}
		if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || body != "backend" {
			t.Errorf("allowed next: %d %q", resp.StatusCode, body)
		}
		fl := h.nextFlow()
		if fl.Verdict != "DROPPED" || fl.DropReason != "policy-not-allowed" || fl.HTTP.Status != 403 || fl.Source.Identity != frontend.identity {
			t.Errorf("flow %+v %+v", fl, fl.HTTP)
		}
	})
}

func TestSplit90To10OnTheFastPath(t *testing.T) {
	if netHTTPOnly {
		t.Skip("the fast path is off (SHUNT_PROXY_NET_HTTP_ONLY=1)")
	}
	h, _, _ := reviewsHarness(t)
	conn, br := rawClient(t, h, frontend)
	got := map[string]int{}
	for i := 0; i < 1000; i++ {
		conn.Write([]byte("GET /reviews/1 HTTP/1.1\r\nHost: reviews\r\n\r\n"))
		_, body := readResponse(t, br, "GET")
		got[body]++
	}
	if got["reviews-v1"] != 900 || got["reviews-v2"] != 100 {
		t.Errorf("1000 requests: %v, want exactly 900/100", got)
	}
	if n := h.p.stats.handoffs.total(pathFast); n != 0 {
		t.Errorf("%d connections handed to net/http", n)
	}
}

// Shutdown closes an idle fast-path connection and waits for a busy one.
func TestShutdownClosesIdleFastConnections(t *testing.T) {
	b := echoBackend(t, "echo", "127.0.7.10")
	h := newHarness(t, echoConfig(b))
	h.dials(frontend, "10.96.0.80:80")
	conn, br := rawClient(t, h, frontend)
	conn.Write([]byte("GET /a HTTP/1.1\r\nHost: echo\r\n\r\n"))
	readResponse(t, br, "GET")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("the idle connection after shutdown: %v, want EOF", err)
	}
}

// agentFlows serves h's control API and reads its flows as the agent does
// (proxyapi.Client.Flows, in batches) until the test ends.
func agentFlows(t *testing.T, h *harness) (sock string, got <-chan flows.Flow) {
	sock = h.serveControl()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch := make(chan flows.Flow, 100)
	go proxyapi.NewClient(sock).Flows(ctx, func(fl flows.Flow) { ch <- fl })
	return sock, ch
}

// The agent reads /flows in batches (proxyapi.Client.Flows); shunt observe
// must see the same records as the JSON lines carry.
func TestFlowBatchesCarryWhatJSONDoes(t *testing.T) {
	h, _ := backendHarness(t, testMark)
	sock, batched := agentFlows(t, h)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://proxy/flows")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h.waitFlowReaders(3) // the harness's, the batch reader's, the JSON reader's
	h.dials(frontend, "10.96.0.20:8080")
	h.dials(monitoring, "10.96.0.20:8080")
	get(t, h.client(frontend, false), "GET", "http://backend/metrics")
	get(t, h.client(frontend, false), "GET", "http://backend/admin?x=1")
	get(t, h.client(monitoring, true), "POST", "http://backend/anything")
	dec := json.NewDecoder(resp.Body)
	for i := 0; i < 3; i++ {
		var fromJSON flows.Flow
		if err := dec.Decode(&fromJSON); err != nil {
			t.Fatal(err)
		}
		var fromBatch flows.Flow
		select {
		case fromBatch = <-batched:
		case <-time.After(5 * time.Second):
			t.Fatal("no batched flow")
		}
		if !fromJSON.Time.Equal(fromBatch.Time) {
			t.Errorf("record %d: time %v in JSON, %v in the batch", i, fromJSON.Time, fromBatch.Time)
		}
		fromJSON.Time, fromBatch.Time = time.Time{}, time.Time{}
		if !reflect.DeepEqual(fromJSON, fromBatch) {
			t.Errorf("record %d:\nJSON  %+v %+v\nbatch %+v %+v", i, fromJSON, *fromJSON.HTTP, fromBatch, *fromBatch.HTTP)
		}
	}
}

// An idle fast-path connection holds no buffer: thousands of idle
// keep-alive clients cost their goroutines, not 32 KiB each.
func TestIdleConnectionsHoldNoBuffers(t *testing.T) {
	if netHTTPOnly {
		t.Skip("the fast path is off (SHUNT_PROXY_NET_HTTP_ONLY=1)")
	}
	withoutEventLoop(t) // the goroutine path's own structures (the loop's: eventloop_test.go)
	b := echoBackend(t, "echo", "127.0.7.11")
	h := newHarness(t, echoConfig(b))
	h.dials(frontend, "10.96.0.80:80")
	for i := 0; i < 5; i++ {
		conn, br := rawClient(t, h, frontend)
		conn.Write([]byte("GET /a HTTP/1.1\r\nHost: echo\r\n\r\n"))
		readResponse(t, br, "GET")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		idle := 0
		h.p.fastConns.mu.Lock()
		for fc := range h.p.fastConns.m {
			if fc.idle.Load() {
				idle++
			}
		}
		h.p.fastConns.mu.Unlock()
		// An idle connection released its buffers before it said so.
		if holding := h.p.fastConns.buffered.Load(); idle == 5 {
			if holding != 0 {
				t.Errorf("%d of 5 idle connections hold buffers", holding)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 5 connections idle", idle)
		}
	}
}

// The sweep closes idle upstream connections their backend closed, which
// nothing reads while they wait in the pool.
func TestSweepClosesUpstreamConnectionsTheBackendClosed(t *testing.T) {
	if netHTTPOnly {
		t.Skip("the fast path is off (SHUNT_PROXY_NET_HTTP_ONLY=1)")
	}
	withoutEventLoop(t) // the goroutine path's own structures (the loop's: eventloop_test.go)
	addr, _ := rawBackend(t, "127.0.7.12")
	h := newHarness(t, echoConfig(&testBackend{name: "closer", addr: addr}))
	h.dials(frontend, "10.96.0.80:80")
	if code, _ := get(t, h.client(frontend, false), "GET", "http://closer/x"); code != 200 {
		t.Fatal(code)
	}
	mark, _ := testMark.For(frontend.identity)
	pool := h.p.up.get(mark, netip.Addr{}).fast
	idle := func() int {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return len(pool.idle[addr])
	}
	// The connection goes back to the pool just after the response's
	// last byte is written: the client can read it first.
	for deadline := time.Now().Add(5 * time.Second); idle() != 1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if n := idle(); n != 1 {
		t.Fatalf("%d idle upstream connections after a request, want 1", n)
	}
	time.Sleep(50 * time.Millisecond) // the backend's FIN arrives
	pool.closeExpired()
	if n := idle(); n != 0 {
		t.Errorf("%d idle upstream connections after the sweep, want 0 (the backend closed it)", n)
	}
}

// The /flows writer wakes once per interval while records keep coming and
// goes back to waiting for the first record when an interval brings none:
// records made in bursts, before and after such pauses, all reach the
// agent in order, and the per-request metrics (kept per route, backend and
// status after their first use) count each request once under its status.
func TestFlowsAndMetricsAcrossBatchPauses(t *testing.T) {
	h, _ := backendHarness(t, testMark)
	sock, got := agentFlows(t, h)
	h.waitFlowReaders(2) // the harness's and the agent's
	h.dials(frontend, "10.96.0.20:8080")
	hc := h.client(frontend, false)
	var want []string
	for burst, pause := range []time.Duration{0, 3 * flowBatchInterval, flowBatchInterval / 2, 3 * flowBatchInterval} {
		time.Sleep(pause)
		for i := range 3 {
			path := fmt.Sprintf("/metrics?burst=%d&i=%d", burst, i)
			if i == 2 {
				path = fmt.Sprintf("/admin?burst=%d", burst) // 403: policy
			}
			get(t, hc, "GET", "http://backend"+path)
			want = append(want, path)
		}
	}
	for i, path := range want {
		select {
		case fl := <-got:
			wantStatus := 200
			if strings.HasPrefix(path, "/admin") {
				wantStatus = 403
			}
			if p, _, _ := strings.Cut(path, "?"); fl.HTTP == nil || fl.HTTP.Path != p || fl.HTTP.Status != wantStatus {
				t.Errorf("record %d: %+v, want %s answered %d", i, fl.HTTP, p, wantStatus)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("record %d of %d (%s) never came", i, len(want), path)
		}
	}
	select {
	case fl := <-got:
		t.Errorf("a record no request made: %+v", fl.HTTP)
	case <-time.After(2 * flowBatchInterval):
	}
	text, err := proxyapi.NewClient(sock).MetricsText(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`shunt_proxy_http_requests_total{backend="default/backend:8080",code="200",route=""} 8`,
		`shunt_proxy_http_requests_total{backend="default/backend:8080",code="403",route=""} 4`,
		`shunt_proxy_http_request_duration_seconds_count{route=""} 12`,
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("metrics lack %s", line)
		}
	}
}
