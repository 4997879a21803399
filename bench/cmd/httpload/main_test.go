package main

import (
	"context"
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
	lat := append(append([]float64(nil), r.threads[0].lat...), r.threads[1].lat...)
	if len(lat) != 2 || round(lat[0]) != 200 || round(lat[1]) != 300 {
		t.Errorf("measured latencies = %v µs, want [200 300]", lat)
	}
	if r.threads[1].errors != 1 || r.threads[1].codes["503"] != 1 || r.threads[0].codes["200"] != 1 {
		t.Errorf("errors/codes: thread 0 %+v, thread 1 %+v", r.threads[0], r.threads[1])
	}
}
