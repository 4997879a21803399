package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// The integration tests run a real proxy on loopback in front of real
// backends. The socket hooks are faked: the original destination of a
// connection is looked up by the client's address (each test client dials
// from its own 127.0.0.x), and upstream marks are recorded rather than set
// unless the test runs as root.

var testMark = proxyapi.Mark{Magic: 0x5e000000, Mask: 0xff000000}

// Clients: each has its own loopback address, so the proxy names it.
var (
	frontend   = client{"127.0.0.2", 1001, "default/frontend"}
	monitoring = client{"127.0.0.3", 1002, "default/monitoring"}
	stranger   = client{"127.0.0.4", 0, ""} // no endpoint: world
)

type client struct {
	ip       string
	identity uint32
	pod      string
}

// netHTTPOnly makes the harness's proxies serve every request with
// net/http, without the fast path: SHUNT_PROXY_NET_HTTP_ONLY=1 runs the
// whole suite so, onPaths runs one test on both paths.
var netHTTPOnly = os.Getenv("SHUNT_PROXY_NET_HTTP_ONLY") == "1"

// noEventLoop serves the fast path with a goroutine per connection only:
// SHUNT_PROXY_NO_EVENT_LOOP=1 runs the suite that way; withoutEventLoop
// for a test of the goroutine path's own structures.
var noEventLoop = os.Getenv("SHUNT_PROXY_NO_EVENT_LOOP") == "1"

func withoutEventLoop(t *testing.T) {
	saved := noEventLoop
	noEventLoop = true
	t.Cleanup(func() { noEventLoop = saved })
}

// onPaths runs test on the fast path and on net/http's.
func onPaths(t *testing.T, test func(t *testing.T)) {
	for _, only := range []bool{false, true} {
		t.Run(map[bool]string{false: "fast", true: "net-http"}[only], func(t *testing.T) {
			saved := netHTTPOnly
			netHTTPOnly = only
			defer func() { netHTTPOnly = saved }()
			test(t)
		})
	}
}

// harness is a proxy with a fake SO_ORIGINAL_DST and recorded marks.
type harness struct {
	t     testing.TB
	p     *Proxy
	addr  string
	mu    sync.Mutex
	dst   map[netip.Addr]netip.AddrPort // client address -> where it "dialled"
	marks []uint32                      // marks upstream sockets got, in dial order
	flows <-chan flows.Flow
}

func newHarness(t testing.TB, cfg proxyapi.Config) *harness {
	t.Helper()
	h := startHarness(t, "")
	h.apply(cfg)
	return h
}

// startHarness starts a proxy without a configuration.
func startHarness(t testing.TB, configFile string) *harness {
	t.Helper()
	h := &harness{t: t, dst: map[netip.Addr]netip.AddrPort{}}
	opts := Options{ConfigFile: configFile, OriginalDst: h.originalDst, SetMark: h.setMark, NetHTTPOnly: netHTTPOnly, NoEventLoop: noEventLoop}
	if os.Geteuid() == 0 {
		opts.SetMark = func(fd uintptr, mark uint32) error {
			h.setMark(fd, mark)
			return SetMark(fd, mark) // the real thing: checked in the per-identity test
		}
	}
	h.p = New(opts)
	var cancel func()
	h.flows, cancel = h.p.flows.subscribe(flows.Filter{}, 100000)
	t.Cleanup(func() {
		cancel()
		ctx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		h.p.Shutdown(ctx)
	})
	return h
}

// apply puts cfg in force, on a free loopback port unless it says where.
func (h *harness) apply(cfg proxyapi.Config) {
	h.t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if err := h.p.Apply(cfg); err != nil {
		h.t.Fatal(err)
	}
	h.addr = h.p.Addr().String()
}

func (h *harness) originalDst(c net.Conn) (netip.AddrPort, error) {
	remote := netip.MustParseAddrPort(c.RemoteAddr().String())
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.dst[remote.Addr()]
	if !ok {
		return d, fmt.Errorf("no original destination for %s", remote)
	}
	return d, nil
}

