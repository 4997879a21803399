package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// BenchmarkProxyRequest drives the real proxy over loopback TCP: raw
// HTTP/1.1 keep-alive clients from the frontend's address, a real net/http
// backend, a route on the service (as bench/run mesh's case (b)) and a
// reader of /flows on the control socket decoding every record as the
// agent does. "direct" is the same client and backend without the proxy:
// the proxy's CPU per request is proxied's cpu-µs/op minus direct's (one
// process holds all three, so the profile shows all three too); "nethttp"
// is the proxy without its fast path.
//
// conns=1 is a serial client: every hand-off is a cold wake-up, as in the
// mesh benchmark where each of 32 connections carries ~31 requests/s.
//
// paced is the mesh benchmark's load: 32 connections, 1000 requests/s in
// all, evenly spread (run it with -benchtime 5000x: 5 s).
func BenchmarkProxyRequest(b *testing.B) {
	for _, c := range []struct {
		name        string
		conns, rate int
	}{{"conns=1", 1, 0}, {"conns=32", 32, 0}, {"paced", 32, 1000}} {
		b.Run("direct/"+c.name, func(b *testing.B) {
			be := startBackend(b, "bench", "127.0.6.1", benchHandler)
			runBenchClients(b, be.addr.String(), c.conns, c.rate)
		})
		for _, path := range []struct {
			name        string
			netHTTPOnly bool
		}{{"proxied", false}, {"nethttp", true}} {
			b.Run(path.name+"/"+c.name, func(b *testing.B) {
				h, read := benchProxy(b, path.netHTTPOnly)
				runBenchClients(b, h.addr, c.conns, c.rate)
				b.StopTimer()
				deadline := time.Now().Add(5 * time.Second)
				for read.Load() < int64(b.N) && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if got := read.Load(); got+int64(h.p.flows.dropped.Load()) < int64(b.N) {
					b.Errorf("the flow reader got %d records (%d dropped) of %d requests", got, h.p.flows.dropped.Load(), b.N)
				}
			})
		}
	}
}

func benchHandler(w http.ResponseWriter, r *http.Request) {
	w.Write([]byte("bench"))
}

// benchProxy is a proxy with a route to one backend and an agent-like
// reader of its flows; read counts the records it decoded. netHTTPOnly:
// without the fast path.
func benchProxy(b *testing.B, netHTTPOnly bool) (*harness, *atomic.Int64) {
	be := startBackend(b, "bench", "127.0.6.1", benchHandler)
	h := benchHarness(b, be.addr, netHTTPOnly)
	read := readFlows(b, h.serveControl())
	h.waitFlowReaders(1)
	return h, read
}

// readFlows reads the proxy's flows from its control socket as the agent
// does, decoding every record, until the benchmark ends; it returns the
// count of records read.
func readFlows(b *testing.B, sock string) *atomic.Int64 {
	ctx, cancel := context.WithCancel(context.Background())
	var read atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		proxyapi.NewClient(sock).Flows(ctx, func(flows.Flow) { read.Add(1) })
	}()
	b.Cleanup(func() { cancel(); wg.Wait() })
	return &read
}

// benchHarness is a proxy (without the harness's flow subscriber) with a
// route on service 10.96.0.70:80 to the backend at be, dialled by the
// frontend client.
func benchHarness(tb testing.TB, be netip.AddrPort, netHTTPOnly bool) *harness {
	return benchHarnessFiltered(tb, be, netHTTPOnly, false)
}

// benchFilters are the filtered benchmarks' header modifiers, as a mesh
// route has them: the rule's on the request and the response, and a
// backendRef's on the request (a header per backend of a split).
var benchFilters = struct{ rule, backendRef *proxyapi.Filters }{
	&proxyapi.Filters{
		RequestHeaders:  &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-Route", Value: "bench"}}},
		ResponseHeaders: &proxyapi.HeaderModifier{Set: []proxyapi.Header{{Name: "X-Served-By", Value: "bench"}}, Remove: []string{"X-Internal"}},
	},
	&proxyapi.Filters{RequestHeaders: &proxyapi.HeaderModifier{Add: []proxyapi.Header{{Name: "X-Canary", Value: "v1"}}}},
}

// benchHarnessFiltered is benchHarness, with benchFilters on the route
// when filtered.
func benchHarnessFiltered(tb testing.TB, be netip.AddrPort, netHTTPOnly, filtered bool) *harness {
	rule := proxyapi.RouteRule{Backends: []proxyapi.RouteBackend{{Service: "default/bench", Port: 80, Weight: 1}}}
	if filtered {
		rule.Filters, rule.Backends[0].Filters = benchFilters.rule, benchFilters.backendRef
	}
	h := &harness{t: tb, dst: map[netip.Addr]netip.AddrPort{}}
	h.p = New(Options{OriginalDst: h.originalDst, SetMark: h.setMark, NetHTTPOnly: netHTTPOnly, NoEventLoop: noEventLoop})
	tb.Cleanup(func() {
		ctx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		h.p.Shutdown(ctx)
	})
	backend := &testBackend{name: "bench", addr: be}
	h.apply(proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(backend),
		Services: []proxyapi.Service{svcPort("default/bench", "10.96.0.70", 80, backend)},
		Routes: []proxyapi.Route{{Name: "default/bench", Parents: []proxyapi.ParentRef{{Service: "default/bench"}},
			Rules: []proxyapi.RouteRule{rule}}},
	})
	h.dials(frontend, "10.96.0.70:80")
	return h
}

