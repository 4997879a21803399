package dpinfo

import "time"

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
