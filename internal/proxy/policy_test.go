package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// backendHarness: the backend pod's port has HTTP rules: frontend may GET
// /metrics, monitoring anything; the port is isolated.
func backendHarness(t *testing.T, mark proxyapi.Mark) (*harness, *testBackend) {
	b := startBackend(t, "backend", "127.0.1.3", nil)
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: mark, Endpoints: endpoints(b),
		Services: []proxyapi.Service{svcPort("default/backend", "10.96.0.20", 8080, b)},
		Policies: []proxyapi.PortPolicy{{Endpoint: b.addr.Addr().String(), Port: b.addr.Port(), Isolated: true, Rules: []proxyapi.L7Rule{
			{Name: "ShuntNetworkPolicy default/backend-http ingress[0] (allow)", Action: "allow", Identities: []uint32{frontend.identity},
				HTTP: []proxyapi.HTTPRule{{Method: "GET", Path: "/metrics"}}},
			{Name: "ShuntNetworkPolicy default/backend-http ingress[1] (allow)", Action: "allow", Identities: []uint32{monitoring.identity}},
		}}},
	})
	return h, b
}

func TestPolicyThroughServiceAndDirect(t *testing.T) {
	h, b := backendHarness(t, testMark)
	for _, dst := range []string{"10.96.0.20:8080", b.addr.String()} {
		h.dials(frontend, dst)
		h.dials(monitoring, dst)
		for _, c := range []struct {
			who          client
			method, path string
			want         int
		}{
			{frontend, "GET", "/metrics", 200},
			{frontend, "GET", "/admin", 403},
			{frontend, "POST", "/metrics", 403},
			{frontend, "GET", "/metrics/x", 403},
			{monitoring, "GET", "/admin", 200},
			{monitoring, "POST", "/metrics", 200},
		} {
			code, body := get(t, h.client(c.who, false), c.method, "http://backend:8080"+c.path)
			if code != c.want {
				t.Errorf("%s %s %s to %s: %d %q, want %d", c.who.pod, c.method, c.path, dst, code, body, c.want)
			}
			if code == 403 && body != "no rule of ShuntNetworkPolicy default/backend-http allows "+c.method+" "+c.path+"\n" {
				t.Errorf("403 body %q does not say which policy allows nothing", body)
			}
		}
	}
}

func TestDenialKeepsTheConnectionUsable(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		h, _ := backendHarness(t, testMark)
		h.dials(frontend, "10.96.0.20:8080")
		c := h.client(frontend, h2c)
		for i, want := range []int{403, 200, 403, 200} {
			path := map[int]string{403: "/admin", 200: "/metrics"}[want]
			if code, body := get(t, c, "GET", "http://backend:8080"+path); code != want {
				t.Fatalf("h2c %v request %d: %d %q, want %d", h2c, i, code, body, want)
			}
		}
		if n := h.p.Status().Connections; n != 1 {
			t.Errorf("h2c %v: %d connections, want the one kept across 403s", h2c, n)
		}
		fl := h.nextFlow()
		if fl.Verdict != "DROPPED" || fl.DropReason != "policy-not-allowed" || fl.HTTP.Status != 403 ||
			fl.Destination.Pod != "default/backend" || fl.Source.Identity != frontend.identity ||
			!strings.Contains(fl.HTTP.Error, "allows GET /admin") {
			t.Errorf("the 403's flow: %+v %+v", fl, fl.HTTP)
		}
		if fl := h.nextFlow(); fl.Verdict != "FORWARDED" || fl.Policy != "ShuntNetworkPolicy default/backend-http ingress[0] (allow)" {
			t.Errorf("the allowed request's flow: %+v", fl)
		}
	}
}

func TestClientsWithoutIdentityOrMarkRoom(t *testing.T) {
	h, _ := backendHarness(t, testMark)
	h.dials(stranger, "10.96.0.20:8080")
	if code, _ := get(t, h.client(stranger, false), "GET", "http://backend:8080/metrics"); code != 403 {
		t.Errorf("an unknown client (world): %d, want 403", code)
	}
	if fl := h.nextFlow(); fl.Source.Identity != identityWorld || fl.Source.Labels[0] != "reserved:world" {
		t.Errorf("unknown client flow source %+v", fl.Source)
	}
	// Identity 1002 (0x3ea) does not fit in the 8 bits outside a mask of 0xffffff00.
	h2, _ := backendHarness(t, proxyapi.Mark{Magic: 0x5e000000, Mask: 0xffffff00})
	h2.dials(monitoring, "10.96.0.20:8080")
	code, body := get(t, h2.client(monitoring, false), "GET", "http://backend:8080/")
	if code != http.StatusForbidden || !strings.Contains(body, "does not fit in the upstream mark") {
		t.Errorf("an identity the mark cannot carry: %d %q", code, body)
	}
	if fl := h2.nextFlow(); fl.DropReason != "identity-not-carried" {
		t.Errorf("flow %+v", fl)
	}
}
