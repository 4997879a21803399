package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// reviews: a GAMMA route on the reviews service splits 90/10 between
// reviews-v1 and reviews-v2, and sends canary requests to v2.
func reviewsHarness(t *testing.T) (*harness, *testBackend, *testBackend) {
	v1 := startBackend(t, "reviews-v1", "127.0.1.1", nil)
	v2 := startBackend(t, "reviews-v2", "127.0.1.2", nil)
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(v1, v2),
		Services: []proxyapi.Service{
			svcPort("default/reviews", "10.96.0.10", 9080, v1, v2),
			svcPort("default/reviews-v1", "10.96.0.11", 9080, v1),
			svcPort("default/reviews-v2", "10.96.0.12", 9080, v2),
		},
		Routes: []proxyapi.Route{{Name: "default/reviews", Parents: []proxyapi.ParentRef{{Service: "default/reviews"}},
			Rules: []proxyapi.RouteRule{
				{Matches: []proxyapi.Match{{Headers: []proxyapi.HeaderMatch{{Name: "x-canary", Value: "true"}}}},
					Backends: []proxyapi.RouteBackend{{Service: "default/reviews-v2", Port: 9080, Weight: 1}}},
				{Backends: []proxyapi.RouteBackend{
					{Service: "default/reviews-v1", Port: 9080, Weight: 90},
					{Service: "default/reviews-v2", Port: 9080, Weight: 10},
				}},
			}}},
	})
	h.dials(frontend, "10.96.0.10:9080")
	return h, v1, v2
}

func TestWeightsHoldPerRequestOnOneConnection(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		name := map[bool]string{false: "HTTP/1.1", true: "h2c"}[h2c]
		t.Run(name, func(t *testing.T) {
			h, _, _ := reviewsHarness(t)
			c := h.client(frontend, h2c)
			got := map[string]int{}
			for i := 0; i < 2000; i++ {
				code, body := get(t, c, "GET", "http://reviews:9080/reviews/1")
				got[body]++
				if code != http.StatusOK {
					t.Fatalf("request %d: %d %q", i, code, body)
				}
				if i == 9 && (got["reviews-v1"] != 9 || got["reviews-v2"] != 1) {
					t.Errorf("the first 10 requests: %v, want 9/1", got)
				}
			}
			if got["reviews-v1"] != 1800 || got["reviews-v2"] != 200 {
				t.Errorf("2000 requests: %v, want exactly 1800/200", got)
			}
			if n := h.p.Status().Connections; n != 1 {
				t.Errorf("the client used %d connections, want 1 (keep-alive)", n)
			}
		})
	}
}

func TestHeaderMatchOverridesWeights(t *testing.T) {
	h, _, _ := reviewsHarness(t)
	c := h.client(frontend, false)
	for i := 0; i < 50; i++ {
		if code, body := get(t, c, "GET", "http://reviews:9080/", "X-Canary", "true"); code != 200 || body != "reviews-v2" {
			t.Fatalf("canary request %d: %d %q, want reviews-v2", i, code, body)
		}
	}
	for i := 0; i < 10; i++ {
		h.nextFlow()
	}
	fl := h.nextFlow()
	if fl.HTTP == nil || fl.HTTP.Route != "default/reviews" || fl.HTTP.BackendPod != "default/reviews-v2" ||
		fl.Service == nil || fl.Service.Name != "default/reviews:9080" || fl.Source.Pod != "default/frontend" ||
		fl.Verdict != "FORWARDED" || fl.HTTP.Status != 200 || fl.Protocol != "HTTP" || fl.HTTP.Protocol != "HTTP/1.1" {
		t.Errorf("flow %+v %+v", fl, fl.HTTP)
	}
	if !strings.HasPrefix(fl.HTTP.Backend, "127.0.1.2:") {
		t.Errorf("flow backend %q, want reviews-v2's address", fl.HTTP.Backend)
	}
}
