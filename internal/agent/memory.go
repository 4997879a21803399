package agent

import (
	"context"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// The agent's heap swells with bursts (a relist, thousands of objects
// arriving, a full sync) and then holds far less. Go returns the freed
// pages to the system only gradually, so a node would keep paying for the
// burst long after it. Every few seconds, when more than a few MiB of heap
// are free and still resident, the agent returns them at once.
const (
	returnMemoryEvery = 10 * time.Second
	returnMemoryAbove = 8 << 20
)

func returnFreeMemory(ctx context.Context) {
	sample := []rtmetrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	wait.UntilWithContext(ctx, func(context.Context) {
		rtmetrics.Read(sample)
		if sample[0].Value.Kind() == rtmetrics.KindUint64 && sample[0].Value.Uint64() > returnMemoryAbove {
			debug.FreeOSMemory()
		}
	}, returnMemoryEvery)
}
