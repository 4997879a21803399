// Package parallel spreads independent work over the CPUs.
package parallel

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// For calls f(0) ... f(n-1) on as many goroutines as there are CPUs (one
// for small n), each index once. It returns when all calls have. Callers
// write results by index, so the order of the output does not depend on
// scheduling.
func For(n int, f func(i int)) {
	Limit(n, min(runtime.GOMAXPROCS(0), n/64+1), f)
}

// Limit is For on at most workers goroutines, whatever the CPUs: for work
// that mostly waits (on other processes, the kernel) rather than computes.
func Limit(n, workers int, f func(i int)) {
	workers = min(workers, n)
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}
