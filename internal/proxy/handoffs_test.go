package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Hand-offs are counted by path and reason on the proxy's registry: a
// chunked request leaves the event loop and then the goroutine's fast path
// (neither takes a chunked body: not-plain), two requests in one read
// leave the loop (pipelined), a head in two writes leaves it too
// (head-in-pieces); the goroutine path serves those last two itself.
func TestHandoffMetrics(t *testing.T) {
	if netHTTPOnly {
		t.Skip("no fast path (SHUNT_PROXY_NET_HTTP_ONLY=1): nothing is handed off")
	}
	loop := !noEventLoop
	if loop {
		t.Setenv("SHUNT_PROXY_EVENT_LOOPS", "1")
	}
	h := loopHarness(t, echoBackend(t, "echo", "127.0.9.21"))

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

	want := map[string]float64{"fast/not-plain": 1}
	if loop {
		want["loop/not-plain"], want["loop/pipelined"], want["loop/head-in-pieces"] = 1, 1, 1
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
	t.Helper()
	families, err := h.p.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "shunt_proxy_handoffs_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[fmt.Sprintf("%s/%s", labels["path"], labels["reason"])] = m.GetCounter().GetValue()
		}
	}
	return out
}
