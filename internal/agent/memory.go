package agent

import (
	"context"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// The agent's heap is mostly the cluster's objects, long-lived; its
// garbage comes in bursts (a relist, thousands of objects arriving, a full
// sync) and then as a trickle (probes, status writes, metrics scrapes). Go
// collects when the heap has grown by GOGC percent over what was live, and
// returns freed pages to the system only gradually: at 10 000 Services
// (~48 MB live) a node would hold ~24 MB of garbage at the top of each
// cycle, and the pages of a burst for minutes. So, every few seconds:
// garbage beyond a few MiB is collected at once, and free pages returned.
// At an idle node's trickle (~0.2 MB/s at 10 000 Services) that is one
// collection every half minute, a fraction of a percent of a CPU.
const (
	returnMemoryEvery = 5 * time.Second
	returnMemoryAbove = 8 << 20 // free heap pages still resident
	collectAbove      = 6 << 20 // garbage since the last collection
)

func returnFreeMemory(ctx context.Context) {
	wait.UntilWithContext(ctx, func(context.Context) { trimMemory() }, returnMemoryEvery)
}

// trimMemory collects and returns memory when the heap holds more garbage
// or free pages than the thresholds; it says whether it did.
func trimMemory() bool {
	samples := []rtmetrics.Sample{
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"}, // live and not yet collected
		{Name: "/gc/heap/live:bytes"},                // live at the last collection
	}
	rtmetrics.Read(samples)
	free, objects, live := value(samples[0]), value(samples[1]), value(samples[2])
	if free > returnMemoryAbove || objects > live+collectAbove {
		debug.FreeOSMemory()
		return true
	}
	return false
}

func value(s rtmetrics.Sample) uint64 {
	if s.Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return s.Value.Uint64()
}
