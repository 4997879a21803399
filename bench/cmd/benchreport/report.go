package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// Row is one raw measurement: one metric of one case (at scale N) in one
// repetition.
type Row struct {
	Case   string  `json:"case"`
	N      int     `json:"n,omitempty"`
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	Value  float64 `json:"value"`
	Rep    int     `json:"rep,omitempty"`
}

// Median is the median over repetitions of one (case, n, metric), with the
// smallest and largest repetition so the spread stays visible.
type Median struct {
	Case   string  `json:"case"`
	N      int     `json:"n,omitempty"`
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	Value  float64 `json:"value"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Reps   int     `json:"reps"`
}

type key struct {
	Case   string
	N      int
	Metric string
}

// Medians groups rows and keeps first-seen order of cases and metrics,
// which is the order the benchmark script chose to present them.
func Medians(rows []Row) []Median {
	values := map[key][]float64{}
	units := map[key]string{}
	var order []key
	for _, r := range rows {
		k := key{r.Case, r.N, r.Metric}
		if _, ok := values[k]; !ok {
			order = append(order, k)
		}
		values[k] = append(values[k], r.Value)
		units[k] = r.Unit
	}
	out := make([]Median, 0, len(order))
	for _, k := range order {
		v := values[k]
		out = append(out, Median{k.Case, k.N, k.Metric, units[k], median(v), slices.Min(v), slices.Max(v), len(v)})
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// lowerIsBetter says how to read a metric: latencies, times and memory go
// down, throughputs and rates go up.
func lowerIsBetter(unit string) bool {
	switch unit {
	case "ns", "us", "µs", "ms", "s", "KiB", "MiB", "GiB":
		return true
	}
	return false
}

// displayUnit spells a unit for people ("us" is what scripts can type).
func displayUnit(unit string) string {
	if unit == "us" {
		return "µs"
	}
	return unit
}

// table is the medians indexed for rendering.
type table struct {
	cases   []string
	ns      []int
	metrics []string
	units   map[string]string
	val     map[key]Median
}

// scaled says whether the rows carry a scale n (one row per (case, n)).
func (t table) scaled() bool { return len(t.ns) > 1 || (len(t.ns) == 1 && t.ns[0] != 0) }

func (t table) get(c string, n int, m string) (Median, bool) {
	v, ok := t.val[key{c, n, m}]
	return v, ok
}

// layout extracts the distinct cases, ns and metrics in order.
func layout(meds []Median) table {
	t := table{units: map[string]string{}, val: map[key]Median{}}
	for _, m := range meds {
		if !slices.Contains(t.cases, m.Case) {
			t.cases = append(t.cases, m.Case)
		}
		if !slices.Contains(t.ns, m.N) {
			t.ns = append(t.ns, m.N)
		}
		if !slices.Contains(t.metrics, m.Metric) {
			t.metrics = append(t.metrics, m.Metric)
		}
		t.units[m.Metric] = m.Unit
		t.val[key{m.Case, m.N, m.Metric}] = m
	}
	sort.Ints(t.ns)
	return t
}

// Ratio is value / baseline value of the same metric at the same n; ok is
// false when either is missing or the baseline is zero.
func Ratio(meds []Median, baseline string, m Median) (float64, bool) {
	for _, b := range meds {
		if b.Case == baseline && b.N == m.N && b.Metric == m.Metric {
			if b.Value == 0 {
				return 0, false
			}
			return m.Value / b.Value, true
		}
	}
	return 0, false
}

// Report is everything results.md shows besides the numbers.
type Report struct {
	Title    string
	Baseline string   // case the ratio columns divide by ("" for none)
	Header   []string // "Key: value" lines (date, machine, repetitions)
	Verdict  string   // one line, may be empty
	Notes    string   // free markdown appended after the table
	Commands string   // the commands the benchmark ran, quoted verbatim
	// Compare: pairs of cases (A, B) shown side by side per metric with
	// A / B, e.g. one dataplane's two modes measured in the same run.
	Compare [][2]string
	// Rows: the raw rows, for the per-repetition table of the metrics in
	// Paired that have steal rows (steal.go); QuietStealMs: the steal a
	// quiet repetition stays within.
	Rows         []Row
	Paired       []string
	QuietStealMs float64
}

// Markdown renders one table row per (case, n) with every metric's median
// and, when a baseline is named, its ratio to the baseline at the same n.
func Markdown(r Report, meds []Median) string {
	t := layout(meds)
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", r.Title)
	for _, h := range r.Header {
		fmt.Fprintf(&b, "- %s\n", h)
	}
	if r.Verdict != "" {
		fmt.Fprintf(&b, "- **Verdict:** %s\n", r.Verdict)
	}
	if len(r.Header) > 0 || r.Verdict != "" {
		b.WriteString("\n")
	}
	cols := []string{"case"}
	if t.scaled() {
		cols = append(cols, "n")
	}
	for _, m := range t.metrics {
		cols = append(cols, fmt.Sprintf("%s (%s)", m, displayUnit(t.units[m])))
		if r.Baseline != "" && !isSteal(m) {
			cols = append(cols, "× "+r.Baseline)
		}
	}
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, n := range t.ns {
		for _, c := range t.cases {
			if !hasAny(t, c, n) {
				continue
			}
			cells := []string{c}
			if t.scaled() {
				cells = append(cells, fmt.Sprint(n))
			}
			for _, m := range t.metrics {
				v, ok := t.get(c, n, m)
				if !ok {
					cells = append(cells, "—")
				} else {
					cells = append(cells, format(v.Value))
				}
				if r.Baseline != "" && !isSteal(m) {
					if q, qok := Ratio(meds, r.Baseline, v); ok && qok {
						cells = append(cells, fmt.Sprintf("%.2f", q))
					} else {
						cells = append(cells, "—")
					}
				}
			}
			fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
		}
	}
	if r.Baseline != "" {
		scale := ""
		if t.scaled() {
			scale = " at the same n"
		}
		fmt.Fprintf(&b, "\nMedians over the repetitions; `× %s` is the ratio to `%s`%s, measured in the same run. Latencies, times and memory: lower is better; throughputs and rates: higher is better. medians.json also holds each median's min and max.\n", r.Baseline, r.Baseline, scale)
	}
	b.WriteString(stealPairs(r.Rows, t.cases, r.Baseline, r.Paired, r.QuietStealMs))
	for _, pair := range r.Compare {
		b.WriteString(comparison(t, pair[0], pair[1]))
	}
	if r.Notes != "" {
		b.WriteString("\n" + strings.TrimSpace(r.Notes) + "\n")
	}
	if r.Commands != "" {
		b.WriteString("\nCommands:\n\n```sh\n" + strings.TrimSpace(r.Commands) + "\n```\n")
	}
	return b.String()
}

// comparison is the table of case a beside case b: per metric (and n)
// both medians and a / b, with which way is better, since a ratio of a
// latency and one of a rate read the opposite way.
func comparison(t table, a, b string) string {
	var w strings.Builder
	fmt.Fprintf(&w, "\n`%s` beside `%s`, measured in the same run:\n\n", a, b)
	cols := []string{"metric"}
	if t.scaled() {
		cols = append(cols, "n")
	}
	cols = append(cols, a, b, a+" / "+b)
	fmt.Fprintf(&w, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, n := range t.ns {
		for _, m := range t.metrics {
			va, okA := t.get(a, n, m)
			vb, okB := t.get(b, n, m)
			if !okA || !okB {
				continue
			}
			cells := []string{fmt.Sprintf("%s (%s, %s)", m, displayUnit(t.units[m]), direction(t.units[m]))}
			if t.scaled() {
				cells = append(cells, fmt.Sprint(n))
			}
			ratio := "—"
			if vb.Value != 0 && !isSteal(m) {
				ratio = fmt.Sprintf("%.2f", va.Value/vb.Value)
			}
			cells = append(cells, format(va.Value), format(vb.Value), ratio)
			fmt.Fprintf(&w, "| %s |\n", strings.Join(cells, " | "))
		}
	}
	return w.String()
}

// direction says which way a metric of unit is better.
func direction(unit string) string {
	if lowerIsBetter(unit) {
		return "lower is better"
	}
	return "higher is better"
}

func hasAny(t table, c string, n int) bool {
	for _, m := range t.metrics {
		if _, ok := t.get(c, n, m); ok {
			return true
		}
	}
	return false
}

// Verdict names, per metric, the best case (leaving out floors such as
// loopback, which are references rather than contenders) and how it
// compares with the baseline; metrics won by the same case share a clause.
// With a scale n it judges the largest n. When the winner's range over the
// repetitions overlaps the runner-up's, it says so: that ranking is noise.
func Verdict(meds []Median, baseline string, floors []string) string {
	t := layout(meds)
	if len(t.ns) == 0 {
		return ""
	}
	n := t.ns[len(t.ns)-1]
	var winners []string
	clauses := map[string][]string{}
	for _, m := range t.metrics {
		if isSteal(m) {
			continue
		}
		var cands []Median
		for _, c := range t.cases {
			if v, ok := t.get(c, n, m); ok && !slices.Contains(floors, c) && !math.IsNaN(v.Value) {
				cands = append(cands, v)
			}
		}
		if len(cands) < 2 {
			continue
		}
		lower := lowerIsBetter(t.units[m])
		sort.SliceStable(cands, func(i, j int) bool {
			if lower {
				return cands[i].Value < cands[j].Value
			}
			return cands[i].Value > cands[j].Value
		})
		best, second := cands[0], cands[1]
		word := "highest"
		if lower {
			word = "lowest"
		}
		var detail []string
		if q, ok := Ratio(meds, baseline, best); ok && best.Case != baseline {
			if lower && q <= 1 {
				detail = append(detail, fmt.Sprintf("%.0f%% below %s", (1-q)*100, baseline))
			} else {
				detail = append(detail, fmt.Sprintf("%.2f× %s", q, baseline))
			}
		}
		if best.Reps > 1 && second.Reps > 1 && best.Min <= second.Max && second.Min <= best.Max {
			detail = append(detail, "range overlaps "+second.Case)
		}
		clause := word + " " + m
		if len(detail) > 0 {
			clause += " (" + strings.Join(detail, ", ") + ")"
		}
		if _, ok := clauses[best.Case]; !ok {
			winners = append(winners, best.Case)
		}
		clauses[best.Case] = append(clauses[best.Case], clause)
	}
	if len(winners) == 0 {
		return ""
	}
	var parts []string
	for _, w := range winners {
		parts = append(parts, w+": "+strings.Join(clauses[w], ", "))
	}
	v := strings.Join(parts, "; ")
	if len(t.ns) > 1 || n != 0 {
		v = fmt.Sprintf("at n=%d, %s", n, v)
	}
	if len(floors) > 0 {
		v += " (" + strings.Join(floors, ", ") + " left out as the floor)"
	}
	return v + "."
}

func format(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case v == math.Trunc(v) && math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.1f", v)
	case math.Abs(v) >= 0.01 || v == 0:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}
