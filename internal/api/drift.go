package api

import (
	"time"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// PathVerify is where `shunt sync --verify` asks the agent to compare the
// kernel's maps with the desired state now (POST; ?dryRun=true only
// reports).
const PathVerify = "/v1/sync/verify"

// VerifyResponse answers PathVerify: what differed (Entries), and per map
// what was repaired (none with DryRun).
type VerifyResponse struct {
	dpinfo.DriftReport
	DryRun bool `json:"dryRun"`
}

// DriftStatus is the agent's drift checks, for `shunt status`.
type DriftStatus struct {
	// PeriodSeconds is how often the agent compares (0: only on demand,
	// `shunt sync --verify`).
	PeriodSeconds float64   `json:"periodSeconds"`
	Checks        int       `json:"checks"`              // comparisons since the agent started
	LastCheck     time.Time `json:"lastCheck,omitzero"`  // when the last one ran
	LastTookMs    float64   `json:"lastTookMs"`          // and how long it took
	LastError     string    `json:"lastError,omitempty"` // how it failed ("": it did not)
	// Repaired counts the entries rewritten or deleted since the agent
	// started, by map.
	Repaired map[string]int `json:"repaired,omitempty"`
}
