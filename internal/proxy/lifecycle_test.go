package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

func slowConfig(b *testBackend) proxyapi.Config {
	return proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(b),
		Services: []proxyapi.Service{svcPort("default/slow", "10.96.0.90", 80, b)}}
}

// Shutdown lets a request in flight finish and stops accepting.
func TestShutdownDrainsRequestsInFlight(t *testing.T) {
	started := make(chan struct{})
	b := startBackend(t, "slow", "127.0.5.1", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		time.Sleep(500 * time.Millisecond)
		w.Write([]byte("done"))
	})
	h := newHarness(t, slowConfig(b))
	h.dials(frontend, "10.96.0.90:80")
	type result struct {
		code int
		body string
	}
	done := make(chan result)
	go func() {
		code, body := get(t, h.client(frontend, false), "GET", "http://slow/")
		done <- result{code, body}
	}()
	<-started
	shut := make(chan error)
	go func() { shut <- h.p.Shutdown(context.Background()) }()
	time.Sleep(100 * time.Millisecond)
	if c, err := net.DialTimeout("tcp", h.addr, time.Second); err == nil {
		c.Close()
		t.Error("the proxy still accepts connections while draining")
	}
	if r := <-done; r.code != 200 || r.body != "done" {
		t.Errorf("the request in flight: %d %q, want it finished", r.code, r.body)
	}
	if err := <-shut; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// Two proxies listen on one address (SO_REUSEPORT): the new one serves
// before the old one stops.
func TestTwoProxiesShareTheListenAddress(t *testing.T) {
	b := startBackend(t, "b", "127.0.5.2", nil)
	old := newHarness(t, slowConfig(b))
	cfg := slowConfig(b)
	cfg.Listen = old.addr
	successor := newHarness(t, cfg)
	if successor.addr != old.addr {
		t.Fatalf("successor listens on %s, want %s", successor.addr, old.addr)
	}
	if err := old.p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	successor.dials(frontend, "10.96.0.90:80")
	if code, body := get(t, successor.client(frontend, false), "GET", "http://b/"); code != 200 || body != "b" {
		t.Errorf("after the old proxy stopped: %d %q", code, body)
	}
}

// A push that changes Listen moves the listener; connections to the old
// address are refused, those made before stay served.
func TestListenChangeRebinds(t *testing.T) {
	b := startBackend(t, "b", "127.0.5.3", nil)
	h := newHarness(t, slowConfig(b))
	h.dials(frontend, "10.96.0.90:80")
	before := h.client(frontend, false)
	if code, _ := get(t, before, "GET", "http://b/"); code != 200 {
		t.Fatal(code)
	}
	cfg := slowConfig(b)
	cfg.Version, cfg.Listen = 2, "127.0.5.4:0"
	if err := h.p.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	oldAddr := h.addr
	h.addr = h.p.Addr().String()
	if !strings.HasPrefix(h.addr, "127.0.5.4:") {
		t.Fatalf("listening on %s after the push, want 127.0.5.4", h.addr)
	}
	if code, _ := get(t, h.client(frontend, false), "GET", "http://b/"); code != 200 {
		t.Errorf("new address: %d", code)
	}
	if c, err := net.DialTimeout("tcp", oldAddr, time.Second); err == nil {
		c.Close()
		t.Error("the old address still accepts")
	}
	if code, _ := get(t, before, "GET", "http://b/"); code != 200 {
		t.Errorf("a connection made before the move: %d", code)
	}
}

func TestConnectionsWithoutOriginalDestinationAreClosed(t *testing.T) {
	b := startBackend(t, "b", "127.0.5.5", nil)
	h := newHarness(t, slowConfig(b))
	// stranger has no original destination on file
	_, err := h.client(stranger, false).Get("http://b/")
	if err == nil {
		t.Fatal("a connection without original destination was served")
	}
	deadline := time.Now().Add(time.Second)
	for h.p.Status().OriginalDstErrors != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := h.p.Status(); st.OriginalDstErrors != 1 || st.ActiveConnections != 0 {
		t.Errorf("status %+v, want one original destination error and nothing open", st)
	}
	// Without socket hooks, the real lookup fails and says what to check.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	c, _ := net.Dial("tcp", ln.Addr().String())
	defer c.Close()
	if _, err := OriginalDst(c); err == nil || !strings.Contains(err.Error(), "SO_ORIGINAL_DST") {
		t.Errorf("SO_ORIGINAL_DST on a plain connection: %v", err)
	}
}

