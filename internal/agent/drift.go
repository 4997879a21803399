package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/steerroute"
)

// DefaultDriftCheckPeriod is how often the agent compares the kernel's maps
// with the desired state when --drift-check-period is not given. One check
// at 10 000 Services (210 000 service and backend entries) costs ~90 ms of
// CPU, mostly the kernel walking the hash maps' buckets; an idle agent
// there already spends 0.5-0.9% of a core, so a check every 2 minutes
// (+0.07%) keeps it within 1% (bench/RESULTS.md, "Drift checks"), where
// every 30 s would not. Between kube-proxy's (a partial sync every 30 s, a
// full one every hour) and Cilium's (policy maps fully reconciled every 15
// minutes).
const DefaultDriftCheckPeriod = 2 * time.Minute

// drift is the agent's record of its drift checks (status, metrics).
type drift struct {
	mu sync.Mutex
	st api.DriftStatus
	// Metrics: entries repaired by map, checks, duration of the last.
	repaired *prometheus.CounterVec
	checks   prometheus.Counter
	took     prometheus.Gauge
}

// newDriftMetrics registers the drift metrics; every map of
// datapath.DriftMaps has its series from the start, at 0.
func newDriftMetrics(reg prometheus.Registerer) *drift {
	d := &drift{
		repaired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shunt_drift_repaired_total",
			Help: "Entries of a map the agent fully determines that differed from the desired state (missing, altered or not wanted) and were rewritten or deleted; proxy-steer-routing: the node proxy's steering rule or route, put back.",
		}, []string{"map"}),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shunt_drift_checks_total",
			Help: "Comparisons of the kernel's maps with the desired state (periodic and on demand).",
		}),
		took: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shunt_drift_check_duration_seconds",
			Help: "How long the last comparison of the kernel's maps with the desired state took.",
		}),
	}
	for _, m := range append(slices.Clone(datapath.DriftMaps), steerroute.DriftName) {
		d.repaired.WithLabelValues(m)
	}
	reg.MustRegister(d.repaired, d.checks, d.took)
	return d
}

// record keeps what a check found.
func (d *drift) record(r datapath.DriftReport, err error) {
	d.checks.Inc()
	d.took.Set(r.Took.Seconds())
	d.mu.Lock()
	defer d.mu.Unlock()
	d.st.Checks++
	d.st.LastCheck, d.st.LastTookMs, d.st.LastError = r.Time, ms(r.Took), ""
	if err != nil {
		d.st.LastError = err.Error()
	}
	for m, n := range r.Repaired {
		if n == 0 {
			continue
		}
		d.repaired.WithLabelValues(m).Add(float64(n))
		if d.st.Repaired == nil {
			d.st.Repaired = map[string]int{}
		}
		d.st.Repaired[m] += n
	}
}

func (d *drift) status(period time.Duration) *api.DriftStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.st
	st.PeriodSeconds = period.Seconds()
	st.Repaired = maps.Clone(st.Repaired)
	return &st
}

// verifyDrift compares the maps between two syncs and, with repair, makes
// them what the last sync wrote.
func (a *Agent) verifyDrift(repair bool) (datapath.DriftReport, error) {
	var r datapath.DriftReport
	var err error
	a.rec.Exclusive(func() { r, err = a.dp.VerifyMaps(repair) })
	err = errors.Join(err, a.verifySteerRouting(&r, repair))
	a.metrics.drift.record(r, err)
	if r.Differs() {
		a.logDrift(r, repair)
	}
	return r, err
}

// logDrift names what differed: the maps with their counts, and the first
// entries.
func (a *Agent) logDrift(r datapath.DriftReport, repaired bool) {
	counts := r.DifferingByMap()
	msg := "maps differed from the desired state; repaired"
	if !repaired {
		msg = "maps differ from the desired state (dry run: left as they are)"
	}
	a.log.Warn(msg, "entries", len(r.Entries), "maps", strings.Join(counts, ", "))
	for i, e := range r.Entries {
		if i == 10 {
			a.log.Warn("drift: more entries differ", "left out", len(r.Entries)-i)
			break
		}
		a.log.Warn("drift", "map", e.Map, "key", e.Key, "expected", orNone(e.Expected), "found", orNone(e.Found))
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// runDriftChecks compares and repairs every period until ctx ends (period
// 0: never).
func (a *Agent) runDriftChecks(ctx context.Context) {
	period := a.cfg.DriftCheckPeriod
	if period <= 0 {
		return
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := a.verifyDrift(true); err != nil {
				a.log.Error("drift check", "err", err)
			}
		}
	}
}

// handleVerify compares now (`shunt sync --verify`): repairs unless
// ?dryRun=true, and answers with what differed.
func (a *Agent) handleVerify(w http.ResponseWriter, r *http.Request) {
	if !a.ready.Load() {
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("agent %s is starting", a.cfg.Instance.Name))
		return
	}
	dry := r.URL.Query().Get("dryRun") == "true"
	rep, err := a.verifyDrift(!dry)
	if err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("comparing the maps with the desired state: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, api.VerifyResponse{DriftReport: rep, DryRun: dry})
}
