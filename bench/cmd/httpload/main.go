// Command httpload sends HTTP requests at a fixed rate over a fixed number of
// keep-alive connections and prints latency percentiles as JSON. It is fortio
// (fortio.org/fortio) used as a library: fortio's periodic runner keeps the
// rate and its fast HTTP/1.1 client does the requests; every request's
// latency is recorded exactly (fortio's own histogram has buckets 20 µs to
// 1 ms wide at these latencies, coarser than the differences measured).
//
// A warm-up period at the same rate comes first and is left out of the
// numbers: proxies open their upstream connections lazily, and those first
// requests would otherwise land in the tail percentiles.
//
//	httpload -url http://10.96.0.10:8080/ -qps 1000 -c 32 -duration 10s
//
// Output (one JSON object on stdout): p50_us, p90_us, p99_us, p999_us,
// max_us, mean_us over the measured requests, requests, qps (achieved),
// errors (socket errors and non-2xx answers), codes (count per status,
// -1 = socket error), sockets (connections fortio opened; 32 with perfect
// keep-alive), and where the requests above p99 (slow) fall in time:
// slow_windows, the 100 ms windows (by start) holding them, and
// slow_in_worst_window, how many of them the densest window holds (a few
// windows holding most: the path stalled; many windows with one or two
// each: single requests waited). It exits 1 when no request succeeded.
//
// -requests FILE writes every measured request as a line "start_s
// latency_us connection" (start in seconds from the measured window's
// beginning), for a closer look at the tail than percentiles give.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"fortio.org/fortio/fhttp"
	"fortio.org/fortio/periodic"
	"fortio.org/log"
)

func main() {
	var o options
	flag.StringVar(&o.url, "url", "", "URL to GET (required)")
	flag.Float64Var(&o.qps, "qps", 1000, "requests per second, over all connections")
	flag.IntVar(&o.conns, "c", 32, "connections (one fortio thread each, keep-alive)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured duration")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured time at the same rate before it")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Second, "per-request timeout")
	flag.BoolVar(&o.uniform, "uniform", true, "stagger the connections' requests evenly over each period instead of sending them in bursts")
	flag.StringVar(&o.requests, "requests", "", "write every measured request's start (s from the window's beginning), latency (µs) and connection to this file")
	flag.Parse()
	if o.url == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: httpload -url URL [-qps 1000] [-c 32] [-duration 10s] [-warmup 1s] [-requests FILE]")
		os.Exit(2)
	}
	res, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpload:", err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(res)
}

type options struct {
	url, requests             string
	qps                       float64
	conns                     int
	duration, warmup, timeout time.Duration
	uniform                   bool
}

// Result is what httpload prints.
type Result struct {
	URL         string         `json:"url"`
	TargetQPS   float64        `json:"target_qps"`
	Connections int            `json:"connections"`
	Seconds     float64        `json:"seconds"` // measured window
	Requests    int            `json:"requests"`
	QPS         float64        `json:"qps"`
	Errors      int            `json:"errors"`
	Codes       map[string]int `json:"codes"`
	Sockets     int64          `json:"sockets"`
	P50         float64        `json:"p50_us"`
	P90         float64        `json:"p90_us"`
	P99         float64        `json:"p99_us"`
	P999        float64        `json:"p999_us"`
	Max         float64        `json:"max_us"`
	Mean        float64        `json:"mean_us"`
	FortioP99   float64        `json:"fortio_p99_us"` // fortio's histogram estimate, a cross-check
	// Slow is how many requests were slower than P99, SlowWindows how
	// many 100 ms windows (by start) hold them, SlowInWorstWindow how many
	// of them the densest one holds.
	Slow              int          `json:"slow"`
	SlowWindows       int          `json:"slow_windows"`
	SlowInWorstWindow int          `json:"slow_in_worst_window"`
	Warmup            warmupCounts `json:"warmup"`
}

type warmupCounts struct {
	Requests int `json:"requests"`
	Errors   int `json:"errors"`
}

