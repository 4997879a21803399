package parallel

import (
	"sync/atomic"
	"testing"
)

func TestForCallsEachIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 1000, 100000} {
		calls := make([]atomic.Int32, n)
		For(n, func(i int) { calls[i].Add(1) })
		for i := range calls {
			if c := calls[i].Load(); c != 1 {
				t.Fatalf("n=%d: index %d called %d times", n, i, c)
			}
		}
	}
}

func TestLimitCallsEachIndexOnceOnAtMostWorkers(t *testing.T) {
	for _, c := range []struct{ n, workers int }{{0, 8}, {1, 8}, {5, 8}, {1000, 8}, {1000, 1}} {
		calls := make([]atomic.Int32, c.n)
		var running, most atomic.Int32
		Limit(c.n, c.workers, func(i int) {
			now := running.Add(1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			calls[i].Add(1)
			running.Add(-1)
		})
		for i := range calls {
			if got := calls[i].Load(); got != 1 {
				t.Fatalf("n=%d workers=%d: index %d called %d times", c.n, c.workers, i, got)
			}
		}
		if m := most.Load(); int(m) > c.workers {
			t.Errorf("n=%d workers=%d: %d calls at once", c.n, c.workers, m)
		}
	}
}