// runBenchClients sends b.N GETs over conns keep-alive connections from
// the frontend's address, as fast as they go or rate a second in all, and
// reports the process's CPU per request.
func runBenchClients(b *testing.B, addr string, conns, rate int) {
	runBenchClientsCPU(b, addr, conns, rate, nil)
}

// runBenchClientsCPU is runBenchClients that also reports, as
// proxy-cpu-µs/op, the CPU proxyCPU counts over the timed part (nil: none).
func runBenchClientsCPU(b *testing.B, addr string, conns, rate int, proxyCPU func() time.Duration) {
	type benchConn struct {
		c  net.Conn
		br *bufio.Reader
	}
	cs := make([]benchConn, conns)
	for i := range cs {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(frontend.ip)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		cs[i] = benchConn{c, bufio.NewReader(c)}
	}
	req := []byte("GET /bench HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n")
	do := func(bc benchConn) error {
		if _, err := bc.c.Write(req); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bc.br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return err
	}
	for _, bc := range cs { // warm: upstream connections open
		if err := do(bc); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	var failed atomic.Value
	b.ReportAllocs()
	before := processCPU()
	var proxyBefore time.Duration
	if proxyCPU != nil {
		proxyBefore = proxyCPU()
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	start := time.Now()
	for _, bc := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				if rate > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(n) * time.Second / time.Duration(rate))))
				}
				if err := do(bc); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-before).Microseconds())/float64(b.N), "cpu-µs/op")
	if proxyCPU != nil {
		b.ReportMetric(float64((proxyCPU()-proxyBefore).Microseconds())/float64(b.N), "proxy-cpu-µs/op")
	}
	if err := failed.Load(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkProxyProcess is BenchmarkProxyRequest/proxied/paced with the
// proxy alone in a process (this test binary again, running
// TestBenchProxyChild), as in bench/run mesh: proxy-cpu-µs/op is that
// process's utime+stime (/proc/PID/stat) per request, the runtime's idle
// and wake-ups included and nothing else's. The child sets its Ps as
// shunt-proxy does (SetProcs: SHUNT_PROXY_GOMAXPROCS, or GOMAXPROCS).
// Run it with -benchtime 5000x (5 s).
func BenchmarkProxyProcess(b *testing.B) { benchProxyProcess(b, false) }

// BenchmarkProxyProcessFiltered is BenchmarkProxyProcess with header
// modifiers on the route (benchFilters).
func BenchmarkProxyProcessFiltered(b *testing.B) { benchProxyProcess(b, true) }

func benchProxyProcess(b *testing.B, filtered bool) {
	be := startBackend(b, "bench", "127.0.6.1", benchHandler)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestBenchProxyChild$")
	cmd.Env = append(os.Environ(), "SHUNT_BENCH_PROXY_BACKEND="+be.addr.String(),
		"SHUNT_BENCH_PROXY_FILTERED="+strconv.FormatBool(filtered))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); cmd.Wait() })
	var addr, sock string
	if _, err := fmt.Fscanln(stdout, &addr, &sock); err != nil {
		b.Fatalf("the proxy process did not say where it listens: %v", err)
	}
	readFlows(b, sock)
	var perf *exec.Cmd
	var perfOut bytes.Buffer
	runBenchClientsCPU(b, addr, 32, 1000, func() time.Duration {
		// SHUNT_BENCH_PERF=1: perf stat counts the proxy process's system
		// calls and context switches over the timed part.
		if os.Getenv("SHUNT_BENCH_PERF") == "1" && b.N >= 100 {
			if perf == nil {
				perf = exec.Command("perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter,context-switches", "-p", strconv.Itoa(cmd.Process.Pid))
				perf.Stderr = &perfOut
				if err := perf.Start(); err != nil {
					b.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond) // attached before the clients start
			} else {
				// Again until it ends: an interrupt while it still attaches
				// to the process's threads can go unheeded.
				done := make(chan struct{})
				go func() { perf.Wait(); close(done) }()
				for stopped := false; !stopped; {
					perf.Process.Signal(os.Interrupt)
					select {
					case <-done:
						stopped = true
					case <-time.After(500 * time.Millisecond):
					}
				}
				for _, line := range strings.Split(perfOut.String(), "\n") {
					f := strings.Split(line, ",")
					if v, err := strconv.ParseFloat(f[0], 64); err == nil && len(f) > 2 {
						b.ReportMetric(v/float64(b.N), "proxy-"+strings.TrimPrefix(f[2], "raw_syscalls:")+"/op")
					}
				}
			}
		}
		return procCPU(b, cmd.Process.Pid)
	})
	// The connections the proxy handed to net/http's path: none, unless
	// the fast paths leave the route's filters to it.
	b.ReportMetric(controlMetric(b, sock, "shunt_proxy_handoffs_total", `path="fast"`), "handoffs")
}