func (h *harness) setMark(_ uintptr, mark uint32) error {
	h.mu.Lock()
	h.marks = append(h.marks, mark)
	h.mu.Unlock()
	return nil
}

// dials makes c's connections look as if they were headed to dst.
func (h *harness) dials(c client, dst string) {
	h.mu.Lock()
	h.dst[netip.MustParseAddr(c.ip)] = netip.MustParseAddrPort(dst)
	h.mu.Unlock()
}

// client is an HTTP client from c's address to the proxy, whatever the URL
// says (as a pod's connect redirected by the socket hooks). h2c: HTTP/2
// with prior knowledge.
func (h *harness) client(c client, h2c bool) *http.Client {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(c.ip)}}
	var protos http.Protocols
	if h2c {
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", h.addr)
		},
		Protocols: &protos, MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1,
	}, Timeout: 10 * time.Second}
}

// get sends a request and returns the status and body.
func get(t *testing.T, c *http.Client, method, url string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp.StatusCode, string(b)
}

// serveControl serves the proxy's control API on a unix socket until the
// test ends and returns the socket's path.
func (h *harness) serveControl() string {
	h.t.Helper()
	sock := filepath.Join(h.t.TempDir(), "control.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		h.t.Fatal(err)
	}
	srv := &http.Server{Handler: h.p.ControlHandler()}
	go srv.Serve(ln)
	h.t.Cleanup(func() { srv.Close() })
	return sock
}

// waitFlowReaders waits until n readers take the proxy's flows.
func (h *harness) waitFlowReaders(n int) {
	h.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		got := h.p.flows.readers()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%d flow readers, want %d", got, n)
		}
	}
}

// nextFlow waits for the next flow record.
func (h *harness) nextFlow() flows.Flow {
	h.t.Helper()
	select {
	case fl := <-h.flows:
		return fl
	case <-time.After(5 * time.Second):
		h.t.Fatal("no flow record")
		return flows.Flow{}
	}
}

// testBackend is a test server that answers with its name and records who
// asked how.
type testBackend struct {
	name string
	addr netip.AddrPort
	srv  *http.Server
	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct {
	remote string // the proxy's upstream connection
	proto  string
	client string // X-Client: the test client behind the proxy
}

// startBackend serves handler (nil: answer the name) with HTTP/1.1 and h2c
// on ip:0.
func startBackend(t testing.TB, name, ip string, handler http.HandlerFunc) *testBackend {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	b := &testBackend{name: name, addr: netip.MustParseAddrPort(ln.Addr().String())}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	b.srv = &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		b.seen = append(b.seen, seenRequest{remote: r.RemoteAddr, proto: r.Proto, client: r.Header.Get("X-Client")})
		b.mu.Unlock()
		if handler != nil {
			handler(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, name)
	})}
	go b.srv.Serve(ln)
	t.Cleanup(func() { b.srv.Close() })
	return b
}

func (b *testBackend) requests() []seenRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seenRequest(nil), b.seen...)
}

// svcPort is a service port for the config, with these backends.
func svcPort(name, vip string, port uint16, backends ...*testBackend) proxyapi.Service {
	s := proxyapi.Service{Name: name, VIP: vip, Port: port}
	for _, b := range backends {
		s.Backends = append(s.Backends, proxyapi.Backend{IP: b.addr.Addr().String(), Port: b.addr.Port(), Pod: "default/" + b.name})
	}
	return s
}

// endpoints names the test clients and backends.
func endpoints(backends ...*testBackend) []proxyapi.Endpoint {
	eps := []proxyapi.Endpoint{
		{IP: frontend.ip, Identity: frontend.identity, Pod: frontend.pod, Labels: []string{"app=frontend"}},
		{IP: monitoring.ip, Identity: monitoring.identity, Pod: monitoring.pod, Labels: []string{"app=monitoring"}},
	}
	for i, b := range backends {
		eps = append(eps, proxyapi.Endpoint{IP: b.addr.Addr().String(), Identity: 2000 + uint32(i), Pod: "default/" + b.name})
	}
	return eps
}
