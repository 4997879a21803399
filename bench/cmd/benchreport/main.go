// Command benchreport turns the raw rows a benchmark script measured into
// medians, ratios to a baseline case, a markdown table and an SVG chart. It
// is shared by every benchmark under bench/ so they all report the same way.
// Standard library only.
//
// Input (results.json): a JSON array of raw rows, one per measurement
//
//	{"case": "redirect-peer", "metric": "tcp_rr_p50", "unit": "us", "value": 28.7, "rep": 1}
//
// with an optional integer "n" (a scale such as the number of services or
// rules). Output, in the same folder:
//
//   - medians.json: rows {case, n, metric, unit, value, min, max, reps}, value
//     being the median over the repetitions (n omitted when 0);
//   - results.md: header (date, machine, repetitions, verdict), one table
//     row per (case, n) with each metric's median and its ratio to the
//     baseline, each -compare pair's ratios metric by metric, notes, the
//     commands run;
//   - chart.svg: one panel per metric, bars per case, or lines against n.
//
// Units decide how a metric reads: ns/us/ms/s and KiB/MiB/GiB lower is
// better, anything else (Gbit/s, conn/s, ...) higher is better.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.in, "in", "", "raw results.json (required)")
	flag.StringVar(&o.title, "title", "Benchmark", "report title")
	flag.StringVar(&o.baseline, "baseline", "", "case the ratio columns divide by")
	flag.StringVar(&o.commands, "commands", "", "file with the commands the benchmark ran, quoted in the report")
	flag.StringVar(&o.notes, "notes", "", "markdown file appended after the table")
	flag.StringVar(&o.verdict, "verdict", "", `one-line verdict for the header; "auto": computed (best case per metric vs the baseline)`)
	flag.StringVar(&o.floor, "floor", "", "comma-separated cases the auto verdict leaves out (references such as loopback)")
	flag.StringVar(&o.paired, "paired", "", "comma-separated metrics shown per repetition against the baseline beside the steal rows that cover them (METRIC_steal, PREFIX_steal or steal)")
	flag.Float64Var(&o.quietSteal, "quiet-steal", 100, "steal (ms) both runs of a pair stay within for the -paired table to count their repetition as quiet")
	flag.StringVar(&o.compare, "compare", "", "comma-separated pairs A/B of cases compared metric by metric after the table (A's median / B's, same n): two modes of one dataplane measured in the same run")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: benchreport -in results.json [-title T] [-baseline CASE] [-commands FILE] [-notes FILE] [-verdict auto|TEXT] [-floor CASES] [-compare A/B,...] [-paired METRICS [-quiet-steal MS]]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if o.in == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

type options struct {
	in, title, baseline, commands, notes, verdict, floor, compare, paired string
	quietSteal                                                            float64
}

func run(o options) error {
	data, err := os.ReadFile(o.in)
	if err != nil {
		return err
	}
	var rows []Row
	if err := json.Unmarshal(data, &rows); err != nil {
		return fmt.Errorf("%s: %w", o.in, err)
	}
	if len(rows) == 0 {
		return fmt.Errorf("%s: no rows", o.in)
	}
	for i, r := range rows {
		if r.Case == "" || r.Metric == "" {
			return fmt.Errorf("%s: row %d has no case or metric", o.in, i)
		}
	}
	meds := Medians(rows)
	if o.baseline != "" && !slices.ContainsFunc(meds, func(m Median) bool { return m.Case == o.baseline }) {
		return fmt.Errorf("baseline %q is not a case in %s", o.baseline, o.in)
	}
	dir := filepath.Dir(o.in)
	out, err := json.MarshalIndent(meds, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "medians.json"), append(out, '\n'), 0o644); err != nil {
		return err
	}
	r := Report{Title: o.title, Baseline: o.baseline, Header: header(rows), Rows: rows, QuietStealMs: o.quietSteal}
	for _, m := range strings.Split(o.paired, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if !slices.ContainsFunc(meds, func(x Median) bool { return x.Metric == m }) {
			return fmt.Errorf("-paired: %q is not a metric in %s", m, o.in)
		}
		r.Paired = append(r.Paired, m)
	}
	for _, pair := range strings.Split(o.compare, ",") {
		if pair = strings.TrimSpace(pair); pair == "" {
			continue
		}
		a, b, ok := strings.Cut(pair, "/")
		if !ok || a == "" || b == "" {
			return fmt.Errorf("-compare %q: give pairs of cases A/B", pair)
		}
		for _, c := range []string{a, b} {
			if !slices.ContainsFunc(meds, func(m Median) bool { return m.Case == c }) {
				return fmt.Errorf("-compare %s: %q is not a case in %s", pair, c, o.in)
			}
		}
		r.Compare = append(r.Compare, [2]string{a, b})
	}
	if r.Commands, err = readOptional(o.commands); err != nil {
		return err
	}
	if r.Notes, err = readOptional(o.notes); err != nil {
		return err
	}
	switch o.verdict {
	case "auto":
		var floors []string
		if o.floor != "" {
			floors = strings.Split(o.floor, ",")
		}
		r.Verdict = Verdict(meds, o.baseline, floors)
	default:
		r.Verdict = strings.TrimSpace(o.verdict)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(Markdown(r, meds)), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "chart.svg"), []byte(Chart(o.title, meds, o.baseline)), 0o644)
}

func readOptional(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	return string(b), err
}

// header describes when and where the numbers were measured.
func header(rows []Row) []string {
	var reps []int
	for _, r := range rows {
		if !slices.Contains(reps, r.Rep) {
			reps = append(reps, r.Rep)
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return []string{
		"Date: " + time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		fmt.Sprintf("Machine: %s, %d CPUs (nproc), kernel %s (uname -r)", cpuModel(), runtime.NumCPU(), strings.TrimSpace(string(kernel))),
		fmt.Sprintf("Repetitions: %d; every number is the median over them", len(reps)),
	}
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.Index(l, ":"); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return "unknown CPU"
}
