package dpinfo

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// DriftEntry is one entry the kernel holds otherwise than the agent wrote
// it, in the readable form of `shunt map dump`.
type DriftEntry struct {
	Map      string `json:"map"`
	Key      string `json:"key"`
	Expected string `json:"expected,omitempty"` // "": the entry should not exist
	Found    string `json:"found,omitempty"`    // "": the entry is missing
}

// DriftReport is what one comparison found.
type DriftReport struct {
	Time     time.Time         `json:"time"`
	Took     time.Duration     `json:"took"`
	Checked  map[string]int    `json:"checked"` // entries expected, by map
	Entries  []DriftEntry      `json:"entries,omitempty"`
	Repaired map[string]int    `json:"repaired,omitempty"` // entries rewritten or deleted, by map
	Skipped  map[string]string `json:"skipped,omitempty"`  // maps not compared, and why
}

// Differs says whether anything differed.
func (r DriftReport) Differs() bool { return len(r.Entries) > 0 }

// DifferingByMap says how many entries differed in each map, "MAP N", by
// map name: the summary `shunt sync --verify` prints and the agent logs.
func (r DriftReport) DifferingByMap() []string {
	per := map[string]int{}
	for _, e := range r.Entries {
		per[e.Map]++
	}
	var counts []string
	for _, m := range slices.Sorted(maps.Keys(per)) {
		counts = append(counts, fmt.Sprintf("%s %d", m, per[m]))
	}
	return counts
}