func run(o options) (*Result, error) {
	log.SetLogLevelQuiet(log.Error) // fortio's progress lines would mix with our JSON
	rec := newRecorder(o.conns)
	ro := periodic.RunnerOptions{
		QPS:          o.qps,
		NumThreads:   o.conns,
		Duration:     o.warmup + o.duration,
		Uniform:      o.uniform,
		Percentiles:  []float64{99},
		Resolution:   1e-6, // seconds per histogram unit: µs buckets for fortio's own estimate
		Out:          io.Discard,
		AccessLogger: rec,
	}
	ho := fhttp.HTTPRunnerOptions{RunnerOptions: ro}
	ho.URL = o.url
	ho.HTTPReqTimeOut = o.timeout
	rec.warmup = o.warmup
	res, err := fhttp.RunHTTPTest(&ho)
	if err != nil {
		return nil, fmt.Errorf("fortio: %w", err)
	}
	out := &Result{
		URL: o.url, TargetQPS: o.qps, Connections: o.conns,
		Seconds: round((res.ActualDuration - o.warmup).Seconds()),
		Codes:   map[string]int{}, Sockets: res.SocketCount,
	}
	var lat []float64
	var reqs []request
	for _, t := range rec.threads {
		for _, r := range t.reqs {
			lat = append(lat, r.latency)
		}
		reqs = append(reqs, t.reqs...)
		out.Errors += t.errors
		out.Warmup.Requests += t.warmup
		out.Warmup.Errors += t.warmupErrors
		for code, n := range t.codes {
			out.Codes[code] += n
		}
	}
	out.Requests = len(lat) + out.Errors
	if len(lat) == 0 {
		return nil, fmt.Errorf("no request succeeded in the measured %s (%d failed; warm-up: %d requests, %d failed; status codes %v, -1: socket error)",
			o.duration, out.Errors, out.Warmup.Requests, out.Warmup.Errors, out.Codes)
	}
	out.QPS = round(float64(out.Requests) / out.Seconds)
	slices.Sort(lat)
	out.P50, out.P90, out.P99, out.P999 = pct(lat, 50), pct(lat, 90), pct(lat, 99), pct(lat, 99.9)
	out.Slow, out.SlowWindows, out.SlowInWorstWindow = slowWindows(reqs, out.P99)
	if o.requests != "" {
		if err := writeRequests(o.requests, reqs); err != nil {
			return nil, err
		}
	}
	out.Max = lat[len(lat)-1]
	var sum float64
	for _, v := range lat {
		sum += v
	}
	out.Mean = round(sum / float64(len(lat)))
	for _, p := range res.DurationHistogram.Percentiles {
		if p.Percentile == 99 {
			out.FortioP99 = round(p.Value * 1e6)
		}
	}
	return out, nil
}

// recorder is fortio's access logger: it keeps every measured request's
// latency (µs). Each fortio thread reports only its own requests, so one
// slot per thread needs no lock.
type recorder struct {
	warmup      time.Duration
	once        sync.Once
	measureFrom time.Time // the first request's start + warmup
	threads     []threadRecord
}

type threadRecord struct {
	reqs                 []request // the measured ones that succeeded
	errors               int
	codes                map[string]int
	warmup, warmupErrors int
}

func newRecorder(n int) *recorder {
	r := &recorder{threads: make([]threadRecord, n)}
	for i := range r.threads {
		r.threads[i].codes = map[string]int{}
	}
	return r
}

// Start sees the run's first request: fortio opens and warms its
// connections before, so the warm-up counts from here.
func (r *recorder) Start(ctx context.Context, _ periodic.ThreadID, _ int64, start time.Time) context.Context {
	r.once.Do(func() { r.measureFrom = start.Add(r.warmup) })
	return ctx
}

func (r *recorder) Report(_ context.Context, id periodic.ThreadID, _ int64, start time.Time, latency float64, ok bool, details string) {
	t := &r.threads[id]
	if start.Before(r.measureFrom) {
		t.warmup++
		if !ok {
			t.warmupErrors++
		}
		return
	}
	// Failed requests count as errors, not as latencies: a refused
	// connection answers fast and would flatter the percentiles.
	t.codes[details]++
	if !ok {
		t.errors++
		return
	}
	t.reqs = append(t.reqs, request{start: start.Sub(r.measureFrom).Seconds(), latency: latency * 1e6, conn: int(id)})
}

// request is one measured request: its start (s from the measured window's
// beginning), latency (µs) and connection.
type request struct {
	start, latency float64
	conn           int
}

// slowWindows counts the requests slower than threshold, the 100 ms
// windows (by start) holding them, and the most of them one window holds.
func slowWindows(reqs []request, threshold float64) (slow, windows, worst int) {
	per := map[int]int{}
	for _, r := range reqs {
		if r.latency > threshold {
			per[int(r.start*10)]++
			slow++
		}
	}
	for _, n := range per {
		worst = max(worst, n)
	}
	return slow, len(per), worst
}

// writeRequests writes reqs in start order, one "start_s latency_us
// connection" line each.
func writeRequests(path string, reqs []request) error {
	slices.SortFunc(reqs, func(a, b request) int { return cmp.Compare(a.start, b.start) })
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "%.6f %.1f %d\n", r.start, r.latency, r.conn)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("-requests: %w", err)
	}
	return nil
}

func (r *recorder) Info() string { return "httpload latency recorder" }

// pct is the nearest-rank percentile of sorted values. The epsilon keeps
// float error (99.9/100*1000 = 999.0000000000001) from taking the next rank.
func pct(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p/100*float64(len(sorted))-1e-9)) - 1
	return round(sorted[max(i, 0)])
}

func round(us float64) float64 { return math.Round(us*100) / 100 }