// The control API as the agent uses it, and a restarted proxy serving the
// saved configuration at once.
func TestControlAPIAndConfigFile(t *testing.T) {
	b := startBackend(t, "b", "127.0.5.6", nil)
	dir := t.TempDir()
	h := startHarness(t, filepath.Join(dir, "proxy-config.json"))
	sock := h.serveControl()
	c := proxyapi.NewClient(sock)
	ctx := context.Background()

	if st, err := c.Status(ctx); err != nil || st.Version != 0 {
		t.Fatalf("status before any push: %+v %v", st, err)
	}
	cfg := slowConfig(b)
	cfg.Version, cfg.Listen = 5, "127.0.5.7:0"
	if err := c.PushConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	h.addr = h.p.Addr().String()
	var apiErr *proxyapi.Error
	stale := cfg
	stale.Version = 4
	if err := c.PushConfig(ctx, stale); !errors.As(err, &apiErr) || apiErr.Code != http.StatusConflict {
		t.Errorf("an older version: %v, want 409", err)
	}
	bad := invalidConfig()
	err := c.PushConfig(ctx, bad)
	if !errors.As(err, &apiErr) || apiErr.Code != http.StatusBadRequest {
		t.Fatalf("an invalid configuration: %v, want 400", err)
	}
	for _, field := range invalidFields {
		if !strings.Contains(apiErr.Message, field+":") {
			t.Errorf("the answer does not name %s:\n%s", field, apiErr.Message)
		}
	}
	resp, err := rawPut(sock, `{"version": 7, "routes": [{"name": 3}]}`)
	if err != nil || resp.code != 400 || !strings.Contains(resp.body, "routes.name") {
		t.Errorf("a JSON type error: %+v %v, want 400 naming routes.name", resp, err)
	}
	if got, err := c.Config(ctx); err != nil || got.Version != 5 {
		t.Errorf("config in force after refusals: version %d %v, want 5", got.Version, err)
	}
	if st, _ := c.Status(ctx); st.Version != 5 || st.ConfigErrors != 3 || st.LastConfigError == "" || st.Listen != "127.0.5.7:0" {
		t.Errorf("status %+v", st)
	}

	// Flows stream until the reader leaves.
	fctx, stop := context.WithCancel(ctx)
	got := make(chan flows.Flow, 100)
	ended := make(chan error)
	go func() { ended <- c.Flows(fctx, func(fl flows.Flow) { got <- fl }) }()
	h.dials(frontend, "10.96.0.90:80")
	hc := h.client(frontend, false)
	var fl flows.Flow
	for fl.HTTP == nil {
		get(t, hc, "GET", "http://b/streamed")
		select {
		case fl = <-got:
		case <-time.After(100 * time.Millisecond): // not subscribed yet
		}
	}
	if fl.HTTP.Path != "/streamed" || fl.Source.Pod != "default/frontend" {
		t.Errorf("streamed flow %+v", fl)
	}
	stop()
	if err := <-ended; err != nil {
		t.Errorf("the flow stream ended with %v when its reader left", err)
	}
	text, err := c.MetricsText(ctx)
	for _, want := range []string{
		`shunt_proxy_http_requests_total{backend="default/slow:80",code="200",route=""}`,
		"shunt_proxy_http_request_duration_seconds_bucket", "shunt_proxy_connections_total 1",
		"shunt_proxy_active_connections 1", "shunt_proxy_original_dst_errors_total 0", "shunt_proxy_config_version 5",
	} {
		if err != nil || !strings.Contains(text, want) {
			t.Errorf("metrics lack %s (%v)", want, err)
		}
	}

	// A new proxy serves the saved configuration before any push.
	next := startHarness(t, filepath.Join(dir, "proxy-config.json"))
	if err := next.p.LoadConfigFile(); err != nil {
		t.Fatal(err)
	}
	next.addr = next.p.Addr().String()
	next.dials(frontend, "10.96.0.90:80")
	if code, body := get(t, next.client(frontend, false), "GET", "http://b/"); code != 200 || body != "b" {
		t.Errorf("restarted proxy: %d %q", code, body)
	}
	if v, _ := next.p.Config(); v.Version != 5 {
		t.Errorf("restarted proxy serves version %d, want 5", v.Version)
	}
}

