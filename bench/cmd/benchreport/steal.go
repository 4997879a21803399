package main

import (
	"fmt"
	"slices"
	"strings"
)

// Steal rows. A metric named P_steal (ms) is the CPU time the hypervisor
// took from the machine while the metrics P and P_* were measured in that
// repetition (/proc/stat's steal; "steal" alone covers every metric of its
// case). On a shared host it moves rates and tails more than most code
// changes do, so
// the report reads ratios against it: a ratio to the baseline is a median
// over repetitions some of which the host interrupted, and the paired
// table below says which.

// isSteal says whether metric holds steal rather than a result: it has no
// ratio and no winner.
func isSteal(metric string) bool { return metric == "steal" || strings.HasSuffix(metric, "_steal") }

type repKey struct {
	Case, Metric string
	N, Rep       int
}

// stealOf is the steal metric that covers metric m: m_steal, or the
// steal of the longest prefix of m ending before a "_" (rr_remote_steal
// covers rr_remote_p50), or "steal"; has says which metrics have rows.
func stealOf(m string, has func(string) bool) (string, bool) {
	for p := m; ; {
		if has(p + "_steal") {
			return p + "_steal", true
		}
		i := strings.LastIndexByte(p, '_')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return "steal", has("steal")
}

// stealPairs is the table of each case's ratio to the baseline per
// repetition (the two measured in the same repetition), for each metric
// of paired that has steal rows, beside both runs' steal, and the median
// ratio over all repetitions and over the quiet ones: those in which the
// host took at most quietMs from either run.
func stealPairs(rows []Row, cases []string, baseline string, paired []string, quietMs float64) string {
	if baseline == "" || len(paired) == 0 {
		return ""
	}
	at := map[repKey]float64{}
	units := map[string]string{}
	type group struct {
		Case, Metric string
		N            int
	}
	var groups []group
	var reps []int
	for _, r := range rows {
		at[repKey{r.Case, r.Metric, r.N, r.Rep}] = r.Value
		units[r.Metric] = r.Unit
		if !slices.Contains(reps, r.Rep) {
			reps = append(reps, r.Rep)
		}
	}
	slices.Sort(reps)
	stealMetric := map[string]string{}
	for _, m := range paired {
		if s, ok := stealOf(m, func(name string) bool { _, ok := units[name]; return ok }); ok {
			stealMetric[m] = s
		}
	}
	for _, r := range rows {
		g := group{r.Case, r.Metric, r.N}
		if _, ok := stealMetric[r.Metric]; ok && r.Case != baseline && !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	if len(groups) == 0 {
		return ""
	}
	// By n, then metric as -paired lists them, then case as the main
	// table orders them (cases).
	slices.SortStableFunc(groups, func(a, b group) int {
		if a.N != b.N {
			return a.N - b.N
		}
		if d := slices.Index(paired, a.Metric) - slices.Index(paired, b.Metric); d != 0 {
			return d
		}
		return slices.Index(cases, a.Case) - slices.Index(cases, b.Case)
	})
	var w strings.Builder
	fmt.Fprintf(&w, "\nPer repetition, each case over `%s` measured in the same repetition, with the CPU the host took from this machine during each of the two runs (steal, ms: case / %s). A quiet repetition is one where both runs lost at most %.0f ms; on a shared host the quiet median is the one to trust, the other repetitions measure the neighbours too.\n\n", baseline, baseline, quietMs)
	scaled := slices.ContainsFunc(groups, func(g group) bool { return g.N != 0 })
	cols := []string{"case"}
	if scaled {
		cols = append(cols, "n")
	}
	cols = append(cols, "metric")
	for _, rep := range reps {
		cols = append(cols, fmt.Sprintf("rep %d", rep))
	}
	cols = append(cols, "median", "quiet reps", "quiet median")
	fmt.Fprintf(&w, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, g := range groups {
		cells := []string{g.Case}
		if scaled {
			cells = append(cells, fmt.Sprint(g.N))
		}
		cells = append(cells, fmt.Sprintf("%s (%s)", g.Metric, direction(units[g.Metric])))
		var all, quiet []float64
		for _, rep := range reps {
			v, okV := at[repKey{g.Case, g.Metric, g.N, rep}]
			base, okB := at[repKey{baseline, g.Metric, g.N, rep}]
			sv, okS := at[repKey{g.Case, stealMetric[g.Metric], g.N, rep}]
			sb, okSB := at[repKey{baseline, stealMetric[g.Metric], g.N, rep}]
			if !okV || !okB || !okS || !okSB || base == 0 {
				cells = append(cells, "—")
				continue
			}
			q := v / base
			all = append(all, q)
			mark := ""
			if sv <= quietMs && sb <= quietMs {
				quiet = append(quiet, q)
				mark = "*"
			}
			cells = append(cells, fmt.Sprintf("%.2f%s (%.0f / %.0f)", q, mark, sv, sb))
		}
		quietMed := "—"
		if len(quiet) > 0 {
			quietMed = fmt.Sprintf("%.2f", median(quiet))
		}
		allMed := "—"
		if len(all) > 0 {
			allMed = fmt.Sprintf("%.2f", median(all))
		}
		cells = append(cells, allMed, fmt.Sprintf("%d of %d", len(quiet), len(all)), quietMed)
		fmt.Fprintf(&w, "| %s |\n", strings.Join(cells, " | "))
	}
	w.WriteString("\n`*`: a quiet repetition. The median of per-repetition ratios can differ from the ratio of the medians in the table above.\n")
	return w.String()
}
