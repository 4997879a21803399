// Command uibench measures shunt ui's page under a synthetic flow rate: a
// generator feeds the ui server's Source at -rate flows/s (a cluster of
// -namespaces namespaces, each with workloads, Services, drops, HTTP
// requests and a 90/10 split), headless Chromium (chromedp) loads the
// page, and after a warm-up the browser's own metrics are read over
// -duration: long tasks (PerformanceObserver 'longtask', > 50 ms), frame
// intervals (requestAnimationFrame), the time the page spent drawing each
// snapshot, snapshots and bytes received. It prints one JSON object.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/ui"
)

type result struct {
	Rate            int     `json:"rate"`            // flows/s asked for
	FlowsPerSec     float64 `json:"flowsPerSec"`     // flows/s the server aggregated over the window
	Edges           int     `json:"edges"`           // edges on the map
	Nodes           int     `json:"nodes"`           // nodes on the map
	SnapshotsPerSec float64 `json:"snapshotsPerSec"` // what the browser received
	SnapshotKB      float64 `json:"snapshotKB"`      // size of the last snapshot
	LongTasks       int     `json:"longTasks"`       // > 50 ms tasks over the window
	LongTaskMs      float64 `json:"longTaskMs"`      // their total
	LongTaskMaxMs   float64 `json:"longTaskMaxMs"`
	FrameP50Ms      float64 `json:"frameP50Ms"` // requestAnimationFrame intervals
	FrameP99Ms      float64 `json:"frameP99Ms"`
	FrameMaxMs      float64 `json:"frameMaxMs"`
	Frames          int     `json:"frames"`
	RenderP50Ms     float64 `json:"renderP50Ms"` // the page's draw of one snapshot
	RenderMaxMs     float64 `json:"renderMaxMs"`
	ServerCPU       float64 `json:"serverCPU"` // this process (generator + server), cores
	Missed          uint64  `json:"missed"`    // flows the view lost by falling behind
	Layouts         int     `json:"layouts"`   // times the page laid the map out anew (since it loaded)
}

