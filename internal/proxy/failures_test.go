package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// failuresHarness: services whose requests fail in every way the proxy must
// answer and record.
//
//	10.96.0.50:80 route: half to v1, half to an unresolved backendRef
//	10.96.0.51:80 dead: its only backend refuses connections
//	10.96.0.52:80 route with a 200ms timeout to a backend that sleeps
//	10.96.0.53:80 route with retries to a backend that fails twice
//	10.96.0.54:80 route matching only /api
//	10.96.0.55:80 no ready endpoint
//	10.96.0.56:80 a backend that resets the connection
func failuresHarness(t *testing.T) (*harness, *atomic.Int32) {
	v1 := startBackend(t, "v1", "127.0.2.1", nil)
	slow := startBackend(t, "slow", "127.0.2.2", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
	})
	var calls atomic.Int32
	flaky := startBackend(t, "flaky", "127.0.2.3", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if calls.Add(1)%3 != 0 {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "flaky got %q", body)
	})
	reset := startBackend(t, "reset", "127.0.2.4", func(w http.ResponseWriter, r *http.Request) {
		c, _, _ := http.NewResponseController(w).Hijack()
		c.Close()
	})
	dead := &testBackend{name: "dead", addr: netip.MustParseAddrPort("127.0.2.9:1")} // nothing listens
	route := func(name, svc string, rule proxyapi.RouteRule) proxyapi.Route {
		return proxyapi.Route{Name: name, Parents: []proxyapi.ParentRef{{Service: svc}}, Rules: []proxyapi.RouteRule{rule}}
	}
	to := func(svc string, weight int32) proxyapi.RouteBackend {
		return proxyapi.RouteBackend{Service: svc, Port: 80, Weight: weight}
	}
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(v1, slow, flaky, reset),
		Services: []proxyapi.Service{
			svcPort("default/split", "10.96.0.50", 80),
			svcPort("default/v1", "10.96.0.60", 80, v1),
			svcPort("default/dead", "10.96.0.51", 80, dead),
			svcPort("default/slow", "10.96.0.52", 80, slow),
			svcPort("default/flaky", "10.96.0.53", 80, flaky),
			svcPort("default/api", "10.96.0.54", 80, v1),
			svcPort("default/empty", "10.96.0.55", 80),
			svcPort("default/reset", "10.96.0.56", 80, reset),
		},
		Routes: []proxyapi.Route{
			route("default/split", "default/split", proxyapi.RouteRule{Backends: []proxyapi.RouteBackend{to("default/v1", 1),
				{Service: "default/missing", Port: 80, Weight: 1, Unresolved: "service default/missing not found"}}}),
			route("default/slow", "default/slow", proxyapi.RouteRule{Timeout: proxyapi.Duration(200 * time.Millisecond),
				Backends: []proxyapi.RouteBackend{to("default/slow", 1)}}),
			route("default/flaky", "default/flaky", proxyapi.RouteRule{Retry: &proxyapi.Retry{Codes: []int{503}, Attempts: 2},
				Backends: []proxyapi.RouteBackend{to("default/flaky", 1)}}),
			route("default/api", "default/api", proxyapi.RouteRule{
				Matches:  []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: "/api"}}},
				Backends: []proxyapi.RouteBackend{to("default/api", 1)}}),
		},
	})
	return h, &calls
}

func TestUnresolvedBackendGetsItsShareOf500(t *testing.T) {
	h, _ := failuresHarness(t)
	h.dials(frontend, "10.96.0.50:80")
	c := h.client(frontend, false)
	got := map[int]int{}
	for i := 0; i < 100; i++ {
		code, body := get(t, c, "GET", "http://split/")
		got[code]++
		if code == 500 && body != "route default/split: service default/missing not found\n" {
			t.Errorf("500 body %q", body)
		}
	}
	if got[200] != 50 || got[500] != 50 {
		t.Errorf("100 requests: %v, want 50 answered and 50 500s", got)
	}
	var dropped int
	for i := 0; i < 100; i++ {
		if fl := h.nextFlow(); fl.DropReason == "backend-unresolved" && fl.HTTP.Status == 500 && fl.Verdict == "DROPPED" {
			dropped++
		}
	}
	if dropped != 50 {
		t.Errorf("%d flows of unresolved backends, want 50", dropped)
	}
}

