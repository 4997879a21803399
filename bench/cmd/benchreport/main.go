// Command benchreport turns the raw rows a benchmark script measured into
// medians, ratios to a baseline case, a markdown table and an SVG chart. It
// is shared by every benchmark under bench/ so they all report the same way.
//
// Input (results.json): a JSON array of raw rows
//
//	{"case": "redirect-peer", "metric": "tcp_rr_p50", "unit": "us", "value": 28.7, "rep": 1, "n": 0}
//
// ("n" is optional: a scale such as the number of services). Output, next to
// the input: medians.json (rows {case, n, metric, unit, value, reps}),
// results.md and chart.svg.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

func main() {
	var (
		in       = flag.String("in", "", "raw results.json")
		title    = flag.String("title", "Benchmark", "report title")
		baseline = flag.String("baseline", "", "case the ratios are computed against")
		commands = flag.String("commands", "", "file with the commands the benchmark ran (quoted in the report)")
		notes    = flag.String("notes", "", "file with notes/verdict lines appended to the report")
	)
	flag.Parse()
	if *in == "" {
		fmt.Fprintln(os.Stderr, "usage: benchreport -in results.json [-title T] [-baseline CASE] [-commands FILE] [-notes FILE]")
		os.Exit(2)
	}
	if err := run(*in, *title, *baseline, *commands, *notes); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func run(in, title, baseline, commandsFile, notesFile string) error {
	data, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var rows []Row
	if err := json.Unmarshal(data, &rows); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if len(rows) == 0 {
		return fmt.Errorf("%s: no rows", in)
	}
	meds := Medians(rows)
	dir := filepath.Dir(in)
	out, _ := json.MarshalIndent(meds, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "medians.json"), out, 0o644); err != nil {
		return err
	}
	var commands, notes string
	if commandsFile != "" {
		b, err := os.ReadFile(commandsFile)
		if err != nil {
			return err
		}
		commands = string(b)
	}
	if notesFile != "" {
		b, err := os.ReadFile(notesFile)
		if err != nil {
			return err
		}
		notes = string(b)
	}
	md := Markdown(title, meds, baseline, header(rows), commands, notes)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "chart.svg"), []byte(Chart(title, meds)), 0o644)
}

// header describes when and where the numbers were measured.
func header(rows []Row) string {
	reps := 0
	for _, r := range rows {
		reps = max(reps, r.Rep)
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("Measured %s on %s, kernel %s, %d CPUs; %d repetitions, medians shown.",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), cpuModel(), strings.TrimSpace(string(kernel)), runtime.NumCPU(), reps)
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
