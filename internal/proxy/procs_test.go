package proxy

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestProcsGovernorDecides: up at once when one P is over half a core or
// goroutines queue for it, down only after procsCalm quiet intervals in a
// row, never on a busy one.
func TestProcsGovernorDecides(t *testing.T) {
	var g procsGovernor
	if g.next(true, 0.6, 0) {
		t.Error("one P at 0.6 of a CPU: stayed on one P, want Go's default")
	}
	one := false
	for i := 1; i < procsCalm; i++ {
		if one = g.next(one, 0.1, 0); one {
			t.Fatalf("down after %d quiet intervals, want %d", i, procsCalm)
		}
	}
	if g.next(false, 0.3, 0) {
		t.Error("down on an interval above procsDown")
	}
	for i := 1; i <= procsCalm; i++ {
		one = g.next(one, 0.1, 0)
	}
	if !one {
		t.Errorf("still on Go's default after %d quiet intervals", procsCalm)
	}
	if !g.next(true, 0.4, 0.05) {
		t.Error("up at 0.4 of a CPU and 5% of wake-ups queued, between the thresholds: want to stay on one P")
	}
	if g.next(true, 0.2, 0.2) {
		t.Error("one P with 20% of wake-ups queued for it: stayed, want Go's default")
	}
	for i := 1; i <= procsCalm; i++ {
		if g.next(false, 0.1, 0.02) {
			t.Fatal("down while 2% of wake-ups queue")
		}
	}
}

// TestGovernProcs: the real governor on this process takes it to one P
// while quiet, back to Go's default under load, and leaves Go's default
// when stopped.
func TestGovernProcs(t *testing.T) {
	def := runtime.GOMAXPROCS(0)
	if def == 1 {
		t.Skip("Go's default is one P here: nothing to govern")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { GovernProcs(ctx, slog.New(slog.DiscardHandler)); close(done) }()
	defer func() { cancel(); <-done }()

	waitProcs := func(want int, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for runtime.GOMAXPROCS(0) != want {
			if time.Now().After(deadline) {
				t.Fatalf("GOMAXPROCS %d after %s, want %d", runtime.GOMAXPROCS(0), within, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitProcs(1, procsCalm*procsInterval+2*time.Second)

	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 { // busy: more than procsUp of a CPU
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
			}
		}()
	}
	waitProcs(def, 4*procsInterval)
	stop.Store(true)
	wg.Wait()

	cancel()
	<-done
	if got := runtime.GOMAXPROCS(0); got != def {
		t.Errorf("GOMAXPROCS %d after the governor stopped, want Go's default %d", got, def)
	}
}