type rawResponse struct {
	code int
	body string
}

func rawPut(sock, body string) (rawResponse, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	req, _ := http.NewRequest("PUT", "http://proxy/config", strings.NewReader(body))
	resp, err := hc.Do(req)
	if err != nil {
		return rawResponse{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawResponse{resp.StatusCode, string(b)}, nil
}

// An agent that restarted pushes a configuration computed before it had
// heard of every object (no routes, no services yet): the proxy keeps the
// complete one in force, requests keep their routes, and the config file a
// restarted proxy would load is still the complete one. A complete newer
// configuration then replaces it.
func TestIncompleteConfigurationKeepsTheCompleteOne(t *testing.T) {
	v1 := startBackend(t, "v1", "127.0.7.12", nil)
	v2 := startBackend(t, "v2", "127.0.7.13", nil)
	complete := proxyapi.Config{Version: 1, Complete: true, Mark: testMark, Endpoints: endpoints(v1, v2),
		Services: []proxyapi.Service{svcPort("default/web", "10.96.0.91", 80, v1, v2), svcPort("default/v2", "10.96.0.92", 80, v2)},
		Routes: []proxyapi.Route{{Name: "default/web", Parents: []proxyapi.ParentRef{{Service: "default/web"}},
			Rules: []proxyapi.RouteRule{{
				Matches:  []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: "/api"}}},
				Backends: []proxyapi.RouteBackend{{Service: "default/v2", Port: 80, Weight: 1}},
			}}}},
	}
	file := filepath.Join(t.TempDir(), "proxy-config.json")
	h := startHarness(t, file)
	h.apply(complete)
	h.dials(frontend, "10.96.0.91:80")
	check := func(when string) {
		t.Helper()
		if code, body := get(t, h.client(frontend, false), "GET", "http://web/api/x"); code != 200 || !strings.Contains(body, "v2") {
			t.Errorf("%s: /api/x %d %q, want 200 from v2 (the route)", when, code, body)
		}
	}
	check("complete configuration")

	// What a restarted agent computes before its source delivered the
	// objects: its own endpoints, nothing else.
	incomplete := proxyapi.Config{Version: 2, Listen: h.addr, Mark: testMark, Endpoints: endpoints(v1)}
	var ie *IncompleteError
	if err := h.p.Apply(incomplete); !errors.As(err, &ie) {
		t.Fatalf("incomplete configuration over a complete one: %v, want *IncompleteError", err)
	}
	if cfg, _ := h.p.Config(); cfg.Version != 1 || len(cfg.Routes) != 1 {
		t.Errorf("configuration in force: version %d, %d routes; want the complete version 1", cfg.Version, len(cfg.Routes))
	}
	check("after an incomplete push")
	restarted := startHarness(t, file)
	if err := restarted.p.LoadConfigFile(); err != nil {
		t.Fatal(err)
	}
	if cfg, _ := restarted.p.Config(); cfg.Version != 1 || !cfg.Complete {
		t.Errorf("a restarted proxy loads version %d (complete %v), want the complete version 1", cfg.Version, cfg.Complete)
	}
	restarted.p.Shutdown(context.Background())

	next := complete
	next.Version, next.Listen, next.Routes = 3, h.addr, nil
	h.apply(next)
	if code, body := get(t, h.client(frontend, false), "GET", "http://web/api/x"); code != 200 || body == "" {
		t.Errorf("complete configuration without the route: %d %q, want 200", code, body)
	}
}
