package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	v := make([]float64, 1000)
	for i := range v {
		v[i] = float64(i + 1) // 1 .. 1000
	}
	for _, c := range []struct{ p, want float64 }{{50, 500}, {90, 900}, {99, 990}, {99.9, 999}, {100, 1000}} {
		if got := pct(v, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := pct([]float64{7}, 99.9); got != 7 {
		t.Errorf("p99.9 of one value = %v, want 7", got)
	}
}

// The recorder leaves the warm-up out and keeps failed requests out of the
// latencies (a refused connection is fast and would flatter them).
func TestRecorderWarmupAndErrors(t *testing.T) {
	r := newRecorder(2)
	r.warmup = time.Second
	t0 := time.Now()
	ctx := r.Start(context.Background(), 0, 0, t0) // the first request: the warm-up starts here
	r.Report(ctx, 0, 0, t0, 0.050, true, "200")
	r.Report(ctx, 1, 0, t0.Add(500*time.Millisecond), 0.001, false, "-1")
	r.Report(ctx, 0, 1, t0.Add(time.Second), 0.000200, true, "200")
	r.Report(ctx, 1, 1, t0.Add(1100*time.Millisecond), 0.000100, false, "503")
	r.Report(ctx, 1, 2, t0.Add(1200*time.Millisecond), 0.000300, true, "200")

	if w := r.threads[0].warmup + r.threads[1].warmup; w != 2 {
		t.Errorf("warm-up requests = %d, want 2", w)
	}
	if e := r.threads[1].warmupErrors; e != 1 {
		t.Errorf("warm-up errors = %d, want 1", e)
	}
	var lat []float64
	for _, t := range r.threads {
		for _, req := range t.reqs {
			lat = append(lat, req.latency)
		}
	}
	if len(lat) != 2 || round(lat[0]) != 200 || round(lat[1]) != 300 {
		t.Errorf("measured latencies = %v µs, want [200 300]", lat)
	}
	if r.threads[1].errors != 1 || r.threads[1].codes["503"] != 1 || r.threads[0].codes["200"] != 1 {
		t.Errorf("errors/codes: thread 0 %+v, thread 1 %+v", r.threads[0], r.threads[1])
	}
}

// slowWindows tells a stall (the slow requests in one window) from
// scattered waits (one per window), and the requests file holds every
// request in start order.
func TestSlowWindowsAndRequestsFile(t *testing.T) {
	reqs := []request{
		{start: 0.31, latency: 900, conn: 1}, {start: 0.01, latency: 100, conn: 0},
		{start: 0.32, latency: 950, conn: 2}, {start: 0.35, latency: 990, conn: 3},
		{start: 1.25, latency: 800, conn: 0}, {start: 1.26, latency: 90, conn: 1},
	}
	if slow, w, worst := slowWindows(reqs, 500); slow != 4 || w != 2 || worst != 3 {
		t.Errorf("slowWindows = %d slow in %d windows, %d in the worst; want 4, 2 and 3", slow, w, worst)
	}
	if slow, w, worst := slowWindows(reqs, 1000); slow != 0 || w != 0 || worst != 0 {
		t.Errorf("nothing above the threshold: slowWindows = %d, %d, %d; want 0, 0, 0", slow, w, worst)
	}
	path := filepath.Join(t.TempDir(), "requests")
	if err := writeRequests(path, reqs); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != len(reqs) || lines[0] != "0.010000 100.0 0" || lines[5] != "1.260000 90.0 1" {
		t.Errorf("requests file:\n%s", raw)
	}
}
