package proxy

import (
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// Hand-offs are counted by path and reason on the proxy's registry: a
// chunked request leaves the event loop and then the goroutine's fast path
// (neither takes a chunked body: not-plain), a route whose filter only
// net/http applies leaves both too (filters); two requests in one read
// (pipelined), a head or a body in two writes (head-in-pieces,
// body-in-pieces) and a route with a timeout (timers) leave the loop only.
func TestHandoffMetrics(t *testing.T) {
	if netHTTPOnly {
		t.Skip("no fast path (SHUNT_PROXY_NET_HTTP_ONLY=1): nothing is handed off")
	}
	loop := !noEventLoop
	if loop {
		t.Setenv("SHUNT_PROXY_EVENT_LOOPS", "1")
	}
	b := echoBackend(t, "echo", "127.0.9.21")
	cfg := echoConfig(b)
	to := []proxyapi.RouteBackend{{Service: "default/echo", Port: 80, Weight: 1}}
	cfg.Services = append(cfg.Services, svcPort("default/filtered", "10.96.0.81", 80, b), svcPort("default/timed", "10.96.0.82", 80, b))
	cfg.Routes = []proxyapi.Route{
		{Name: "default/filtered", Parents: []proxyapi.ParentRef{{Service: "default/filtered"}}, Rules: []proxyapi.RouteRule{{Backends: to,
			// A hop-by-hop header: no fast equivalent (headedit.go).
			Filters: &proxyapi.Filters{RequestHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "Keep-Alive", Value: "timeout=5"}}}}}}},
		{Name: "default/timed", Parents: []proxyapi.ParentRef{{Service: "default/timed"}}, Rules: []proxyapi.RouteRule{{Backends: to,
			Timeout: proxyapi.Duration(10 * time.Second)}}},
	}
	h := newHarness(t, cfg)
	h.dials(frontend, "10.96.0.80:80")

	conn, br := rawClient(t, h, frontend)
	conn.Write([]byte("POST /c HTTP/1.1\r\nHost: echo\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"))
	if resp, body := readResponse(t, br, "POST"); resp.StatusCode != 200 || !strings.HasPrefix(body, "2 ") {
		t.Fatalf("chunked POST: %d %q", resp.StatusCode, body)
	}
	conn, br = rawClient(t, h, frontend)
	conn.Write([]byte("GET /one HTTP/1.1\r\nHost: echo\r\n\r\nGET /two HTTP/1.1\r\nHost: echo\r\n\r\n"))
	for _, want := range []string{"/one", "/two"} {
		if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || body != want {
			t.Fatalf("pipelined: %d %q, want %q", resp.StatusCode, body, want)
		}
	}
	conn, br = rawClient(t, h, frontend)
	conn.Write([]byte("GET /pieces HTTP/1.1\r\n"))
	time.Sleep(50 * time.Millisecond) // the loop reads the first piece alone
	conn.Write([]byte("Host: echo\r\n\r\n"))
	if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || body != "/pieces" {
		t.Fatalf("head in pieces: %d %q", resp.StatusCode, body)
	}

	conn, br = rawClient(t, h, frontend)
	conn.Write([]byte("POST /body HTTP/1.1\r\nHost: echo\r\nContent-Length: 4\r\n\r\nhi"))
	time.Sleep(50 * time.Millisecond) // the loop reads the head and half the body alone
	conn.Write([]byte("hi"))
	if resp, body := readResponse(t, br, "POST"); resp.StatusCode != 200 || !strings.HasPrefix(body, "4 ") {
		t.Fatalf("body in pieces: %d %q", resp.StatusCode, body)
	}
	for _, vip := range []string{"10.96.0.81:80", "10.96.0.82:80"} {
		h.dials(frontend, vip)
		if code, body := get(t, h.client(frontend, false), "GET", "http://echo/routed"); code != 200 || body != "/routed" {
			t.Fatalf("through %s: %d %q", vip, code, body)
		}
	}

	want := map[string]float64{"fast/not-plain": 1, "fast/filters": 1}
	if loop {
		for _, r := range []string{"not-plain", "pipelined", "head-in-pieces", "body-in-pieces", "filters", "timers"} {
			want["loop/"+r] = 1
		}
	}
	got := gatherHandoffs(t, h)
	for path, reasons := range handoffReasonsOf {
		for _, r := range reasons {
			key := handoffPathNames[path] + "/" + handoffReasonNames[r]
			v, ok := got[key]
			if !ok {
				t.Errorf("shunt_proxy_handoffs_total{path=%q,reason=%q} is not exported", handoffPathNames[path], handoffReasonNames[r])
			} else if v != want[key] {
				t.Errorf("shunt_proxy_handoffs_total{%s} = %v, want %v", key, v, want[key])
			}
		}
	}
}

// gatherHandoffs reads shunt_proxy_handoffs_total from the proxy's
// registry, keyed "path/reason".
func gatherHandoffs(t *testing.T, h *harness) map[string]float64 {
	return gatherCounter(t, h, "shunt_proxy_handoffs_total", "path", "reason")
}

// gatherCounter reads a counter vector from the proxy's registry, keyed by
// the values of labels joined by "/".
func gatherCounter(t *testing.T, h *harness, name string, labels ...string) map[string]float64 {
	t.Helper()
	families, err := h.p.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			values := map[string]string{}
			for _, l := range m.GetLabel() {
				values[l.GetName()] = l.GetValue()
			}
			key := make([]string, len(labels))
			for i, l := range labels {
				key[i] = values[l]
			}
			out[strings.Join(key, "/")] = m.GetCounter().GetValue()
		}
	}
	return out
}