func main() {
	rate := flag.Int("rate", 10000, "flows per second the generator feeds the server")
	namespaces := flag.Int("namespaces", 10, "namespaces of the synthetic cluster (each 6 workloads, 2 Services)")
	warmup := flag.Duration("warmup", 3*time.Second, "time before measuring")
	duration := flag.Duration("duration", 10*time.Second, "measuring window")
	screenshot := flag.String("screenshot", "", "save a screenshot of the page at the end here")
	flag.Parse()

	gen := newGenerator(*namespaces)
	var produced atomic.Uint64
	src := ui.SourceFunc(func(ctx context.Context, each func(flows.Flow)) error {
		if *rate <= 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		// Flows owed by the clock, not per tick: a ticker drops the ticks
		// a busy machine delays, and the rate with them.
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		owed, last := 0.0, time.Now()
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case now := <-t.C:
				owed += float64(*rate) * now.Sub(last).Seconds()
				last = now
				for ; owed >= 1; owed-- {
					each(gen.next(now))
					produced.Add(1)
				}
			}
		}
	})
	srv := ui.NewServer(src, ui.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Run(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("listening: %v", err)
	}
	go http.Serve(ln, srv.Handler())
	url := fmt.Sprintf("http://%s/?token=%s", ln.Addr(), srv.Token())

	if _, err := exec.LookPath("chromium"); err != nil {
		fail("chromium is not installed: run scripts/setup.sh")
	}
	// --no-sandbox: Chromium refuses its sandbox as root.
	// Chromium's singleton directory (org.chromium.Chromium.*) goes to
	// TMPDIR and stays when the browser is killed, as chromedp ends it.
	tmp, err := os.MkdirTemp("", "uibench-chromium")
	if err != nil {
		fail("%v", err)
	}
	defer os.RemoveAll(tmp)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath("chromium"), chromedp.NoSandbox, chromedp.WindowSize(1600, 1000),
		chromedp.Env("TMPDIR="+tmp))
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		fail("loading the page: %v", err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](`
		window.__frames = [];
		(() => { let last = performance.now(); const f = (t) => { window.__frames.push(t - last); last = t; requestAnimationFrame(f); }; requestAnimationFrame(f); })();`)); err != nil {
		fail("installing the frame recorder: %v", err)
	}
	time.Sleep(*warmup)
	reset := `window.__frames = []; shuntUI.longTasks = []; shuntUI.renderMs = []; window.__snap0 = shuntUI.snapshots; window.__flows0 = shuntUI.last ? shuntUI.last.flows : 0; window.__t0 = performance.now();`
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](reset)); err != nil {
		fail("starting the window: %v", err)
	}
	cpu0 := cpuSeconds()
	start := time.Now()
	time.Sleep(*duration)
	cpu := (cpuSeconds() - cpu0) / time.Since(start).Seconds()
	var m struct {
		Frames    []float64 `json:"frames"`
		LongTasks []struct {
			Duration float64 `json:"duration"`
		} `json:"longTasks"`
		Render    []float64 `json:"render"`
		Snapshots int       `json:"snapshots"`
		Flows     float64   `json:"flows"`
		Seconds   float64   `json:"seconds"`
		Edges     int       `json:"edges"`
		Nodes     int       `json:"nodes"`
		Bytes     int       `json:"bytes"`
		Missed    uint64    `json:"missed"`
		Rebuilds  int       `json:"rebuilds"`
	}
	raw, err := chromedp.Run(bctx, chromedp.Evaluate[[]byte](`({
		frames: window.__frames, longTasks: shuntUI.longTasks, render: shuntUI.renderMs,
		snapshots: shuntUI.snapshots - window.__snap0, flows: shuntUI.last.flows - window.__flows0,
		seconds: (performance.now() - window.__t0) / 1000,
		edges: shuntUI.last.edges.length, nodes: shuntUI.last.nodes.length,
		bytes: JSON.stringify(shuntUI.last).length, missed: shuntUI.last.missed, rebuilds: shuntUI.rebuilds })`))
	if err != nil {
		fail("reading the page's metrics: %v", err)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		fail("decoding the page's metrics: %v", err)
	}
	if *screenshot != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err == nil {
			err = os.WriteFile(*screenshot, png, 0o644)
		}
		if err != nil {
			fail("screenshot: %v", err)
		}
	}
	r := result{Rate: *rate, Edges: m.Edges, Nodes: m.Nodes, Missed: m.Missed, Frames: len(m.Frames), ServerCPU: round(cpu), Layouts: m.Rebuilds}
	if m.Seconds > 0 {
		r.FlowsPerSec = round(m.Flows / m.Seconds)
		r.SnapshotsPerSec = round(float64(m.Snapshots) / m.Seconds)
	}
	r.SnapshotKB = round(float64(m.Bytes) / 1024)
	for _, lt := range m.LongTasks {
		r.LongTasks++
		r.LongTaskMs += lt.Duration
		r.LongTaskMaxMs = max(r.LongTaskMaxMs, lt.Duration)
	}
	r.LongTaskMs, r.LongTaskMaxMs = round(r.LongTaskMs), round(r.LongTaskMaxMs)
	r.FrameP50Ms, r.FrameP99Ms, r.FrameMaxMs = pct(m.Frames, 50), pct(m.Frames, 99), pct(m.Frames, 100)
	r.RenderP50Ms, r.RenderMaxMs = pct(m.Render, 50), pct(m.Render, 100)
	json.NewEncoder(os.Stdout).Encode(r)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "uibench: "+format+"\n", args...)
	os.Exit(1)
}