// controlMetric is a metric's value, read from the proxy's control socket:
// the sum of its series whose labels hold label (e.g. `path="fast"`).
func controlMetric(b *testing.B, sock, name, label string) float64 {
	c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Get("http://proxy/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sum, found := 0.0, false
	for sc.Scan() {
		series, value, _ := strings.Cut(sc.Text(), " ")
		labels, _ := strings.CutPrefix(series, name)
		if !strings.HasPrefix(series, name) || labels != "" && labels[0] != '{' || !strings.Contains(labels, label) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			b.Fatal(err)
		}
		sum, found = sum+v, true
	}
	if !found {
		b.Fatalf("the proxy's metrics have no %s with %s", name, label)
	}
	return sum
}

// procCPU is a process's utime+stime from /proc/PID/stat.
func procCPU(b *testing.B, pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command's closing parenthesis: state is field 3,
	// utime 14 and stime 15 (proc(5)), in clock ticks (USER_HZ, 100).
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// TestBenchProxyChild is BenchmarkProxyProcess's proxy process: it prints
// its listening and control addresses and serves until its stdin closes.
func TestBenchProxyChild(t *testing.T) {
	backend := os.Getenv("SHUNT_BENCH_PROXY_BACKEND")
	if backend == "" {
		t.Skip("BenchmarkProxyProcess's proxy process: runs only under it")
	}
	if err := SetProcs(); err != nil {
		t.Fatal(err)
	}
	filtered := os.Getenv("SHUNT_BENCH_PROXY_FILTERED") == "true"
	h := benchHarnessFiltered(t, netip.MustParseAddrPort(backend), false, filtered)
	sock := h.serveControl()
	fmt.Println(h.addr, sock)
	io.Copy(io.Discard, os.Stdin)
}

// processCPU is this process's user and system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLoopRequestWork is the Go work the event loop does per request
// without its system calls: the head parsed, decided, judged and rewritten
// for the upstream, the response head parsed and rewritten, and the
// exchange finished (metrics and the flow record handed to a reader).
// cpu-ns/op (the process's CPU, the reader's included) is steadier than
// the process benchmark's CPU per request, which moves with the
// machine's load; the /flows writer's encoding is not in it.
func BenchmarkLoopRequestWork(b *testing.B) {
	be := startBackend(b, "bench", "127.0.6.1", benchHandler)
	h := benchHarness(b, be.addr, false)
	live, cancel := h.p.flows.subscribe(flows.Filter{}, 4096)
	var got atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // as /flows' writer: in batches, not woken per record
		defer close(done)
		for tick := time.NewTicker(5 * time.Millisecond); ; {
			select {
			case <-tick.C:
				for n := len(live); n > 0; n-- {
					<-live
					got.Add(1)
				}
			case <-stop:
				tick.Stop()
				return
			}
		}
	}()
	b.Cleanup(func() { cancel(); close(stop); <-done })
	cc := &clientConn{remote: netip.MustParseAddrPort(frontend.ip + ":40000"), orig: netip.MustParseAddrPort("10.96.0.70:80")}
	head := "GET /bench HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
	respHead := []byte("HTTP/1.1 200 OK\r\nDate: Fri, 27 Nov 2026 12:00:00 GMT\r\nContent-Length: 5\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n")
	var req fastRequest
	var resp fastResponse
	var out, cout []byte
	b.ReportAllocs()
	before := processCPU()
	b.ResetTimer()
	for range b.N {
		if !req.parse(head) {
			b.Fatal("the fast parser refused the benchmark's request")
		}
		t := h.p.table.Load()
		r := &req.req
		x := t.newExchange(r, cc)
		mark, ref := x.decide(r)
		if ref != nil {
			b.Fatal(ref.msg)
		}
		x.up = h.p.up.get(mark, cc.upstreamSource())
		x.backend = x.target.pick()
		if x.policyRule, ref = t.judge(x.peer, x.backend, r); ref != nil {
			b.Fatal(ref.msg)
		}
		out = req.appendUpstreamHead(out[:0], &x.target)
		if err := resp.parse(respHead); err != nil {
			b.Fatal(err)
		}
		cout = resp.appendHead(cout[:0], x.target.responseEdit(), false)
		x.status = resp.status
		h.p.finish(x)
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
	if n := got.Load() + int64(h.p.flows.dropped.Load()); n < int64(b.N) {
		b.Logf("the reader has %d records of %d so far", n, b.N)
	}
}
