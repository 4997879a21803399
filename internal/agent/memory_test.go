package agent

import (
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"testing"
)

var sink [][]byte

// TestTrimMemoryCollectsGarbage: garbage past the threshold is collected
// and its pages returned at the next check; a heap without it is left
// alone.
func TestTrimMemoryCollectsGarbage(t *testing.T) {
	// Only trimMemory collects here, as at an idle agent between cycles.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	runtime.GC()
	trimMemory()
	if trimMemory() {
		t.Error("collected a heap without garbage")
	}
	for range 2 * collectAbove / 4096 {
		sink = append(sink, make([]byte, 4096))
	}
	sink = nil // all garbage now
	if !trimMemory() {
		t.Fatal("12 MiB of garbage were left in the heap")
	}
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
	rtmetrics.Read(s)
	if objects, live := s[0].Value.Uint64(), s[1].Value.Uint64(); objects > live+collectAbove {
		t.Errorf("after the trim the heap holds %d bytes of objects, %d of them live", objects, live)
	}
}
