package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// mirrorBackend records what each request brought and can hold its
// answers until released.
type mirrorBackend struct {
	mu     sync.Mutex
	got    []string      // "METHOD path host body x-client"
	hold   chan struct{} // nil: answer at once
	signal chan struct{} // one send per request seen
}

func (m *mirrorBackend) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	m.got = append(m.got, fmt.Sprintf("%s %s %s %s %s", r.Method, r.URL.RequestURI(), r.Host, body, r.Header.Get("X-Client")))
	m.mu.Unlock()
	m.signal <- struct{}{}
	if m.hold != nil {
		<-m.hold
	}
	fmt.Fprint(w, "mirror's answer, never the client's")
}

func (m *mirrorBackend) seen() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.got...)
}

// mirrorOutcomes reads shunt_proxy_mirrored_requests_total, keyed
// "route/mirror/outcome".
func mirrorOutcomes(t *testing.T, h *harness) map[string]float64 {
	return gatherCounter(t, h, "shunt_proxy_mirrored_requests_total", "route", "mirror", "outcome")
}

// A rule's RequestMirror sends a copy of each request, body included and
// with the rule's header changes, to the mirror Service; the client gets
// the backend's answer, without waiting for the mirror's, on every path
// (the fast paths hand such rules to net/http's). A streamed body is not
// copied, and a mirror share of 0 copies nothing; each outcome is counted.
func TestRequestMirror(t *testing.T) { onPaths(t, testRequestMirror) }

func testRequestMirror(t *testing.T) {
	echo := startBackend(t, "echo-v1", "127.0.1.1", nil)
	shadow := &mirrorBackend{hold: make(chan struct{}), signal: make(chan struct{}, 16)}
	mirror := startBackend(t, "shadow", "127.0.1.2", shadow.handle)
	never := &mirrorBackend{signal: make(chan struct{}, 16)}
	unused := startBackend(t, "unused", "127.0.1.3", never.handle)
	prefix := func(p string) []proxyapi.Match {
		return []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: p}}}
	}
	to := []proxyapi.RouteBackend{{Service: "default/echo-v1", Port: 8080, Weight: 1}}
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(echo, mirror, unused),
		Services: []proxyapi.Service{svcPort("default/echo", "10.96.0.10", 80, echo), svcPort("default/echo-v1", "10.96.0.11", 8080, echo),
			svcPort("default/shadow", "10.96.0.12", 8080, mirror), svcPort("default/unused", "10.96.0.13", 8080, unused)},
		Routes: []proxyapi.Route{{Name: "default/echo", Parents: []proxyapi.ParentRef{{Service: "default/echo"}},
			Rules: []proxyapi.RouteRule{
				{Matches: prefix("/mirrored"), Backends: to, Filters: &proxyapi.Filters{
					RequestHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-Client", Value: "rewritten"}}},
					Mirrors:        []proxyapi.Mirror{{Service: "default/shadow", Port: 8080, Percent: 100}, {Service: "default/unused", Port: 8080, Percent: 0}},
				}},
				{Backends: to},
			}}},
	})
	h.dials(frontend, "10.96.0.10:80")
	c := h.client(frontend, false)
	const route, toShadow, toUnused = "default/echo", "default/shadow:8080", "default/unused:8080"

	// The mirror holds its answer: the client's comes first all the same.
	resp, err := c.Post("http://echo/mirrored/a?q=1", "text/plain", strings.NewReader("the body"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "echo-v1" {
		t.Fatalf("POST /mirrored/a: %d %q, want the backend's 200 echo-v1", resp.StatusCode, body)
	}
	select {
	case <-shadow.signal:
	case <-time.After(5 * time.Second):
		t.Fatal("the mirror got no copy")
	}
	if got, want := shadow.seen(), []string{"POST /mirrored/a?q=1 echo the body rewritten"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the mirror saw %q, want %q", got, want)
	}
	if n := len(echo.requests()); n != 1 {
		t.Errorf("the backend saw %d requests, want 1", n)
	}
	close(shadow.hold)
	waitOutcome(t, h, route+"/"+toShadow+"/"+mirrorAnswered, 1)

	// A chunked body is not kept, so not copied; the request goes on.
	pr, pw := io.Pipe()
	go func() { pw.Write([]byte("streamed")); pw.Close() }()
	resp, err = c.Post("http://echo/mirrored/stream", "text/plain", pr)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST /mirrored/stream (chunked): %d, want 200", resp.StatusCode)
	}
	waitOutcome(t, h, route+"/"+toShadow+"/"+mirrorBodyNotKept, 1)

	// Other rules are not mirrored; a share of 0 never is.
	if code, body := get(t, c, "GET", "http://echo/other"); code != http.StatusOK || body != "echo-v1" {
		t.Errorf("GET /other: %d %q", code, body)
	}
	if got := shadow.seen(); len(got) != 1 {
		t.Errorf("the mirror saw %d requests, want the first only: %q", len(got), got)
	}
	if got := never.seen(); len(got) != 0 {
		t.Errorf("a mirror with a share of 0 saw %q", got)
	}
	outcomes := mirrorOutcomes(t, h)
	for key := range outcomes {
		if strings.Contains(key, toUnused) {
			t.Errorf("a mirror with a share of 0 was counted: %s", key)
		}
	}
}

// waitOutcome waits until the mirror outcome key counts want.
func waitOutcome(t *testing.T, h *harness, key string, want float64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := mirrorOutcomes(t, h)
		if got[key] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("shunt_proxy_mirrored_requests_total %s = %v, want %v (all: %v)", key, got[key], want, got)
		}
	}
}
