package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
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

// holdThenRead reads nothing until released, then the body.
func (m *mirrorBackend) holdThenRead(w http.ResponseWriter, r *http.Request) {
	<-m.hold
	io.Copy(io.Discard, r.Body)
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
// (the fast paths hand such rules to net/http's). A streamed body is teed
// to the copy, which is cut when its mirror falls behind; a mirror share
// of 0 copies nothing; each outcome is counted.
func TestRequestMirror(t *testing.T) { onPaths(t, testRequestMirror) }

func testRequestMirror(t *testing.T) {
	echo := startBackend(t, "echo-v1", "127.0.1.1", nil)
	shadow := &mirrorBackend{hold: make(chan struct{}), signal: make(chan struct{}, 16)}
	mirror := startBackend(t, "shadow", "127.0.1.2", shadow.handle)
	never := &mirrorBackend{signal: make(chan struct{}, 16)}
	unused := startBackend(t, "unused", "127.0.1.3", never.handle)
	laggard := &mirrorBackend{hold: make(chan struct{})}
	slow := startBackend(t, "laggard", "127.0.1.4", laggard.holdThenRead)
	prefix := func(p string) []proxyapi.Match {
		return []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: p}}}
	}
	to := []proxyapi.RouteBackend{{Service: "default/echo-v1", Port: 8080, Weight: 1}}
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(echo, mirror, unused, slow),
		Services: []proxyapi.Service{svcPort("default/echo", "10.96.0.10", 80, echo), svcPort("default/echo-v1", "10.96.0.11", 8080, echo),
			svcPort("default/shadow", "10.96.0.12", 8080, mirror), svcPort("default/unused", "10.96.0.13", 8080, unused),
			svcPort("default/laggard", "10.96.0.14", 8080, slow)},
		Routes: []proxyapi.Route{{Name: "default/echo", Parents: []proxyapi.ParentRef{{Service: "default/echo"}},
			Rules: []proxyapi.RouteRule{
				{Matches: prefix("/mirrored"), Backends: to, Filters: &proxyapi.Filters{
					RequestHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-Client", Value: "rewritten"}}},
					Mirrors:        []proxyapi.Mirror{{Service: "default/shadow", Port: 8080, Percent: 100}, {Service: "default/unused", Port: 8080, Percent: 0}},
				}},
				{Matches: prefix("/laggard"), Backends: to, Filters: &proxyapi.Filters{
					Mirrors: []proxyapi.Mirror{{Service: "default/laggard", Port: 8080, Percent: 100}},
				}},
				{Backends: to},
			}}},
	})
	h.dials(frontend, "10.96.0.10:80")
	c := h.client(frontend, false)
	copies, stop := h.p.flows.subscribe(flows.Filter{}, 64)
	defer stop()
	const route, toShadow, toUnused, toLaggard = "default/echo", "default/shadow:8080", "default/unused:8080", "default/laggard:8080"

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
	// The copy has a flow record of its own: from the client to the
	// mirror's backend, the mirror's answer in it.
	for deadline := time.After(5 * time.Second); ; {
		var fl flows.Flow
		select {
		case fl = <-copies:
		case <-deadline:
			t.Fatal("no flow record of the copy")
		}
		if fl.Reason != flows.ReasonMirrored {
			continue
		}
		if fl.HTTP == nil || fl.HTTP.Status != http.StatusOK || fl.HTTP.Path != "/mirrored/a" || fl.HTTP.Route != route ||
			fl.HTTP.BackendPod != "default/shadow" || fl.Source.Identity != frontend.identity || fl.Verdict != "FORWARDED" {
			t.Errorf("the copy's flow: %+v %+v; want FORWARDED, /mirrored/a answered 200 by default/shadow, from the client's identity", fl, fl.HTTP)
		}
		break
	}

	// A streamed (chunked) body is teed to the copy as the backend's
	// request reads it.
	resp = postDrained(t, c, "http://echo/mirrored/stream", "text/plain", streamed("stre", "amed"))
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST /mirrored/stream (chunked): %d, want 200", resp.StatusCode)
	}
	waitOutcome(t, h, route+"/"+toShadow+"/"+mirrorAnswered, 2)
	if got := shadow.seen(); len(got) != 2 || got[1] != "POST /mirrored/stream echo streamed rewritten" {
		t.Errorf("the mirror saw %q, want the streamed request second, its body whole", got)
	}

	// So is an HTTP/2 request's (every gRPC call's): the copy goes on
	// the client identity's HTTP/2 transport.
	c2 := h.client(frontend, true)
	resp = postDrained(t, c2, "http://echo/mirrored/h2", "application/grpc", streamed("h2 ", "stream"))
	c2.CloseIdleConnections()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Errorf("POST /mirrored/h2 over HTTP/2: %d %s, want 200 over HTTP/2", resp.StatusCode, resp.Proto)
	}
	waitOutcome(t, h, route+"/"+toShadow+"/"+mirrorAnswered, 3)
	if got := shadow.seen(); len(got) != 3 || got[2] != "POST /mirrored/h2 echo h2 stream rewritten" {
		t.Errorf("the mirror saw %q, want the HTTP/2 request third, its body whole", got)
	}
	if reqs := mirror.requests(); len(reqs) != 3 || reqs[2].proto != "HTTP/2.0" {
		t.Errorf("the mirror's requests %+v, want the third over HTTP/2", reqs)
	}

	// A mirror that reads a streamed body more slowly than the backend
	// (here: not at all, until released) never holds the client's
	// request: its copy is cut once it falls maxMirrorLag behind.
	big := strings.Repeat("x", 16<<20)
	resp = postDrained(t, c, "http://echo/laggard", "text/plain", io.MultiReader(strings.NewReader(big))) // no length: chunked
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST /laggard, 16 MiB chunked: %d, want 200 while the mirror holds", resp.StatusCode)
	}
	close(laggard.hold)
	waitOutcome(t, h, route+"/"+toLaggard+"/"+mirrorFellBehind, 1)

	// Other rules are not mirrored; a share of 0 never is.
	if code, body := get(t, c, "GET", "http://echo/other"); code != http.StatusOK || body != "echo-v1" {
		t.Errorf("GET /other: %d %q", code, body)
	}
	if got := shadow.seen(); len(got) != 3 {
		t.Errorf("the mirror saw %d requests, want the first three only: %q", len(got), got)
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

// postDrained posts body with c and returns the response, its body read
// and closed.
func postDrained(t *testing.T, c *http.Client, url, contentType string, body io.Reader) *http.Response {
	t.Helper()
	resp, err := c.Post(url, contentType, body)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// streamed is a body of unknown length, written in these parts.
func streamed(parts ...string) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		for _, p := range parts {
			pw.Write([]byte(p))
		}
		pw.Close()
	}()
	return pr
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

// The tee hands each copy what the request read, ends the copies with
// the body (EOF) or with an error when the request's transport closes it
// before its end, drops what a copy's closed transport no longer reads,
// and cuts a copy that falls maxMirrorLag behind, never blocking.
func TestTeeBody(t *testing.T) {
	readAll := func(r io.Reader) (string, error) { b, err := io.ReadAll(r); return string(b), err }
	out, _ := http.NewRequest("POST", "http://x/", io.NopCloser(strings.NewReader("abcdef")))
	tee := teeRequestBody(out)
	a, closed := tee.copy(), tee.copy()
	closed.Close()
	if got, err := readAll(out.Body); got != "abcdef" || err != nil {
		t.Fatalf("the request read %q, %v", got, err)
	}
	if got, err := readAll(a); got != "abcdef" || err != nil {
		t.Errorf("the copy read %q, %v; want the whole body and EOF", got, err)
	}
	if n, err := closed.Read(make([]byte, 8)); n != 0 || err != io.ErrClosedPipe {
		t.Errorf("a closed copy read %d, %v", n, err)
	}

	// Closed before the end: the copies end with an error, a copy made
	// afterwards too; a reader waiting is woken.
	out, _ = http.NewRequest("POST", "http://x/", io.NopCloser(strings.NewReader("abcdef")))
	tee = teeRequestBody(out)
	waiting := tee.copy()
	done := make(chan error, 1)
	go func() { _, err := readAll(waiting); done <- err }()
	out.Body.Read(make([]byte, 2))
	tee.Close()
	select {
	case err := <-done:
		if err != errRequestEnded {
			t.Errorf("a copy of a request closed early ended with %v, want errRequestEnded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a copy's reader was not woken when the request's body was closed")
	}
	if _, err := readAll(tee.copy()); err != errRequestEnded {
		t.Errorf("a copy made after the request ended read %v, want errRequestEnded", err)
	}

	// A copy nobody reads is cut past maxMirrorLag; the request goes on.
	out, _ = http.NewRequest("POST", "http://x/", io.NopCloser(strings.NewReader(strings.Repeat("y", maxMirrorLag+1))))
	tee = teeRequestBody(out)
	slow := tee.copy().(*mirrorPipe)
	if got, err := readAll(out.Body); len(got) != maxMirrorLag+1 || err != nil {
		t.Fatalf("the request read %d bytes, %v", len(got), err)
	}
	if !slow.fellBehind() {
		t.Error("a copy held more than maxMirrorLag unread and was not cut")
	}
	if _, err := readAll(slow); err != errMirrorFellBehind {
		t.Errorf("the cut copy read %v, want errMirrorFellBehind", err)
	}
}