func round(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

func pct(v []float64, p int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := (len(s) - 1) * p / 100
	return round(s[i])
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// generator makes flows of a synthetic cluster: per namespace a frontend
// calling two Services (api: three versions with a 90/8/2 split of HTTP
// requests; db), a worker, and a scraper that policies drop; pods reaching
// the world and the node.
type generator struct {
	templates []flows.Flow
	weights   []float64
	total     float64
	rng       *rand.Rand
}

func newGenerator(namespaces int) *generator {
	g := &generator{rng: rand.New(rand.NewPCG(1, 2))}
	add := func(w float64, fl flows.Flow) {
		g.templates = append(g.templates, fl)
		g.weights = append(g.weights, w)
		g.total += w
	}
	id := uint32(1000)
	pod := func(ns, name, app, version string) flows.Endpoint {
		id++
		labels := []string{"app=" + app}
		if version != "" {
			labels = append(labels, "version="+version)
		}
		return flows.Endpoint{Pod: ns + "/" + name, Namespace: ns, IP: fmt.Sprintf("10.%d.%d.%d", id>>16&255, id>>8&255, id&255), Port: 8080, Identity: id, Labels: labels}
	}
	for i := range namespaces {
		ns := fmt.Sprintf("team-%02d", i)
		fe := pod(ns, "frontend-7d4b9c8f6d-x2k9p", "frontend", "")
		api := []flows.Endpoint{pod(ns, "api-v1-0", "api", "v1"), pod(ns, "api-v2-0", "api", "v2"), pod(ns, "api-v3-0", "api", "v3")}
		db := pod(ns, "db-0", "db", "")
		worker := pod(ns, "worker-5f6b7c8d9e-abcde", "worker", "")
		scraper := pod(ns, "scraper-6c7d8e9f0a-zzzzz", "scraper", "")
		apiSvc := &flows.Service{Name: ns + "/api:80", IP: "10.96.0.1", Port: 80}
		dbSvc := &flows.Service{Name: ns + "/db:5432", IP: "10.96.0.2", Port: 5432}
		for v, w := range []float64{90, 8, 2} {
			add(w, flows.Flow{Verdict: "FORWARDED", Protocol: "HTTP", Event: "http", Point: "proxy", Source: fe, Destination: api[v], Service: apiSvc,
				HTTP: &flows.HTTP{Method: "GET", Path: "/api/items", Status: 200, Route: ns + "/api", Backend: api[v].IP + ":8080", BackendPod: api[v].Pod}})
			add(w/10, flows.Flow{Verdict: "FORWARDED", Protocol: "TCP", Event: "new", Point: "from-pod", Source: api[v], Destination: db, Service: dbSvc})
		}
		add(3, flows.Flow{Verdict: "DROPPED", DropReason: "policy-not-allowed", Reason: "policy-not-allowed", Protocol: "HTTP", Event: "http", Point: "proxy",
			Source: worker, Destination: api[0], Service: apiSvc, HTTP: &flows.HTTP{Method: "DELETE", Path: "/api/items", Status: 403}})
		add(5, flows.Flow{Verdict: "FORWARDED", Protocol: "TCP", Event: "new", Point: "from-pod", Source: worker, Destination: db, Service: dbSvc})
		add(2, flows.Flow{Verdict: "DROPPED", DropReason: "policy-denied", Reason: "policy-denied", Protocol: "TCP", Event: "drop", Point: "to-pod",
			Source: scraper, Destination: db, Policy: "NetworkPolicy " + ns + "/db-ingress ingress[0] (deny)"})
		add(1, flows.Flow{Verdict: "DROPPED", DropReason: "policy-not-allowed", Reason: "policy-not-allowed", Protocol: "UDP", Event: "drop", Point: "from-pod",
			Source: worker, Destination: flows.Endpoint{IP: "203.0.113.9", Port: 53, Labels: []string{"reserved:world"}}})
		add(1, flows.Flow{Verdict: "FORWARDED", Protocol: "TCP", Event: "new", Point: "from-pod",
			Source: fe, Destination: flows.Endpoint{IP: "192.168.1.1", Port: 10250, Labels: []string{"reserved:host"}}})
		// The frontend's clients come from outside.
		add(10, flows.Flow{Verdict: "FORWARDED", Protocol: "TCP", Event: "new", Point: "to-pod",
			Source: flows.Endpoint{IP: "198.51.100.7", Port: 40000, Labels: []string{"reserved:world"}}, Destination: fe})
	}
	return g
}

func (g *generator) next(now time.Time) flows.Flow {
	x := g.rng.Float64() * g.total
	i := 0
	for ; i < len(g.weights)-1 && x >= g.weights[i]; i++ {
		x -= g.weights[i]
	}
	fl := g.templates[i]
	fl.Time = now
	fl.Source.Port = uint16(32768 + g.rng.IntN(28000))
	return fl
}