func TestUpstreamUnreachableIs503WithAFlow(t *testing.T) {
	h, _ := failuresHarness(t)
	h.dials(frontend, "10.96.0.51:80")
	code, body := get(t, h.client(frontend, false), "GET", "http://dead/x")
	if code != 503 || !strings.Contains(body, "upstream connection failed") || !strings.Contains(body, "127.0.2.9:1") {
		t.Errorf("got %d %q, want 503 saying the upstream connection failed", code, body)
	}
	fl := h.nextFlow()
	if fl.HTTP.Status != 503 || fl.Reason != "upstream-unreachable" || !strings.Contains(fl.HTTP.Error, "connection refused") ||
		fl.HTTP.Backend != "127.0.2.9:1" || fl.Verdict != "FORWARDED" {
		t.Errorf("flow %+v %+v", fl, fl.HTTP)
	}
}

func TestRouteTimeoutIs504WithAFlow(t *testing.T) {
	h, _ := failuresHarness(t)
	h.dials(frontend, "10.96.0.52:80")
	start := time.Now()
	code, body := get(t, h.client(frontend, false), "GET", "http://slow/")
	if took := time.Since(start); code != 504 || took > 2*time.Second || !strings.Contains(body, "timeout") {
		t.Errorf("got %d %q after %s, want 504 after the route's 200ms", code, body, took)
	}
	fl := h.nextFlow()
	if fl.HTTP.Status != 504 || fl.Reason != "upstream-timeout" || fl.HTTP.LatencyMicros < 200000 || fl.HTTP.Route != "default/slow" {
		t.Errorf("flow %+v %+v", fl, fl.HTTP)
	}
}

func TestRetriesReplayTheBody(t *testing.T) {
	h, calls := failuresHarness(t)
	h.dials(frontend, "10.96.0.53:80")
	req, _ := http.NewRequest("POST", "http://flaky/", strings.NewReader("hello"))
	resp, err := h.client(frontend, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != `flaky got "hello"` || calls.Load() != 3 {
		t.Errorf("got %d %q after %d calls, want the third attempt's answer with the body", resp.StatusCode, body, calls.Load())
	}
	// A streamed body (no length) cannot be replayed: one attempt.
	req, _ = http.NewRequest("POST", "http://flaky/", io.MultiReader(strings.NewReader("stream")))
	resp, err = h.client(frontend, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || calls.Load() != 4 {
		t.Errorf("streamed body: %d after %d calls, want the first attempt's 503", resp.StatusCode, calls.Load())
	}
}

func TestAnswersWithoutABackend(t *testing.T) {
	h, _ := failuresHarness(t)
	for _, c := range []struct {
		dst, path string
		code      int
		reason    string
	}{
		{"10.96.0.54:80", "/apix", 404, "route-no-match"},
		{"10.96.0.54:80", "/api/v1", 200, "forwarded"},
		{"10.96.0.55:80", "/", 503, "no-endpoints"},
		{"10.96.0.55:81", "/", 503, "no-service-port"},
		{"10.96.0.56:80", "/", 502, "upstream-error"},
	} {
		h.dials(frontend, c.dst)
		code, body := get(t, h.client(frontend, false), "GET", "http://svc"+c.path)
		if fl := h.nextFlow(); code != c.code || fl.Reason != c.reason {
			t.Errorf("%s%s: %d %q (flow reason %s), want %d (%s)", c.dst, c.path, code, body, fl.Reason, c.code, c.reason)
		}
	}
}

func TestClientGoneIsAFlow(t *testing.T) {
	h, _ := failuresHarness(t)
	h.dials(frontend, "10.96.0.52:80")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://slow/", nil)
	if _, err := h.client(frontend, false).Do(req); err == nil {
		t.Fatal("the request did not time out at the client")
	}
	fl := h.nextFlow()
	if fl.HTTP.Status != 0 || fl.Reason != "client-gone" || !strings.Contains(fl.HTTP.Error, "client went away") {
		t.Errorf("flow %+v %+v", fl, fl.HTTP)
	}
}
