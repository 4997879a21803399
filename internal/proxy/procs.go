package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"syscall"
	"time"
)

// The proxy runs on one P (GOMAXPROCS=1) while it is quiet and on Go's
// default (the CPUs, or the cgroup's limit) once it needs more than about
// half a core. Measured (bench/RESULTS.md, "Request fast path"): at the
// mesh benchmark's 1000 requests/s a second P costs the proxy ~25-30% more
// CPU per request, because every wake-up from the poller also wakes an
// idle P's thread to spin for work it does not find; one P would cap a
// busy node's proxy at one core, so the cap lasts only while one P is
// plenty. A proxy whose goroutines wait for the one P (the machine's
// other work takes its thread's CPU, say) counts as busy too.
const (
	procsInterval = 250 * time.Millisecond
	// procsUp is the share of one CPU the process uses on one P beyond
	// which it gets Go's default.
	procsUp = 0.5
	// procsDown is the share of one CPU below which, for procsCalm
	// intervals in a row, it goes back to one P.
	procsDown = 0.25
	procsCalm = 8
	// procsWaitLong is a scheduling latency (runnable to running) that
	// means the goroutines queue for the P; procsQueued the share of the
	// interval's wake-ups that waited that long beyond which one P is not
	// enough, procsUnqueued the share below which it is.
	procsWaitLong = time.Millisecond
	procsQueued   = 0.1
	procsUnqueued = 0.01
)

// SetProcs applies SHUNT_PROXY_GOMAXPROCS, the proxy's own GOMAXPROCS
// (GOMAXPROCS would set every Go process the agent starts); without it, or
// GOMAXPROCS, the proxy's Ps are governed (GovernProcs) until ctx ends.
func SetProcs(ctx context.Context, log *slog.Logger) (governed bool, err error) {
	if v := os.Getenv("SHUNT_PROXY_GOMAXPROCS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return false, fmt.Errorf("SHUNT_PROXY_GOMAXPROCS=%q: want a number of threads, 1 or more", v)
		}
		runtime.GOMAXPROCS(n)
		return false, nil
	}
	if os.Getenv("GOMAXPROCS") != "" || runtime.GOMAXPROCS(0) == 1 {
		return false, nil
	}
	go GovernProcs(ctx, log)
	return true, nil
}

// procsGovernor decides the proxy's GOMAXPROCS from the CPU it used.
type procsGovernor struct {
	calm int // intervals in a row below procsDown
}

// next says whether to run on one P (one) after an interval in which the
// process used busy CPUs on average and queued (a share) of its
// goroutines' wake-ups waited procsWaitLong or more for a P, running on
// one P (wasOne) or not.
func (g *procsGovernor) next(wasOne bool, busy, queued float64) (one bool) {
	if busy < procsDown && queued < procsUnqueued {
		g.calm++
	} else {
		g.calm = 0
	}
	switch {
	case wasOne && (busy > procsUp || queued > procsQueued):
		return false
	case !wasOne && g.calm >= procsCalm:
		return true
	}
	return wasOne
}

// GovernProcs sets GOMAXPROCS to one while the process is quiet and back
// to Go's default when it is busy, until ctx ends (then Go's default). It
// does nothing where the default is already one P.
func GovernProcs(ctx context.Context, log *slog.Logger) {
	if runtime.GOMAXPROCS(0) == 1 {
		return
	}
	var g procsGovernor
	one := false
	last, lastAt := processCPU(), time.Now()
	var waits schedWaits
	waits.read()
	tick := time.NewTicker(procsInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if one {
				runtime.SetDefaultGOMAXPROCS()
			}
			return
		case now := <-tick.C:
			cpu := processCPU()
			busy := float64(cpu-last) / float64(now.Sub(lastAt))
			last, lastAt = cpu, now
			next := g.next(one, busy, waits.read())
			switch {
			case next && !one:
				runtime.GOMAXPROCS(1)
				log.Debug("quiet: running on one P", "cpus used", busy)
			case !next && one:
				runtime.SetDefaultGOMAXPROCS()
				log.Debug("busy: running on Go's default Ps", "cpus used", busy, "gomaxprocs", runtime.GOMAXPROCS(0))
			}
			one = next
		}
	}
}

// processCPU is the process's user and system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// schedWaits reads the runtime's histogram of scheduling latencies.
type schedWaits struct {
	sample            [1]rtmetrics.Sample
	lastAll, lastLong uint64
}

// read returns the share of the wake-ups since the last read that waited
// procsWaitLong or more (0 when there were none).
func (w *schedWaits) read() float64 {
	w.sample[0].Name = "/sched/latencies:seconds"
	rtmetrics.Read(w.sample[:])
	if w.sample[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0 // not in this Go: CPU alone decides
	}
	h := w.sample[0].Value.Float64Histogram()
	var all, long uint64
	for i, n := range h.Counts {
		all += n
		if h.Buckets[i] >= procsWaitLong.Seconds() {
			long += n
		}
	}
	dAll, dLong := all-w.lastAll, long-w.lastLong
	w.lastAll, w.lastLong = all, long
	if dAll == 0 {
		return 0
	}
	return float64(dLong) / float64(dAll)
}
