package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// Row is one raw measurement.
type Row struct {
	Case   string  `json:"case"`
	N      int     `json:"n,omitempty"`
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	Value  float64 `json:"value"`
	Rep    int     `json:"rep,omitempty"`
}

// Median is the median over repetitions of one (case, n, metric).
type Median struct {
	Case   string  `json:"case"`
	N      int     `json:"n,omitempty"`
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	Value  float64 `json:"value"`
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
		out = append(out, Median{k.Case, k.N, k.Metric, units[k], median(values[k]), len(values[k])})
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// lowerIsBetter says how to read a metric: latencies and times go down.
func lowerIsBetter(unit string) bool {
	switch unit {
	case "us", "ms", "s":
		return true
	}
	return false
}

// layout extracts the distinct cases, ns and metrics in order.
func layout(meds []Median) (cases []string, ns []int, metrics []string, units map[string]string, val map[key]float64) {
	units, val = map[string]string{}, map[key]float64{}
	for _, m := range meds {
		if !slices.Contains(cases, m.Case) {
			cases = append(cases, m.Case)
		}
		if !slices.Contains(ns, m.N) {
			ns = append(ns, m.N)
		}
		if !slices.Contains(metrics, m.Metric) {
			metrics = append(metrics, m.Metric)
		}
		units[m.Metric] = m.Unit
		val[key{m.Case, m.N, m.Metric}] = m.Value
	}
	sort.Ints(ns)
	return
}

// Markdown renders one table row per (case, n) with every metric's median
// and, when a baseline is named, its ratio to the baseline at the same n.
func Markdown(title string, meds []Median, baseline, header, commands, notes string) string {
	cases, ns, metrics, units, val := layout(meds)
	scaled := len(ns) > 1 || ns[0] != 0
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n%s\n\n", title, header)
	cols := []string{"case"}
	if scaled {
		cols = append(cols, "n")
	}
	for _, m := range metrics {
		cols = append(cols, fmt.Sprintf("%s (%s)", m, units[m]))
		if baseline != "" {
			cols = append(cols, "× "+baseline)
		}
	}
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, n := range ns {
		for _, c := range cases {
			if !hasAny(val, c, n, metrics) {
				continue
			}
			cells := []string{c}
			if scaled {
				cells = append(cells, fmt.Sprint(n))
			}
			for _, m := range metrics {
				v, ok := val[key{c, n, m}]
				if !ok {
					cells = append(cells, "—")
				} else {
					cells = append(cells, format(v))
				}
				if baseline != "" {
					base, bok := val[key{baseline, n, m}]
					if ok && bok && base != 0 {
						cells = append(cells, fmt.Sprintf("%.2f", v/base))
					} else {
						cells = append(cells, "—")
					}
				}
			}
			fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
		}
	}
	if baseline != "" {
		b.WriteString("\nRatios are to `" + baseline + "` at the same scale; for latencies lower is better, for throughput and rates higher is better.\n")
	}
	if notes != "" {
		b.WriteString("\n" + strings.TrimSpace(notes) + "\n")
	}
	if commands != "" {
		b.WriteString("\nCommands:\n\n```sh\n" + strings.TrimSpace(commands) + "\n```\n")
	}
	return b.String()
}

func hasAny(val map[key]float64, c string, n int, metrics []string) bool {
	for _, m := range metrics {
		if _, ok := val[key{c, n, m}]; ok {
			return true
		}
	}
	return false
}

func format(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
