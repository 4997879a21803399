package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{5}, 5},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{100, 29, 30}, 30}, // an outlier does not move it
	} {
		in := append([]float64(nil), c.in...)
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Fatalf("median reordered its input: %v", c.in)
			}
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing is not NaN")
	}
}

var fwdRows = []Row{
	{Case: "bridge", Metric: "p50", Unit: "us", Value: 40, Rep: 1},
	{Case: "bridge", Metric: "p50", Unit: "us", Value: 44, Rep: 2},
	{Case: "bridge", Metric: "p50", Unit: "us", Value: 42, Rep: 3},
	{Case: "peer", Metric: "p50", Unit: "us", Value: 30, Rep: 1},
	{Case: "peer", Metric: "p50", Unit: "us", Value: 29, Rep: 2},
	{Case: "peer", Metric: "p50", Unit: "us", Value: 100, Rep: 3},
	{Case: "peer", Metric: "gbps", Unit: "Gbit/s", Value: 20, Rep: 1},
	{Case: "peer", Metric: "gbps", Unit: "Gbit/s", Value: 22, Rep: 2},
}

func TestMediansKeepOrderAndSpread(t *testing.T) {
	meds := Medians(fwdRows)
	want := []Median{
		{Case: "bridge", Metric: "p50", Unit: "us", Value: 42, Min: 40, Max: 44, Reps: 3},
		{Case: "peer", Metric: "p50", Unit: "us", Value: 30, Min: 29, Max: 100, Reps: 3},
		{Case: "peer", Metric: "gbps", Unit: "Gbit/s", Value: 21, Min: 20, Max: 22, Reps: 2},
	}
	if len(meds) != len(want) {
		t.Fatalf("got %d medians, want %d: %+v", len(meds), len(want), meds)
	}
	for i := range want {
		if meds[i] != want[i] {
			t.Errorf("median %d = %+v, want %+v", i, meds[i], want[i])
		}
	}
}

func TestRatio(t *testing.T) {
	meds := Medians(fwdRows)
	if q, ok := Ratio(meds, "bridge", meds[1]); !ok || math.Abs(q-30.0/42) > 1e-12 {
		t.Errorf("peer/bridge p50 = %v %v", q, ok)
	}
	if _, ok := Ratio(meds, "bridge", meds[2]); ok {
		t.Error("ratio without a baseline value")
	}
	zero := []Median{{Case: "b", Metric: "m", Value: 0}, {Case: "a", Metric: "m", Value: 3}}
	if _, ok := Ratio(zero, "b", zero[1]); ok {
		t.Error("ratio to a zero baseline")
	}
}

func TestMarkdownTable(t *testing.T) {
	meds := Medians(fwdRows)
	md := Markdown(Report{Title: "T", Baseline: "bridge", Header: []string{"Date: now"}, Verdict: "peer wins.", Commands: "bench/run x\n", Notes: "a note"}, meds)
	for _, s := range []string{
		"# T\n\n- Date: now\n- **Verdict:** peer wins.\n\n",
		"| case | p50 (µs) | × bridge | gbps (Gbit/s) | × bridge |\n|---|---|---|---|---|\n",
		"| bridge | 42.00 | 1.00 | — | — |\n",
		"| peer | 30.00 | 0.71 | 21.00 | — |\n",
		"\na note\n",
		"```sh\nbench/run x\n```",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	if strings.Contains(md, "| n |") {
		t.Error("unscaled table has an n column")
	}
	noBase := Markdown(Report{Title: "T"}, meds)
	if strings.Contains(noBase, "×") || !strings.Contains(noBase, "| case | p50 (µs) | gbps (Gbit/s) |") {
		t.Errorf("table without baseline:\n%s", noBase)
	}
}

func TestVerdict(t *testing.T) {
	rows := []Row{}
	add := func(c, m, unit string, vs ...float64) {
		for i, v := range vs {
			rows = append(rows, Row{Case: c, Metric: m, Unit: unit, Value: v, Rep: i + 1})
		}
	}
	add("loopback", "p50", "us", 20, 20, 20)
	add("bridge", "p50", "us", 40, 40, 40)
	add("peer", "p50", "us", 30, 31, 29)
	add("redirect", "p50", "us", 35, 36, 34)
	add("loopback", "tput", "Gbit/s", 40, 40, 40)
	add("bridge", "tput", "Gbit/s", 10, 10, 10)
	add("peer", "tput", "Gbit/s", 15, 14, 16)
	add("redirect", "tput", "Gbit/s", 16, 15, 17)
	got := Verdict(Medians(rows), "bridge", []string{"loopback"})
	want := "peer: lowest p50 (25% below bridge); redirect: highest tput (1.60× bridge, range overlaps peer) (loopback left out as the floor)."
	if got != want {
		t.Errorf("verdict\n got %q\nwant %q", got, want)
	}
	// Without floors loopback wins both; the baseline winning says no ratio.
	if got := Verdict(Medians(rows), "loopback", nil); got != "loopback: lowest p50, highest tput." {
		t.Errorf("verdict with loopback as baseline: %q", got)
	}
}

func TestMemoryIsLowerBetter(t *testing.T) {
	rows := []Row{
		{Case: "sidecars", Metric: "rss", Unit: "MiB", Value: 2000, Rep: 1},
		{Case: "node-proxy", Metric: "rss", Unit: "MiB", Value: 40, Rep: 1},
	}
	if got, want := Verdict(Medians(rows), "", nil), "node-proxy: lowest rss."; got != want {
		t.Errorf("verdict %q, want %q", got, want)
	}
}

func TestScaledTableVerdictAndLines(t *testing.T) {
	rows := []Row{
		{Case: "a", N: 0, Metric: "rate", Unit: "conn/s", Value: 10},
		{Case: "a", N: 100, Metric: "rate", Unit: "conn/s", Value: 8},
		{Case: "b", N: 0, Metric: "rate", Unit: "conn/s", Value: 5},
		{Case: "b", N: 100, Metric: "rate", Unit: "conn/s", Value: 4},
		{Case: "b", N: 100, Metric: "load", Unit: "s", Value: 2},
	}
	meds := Medians(rows)
	md := Markdown(Report{Title: "T", Baseline: "a"}, meds)
	for _, s := range []string{
		"| case | n | rate (conn/s) | × a | load (s) | × a |",
		"| a | 0 | 10.00 | 1.00 | — | — |",
		"| b | 100 | 4.00 | 0.50 | 2.00 | — |",
		"at the same n",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("scaled table lacks %q:\n%s", s, md)
		}
	}
	if i, j := strings.Index(md, "| b | 0 |"), strings.Index(md, "| a | 100 |"); i < 0 || j < 0 || i > j {
		t.Errorf("rows not grouped by n:\n%s", md)
	}
	if v := Verdict(meds, "a", nil); v != "at n=100, a: highest rate." {
		t.Errorf("scaled verdict %q", v)
	}
	svg := Chart("T", meds, "a")
	if !strings.Contains(svg, "<polyline") || !strings.Contains(svg, ">n=100<") {
		t.Errorf("scaled chart has no lines or n labels:\n%s", svg)
	}
	// load has a single point: drawn as a marker, not lost.
	if !strings.Contains(svg, "<title>b n=100: 2.00</title>") {
		t.Errorf("single-point series not drawn:\n%s", svg)
	}
}

func TestBarChart(t *testing.T) {
	svg := Chart("T & co", Medians(fwdRows), "bridge")
	for _, s := range []string{"<svg", "T &amp; co", ">peer<", "30.00 µs  (0.71× bridge)", "42.00 µs  (baseline)", "stroke-dasharray", "p50 (µs, lower is better)", "gbps (Gbit/s, higher is better)"} {
		if !strings.Contains(svg, s) {
			t.Errorf("chart lacks %q", s)
		}
	}
	if !strings.HasSuffix(svg, "</svg>\n") {
		t.Error("chart not closed")
	}
}

func TestLogScaleWhenValuesSpanDecades(t *testing.T) {
	rows := []Row{
		{Case: "x", N: 1, Metric: "t", Unit: "s", Value: 0.01},
		{Case: "x", N: 10, Metric: "t", Unit: "s", Value: 90},
	}
	if svg := Chart("T", Medians(rows), ""); !strings.Contains(svg, "log scale") {
		t.Error("no log scale for values four decades apart")
	}
}

// A metric that is 0 everywhere (no long tasks in any case) drew billions
// of grid lines until the memory ran out.
func TestLinePanelAllZero(t *testing.T) {
	rows := []Row{
		{Case: "x", N: 10, Metric: "long_tasks", Unit: "count", Value: 0},
		{Case: "x", N: 100, Metric: "long_tasks", Unit: "count", Value: 0},
	}
	if svg := Chart("T", Medians(rows), ""); strings.Count(svg, "<line") > 20 {
		t.Errorf("%d grid lines for an all-zero metric", strings.Count(svg, "<line"))
	}
}

func TestRunWritesAllOutputs(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "results.json")
	data, _ := json.Marshal(fwdRows)
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cmds := filepath.Join(dir, "commands.txt")
	os.WriteFile(cmds, []byte("sockperf ping-pong ...\n"), 0o644)
	if err := run(options{in: in, title: "Fwd", baseline: "bridge", commands: cmds, verdict: "auto"}); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	for _, s := range []string{"- Date: ", "- Machine: ", "- Repetitions: 3;", "**Verdict:** peer: lowest p50 (29% below bridge, range overlaps bridge).", "sockperf ping-pong ..."} {
		if !strings.Contains(string(md), s) {
			t.Errorf("results.md lacks %q:\n%s", s, md)
		}
	}
	var meds []Median
	b, _ := os.ReadFile(filepath.Join(dir, "medians.json"))
	if err := json.Unmarshal(b, &meds); err != nil || len(meds) != 3 || meds[0].Value != 42 {
		t.Errorf("medians.json: %v %s", err, b)
	}
	if _, err := os.Stat(filepath.Join(dir, "chart.svg")); err != nil {
		t.Error(err)
	}
	if err := run(options{in: in, baseline: "nosuch"}); err == nil || !strings.Contains(err.Error(), `baseline "nosuch"`) {
		t.Errorf("unknown baseline: %v", err)
	}
}

func TestTickLabels(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 40: "40", 2000: "2000", 0.5: "0.5", 0.01: "0.01", 0.1 * 3: "0.3", 2.5e-3: "0.003"} {
		if got := tick(v); got != want {
			t.Errorf("tick(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestCompare: a -compare pair A/B is a table of A beside B per metric
// and n, with A / B and which way the metric is better; a metric one of
// them lacks is left out. run refuses a pair naming no case.
func TestCompare(t *testing.T) {
	rows := []Row{
		{Case: "snat", Metric: "rr_avg", Unit: "us", Value: 100, N: 0, Rep: 1},
		{Case: "dsr", Metric: "rr_avg", Unit: "us", Value: 80, N: 0, Rep: 1},
		{Case: "snat", Metric: "conn_rate", Unit: "conn/s", Value: 4000, N: 0, Rep: 1},
		{Case: "dsr", Metric: "conn_rate", Unit: "conn/s", Value: 5000, N: 0, Rep: 1},
		{Case: "snat", Metric: "rr_avg", Unit: "us", Value: 200, N: 1000, Rep: 1},
		{Case: "dsr", Metric: "rr_avg", Unit: "us", Value: 150, N: 1000, Rep: 1},
		{Case: "snat", Metric: "only_snat", Unit: "us", Value: 1, N: 0, Rep: 1},
	}
	md := Markdown(Report{Title: "T", Compare: [][2]string{{"dsr", "snat"}}}, Medians(rows))
	for _, s := range []string{
		"`dsr` beside `snat`, measured in the same run:",
		"| metric | n | dsr | snat | dsr / snat |\n",
		"| rr_avg (µs, lower is better) | 0 | 80.00 | 100 | 0.80 |\n",
		"| conn_rate (conn/s, higher is better) | 0 | 5000 | 4000 | 1.25 |\n",
		"| rr_avg (µs, lower is better) | 1000 | 150 | 200 | 0.75 |\n",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	if strings.Contains(md, "| only_snat (µs, ") {
		t.Errorf("a metric only one case has is compared:\n%s", md)
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "results.json")
	data, _ := json.Marshal(rows)
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"dsr/hybrid", "dsr"} {
		if err := run(options{in: in, compare: bad}); err == nil {
			t.Errorf("-compare %q accepted", bad)
		}
	}
	if err := run(options{in: in, compare: "dsr/snat"}); err != nil {
		t.Fatalf("-compare dsr/snat: %v", err)
	}
	if out, _ := os.ReadFile(filepath.Join(dir, "results.md")); !strings.Contains(string(out), "dsr / snat") {
		t.Errorf("results.md has no comparison:\n%s", out)
	}
}

// TestStealPairs: a -paired metric with steal rows gets, per repetition,
// its ratio to the baseline beside both runs' steal; the quiet median
// keeps only the repetitions where neither run lost more than the
// threshold. Steal has no ratio column and no winner.
func TestStealPairs(t *testing.T) {
	var rows []Row
	add := func(c string, rep int, rate, steal float64) {
		rows = append(rows,
			Row{Case: c, Metric: "conn_rate", Unit: "conn/s", Value: rate, N: 10, Rep: rep},
			Row{Case: c, Metric: "conn_rate_steal", Unit: "ms", Value: steal, N: 10, Rep: rep})
	}
	add("nft", 1, 4000, 10)
	add("shunt", 1, 6000, 20) // 1.50, quiet
	add("nft", 2, 4000, 900)
	add("shunt", 2, 4400, 30) // 1.10, the baseline's run was interrupted
	add("nft", 3, 5000, 50)
	add("shunt", 3, 7000, 40) // 1.40, quiet
	rows = append(rows, Row{Case: "shunt", Metric: "rr_avg", Unit: "us", Value: 50, N: 10, Rep: 1},
		Row{Case: "nft", Metric: "rr_avg", Unit: "us", Value: 60, N: 10, Rep: 1})
	meds := Medians(rows)
	md := Markdown(Report{Title: "T", Baseline: "nft", Rows: rows, Paired: []string{"conn_rate", "rr_avg"}, QuietStealMs: 100}, meds)
	for _, s := range []string{
		"| case | n | metric | rep 1 | rep 2 | rep 3 | median | quiet reps | quiet median |\n",
		"| shunt | 10 | conn_rate (higher is better) | 1.50* (20 / 10) | 1.10 (30 / 900) | 1.40* (40 / 50) | 1.40 | 2 of 3 | 1.45 |\n",
		// Steal has no ratio column.
		"| × nft | conn_rate_steal (ms) | rr_avg (µs) | × nft |\n",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	if strings.Contains(md, "| nft | 10 | conn_rate") || strings.Contains(md, "| rr_avg (lower") {
		t.Errorf("the baseline, or a metric without steal rows, is in the per-repetition table:\n%s", md)
	}
	if v := Verdict(meds, "nft", nil); strings.Contains(v, "steal") {
		t.Errorf("the verdict ranks steal: %s", v)
	}
	if Markdown(Report{Title: "T", Rows: rows, Paired: []string{"conn_rate"}, QuietStealMs: 100}, meds) != Markdown(Report{Title: "T"}, meds) {
		t.Error("without a baseline the report has a per-repetition table")
	}
}

// TestStealOf: a metric's steal is its own, its measurement's (a prefix),
// or its case's.
func TestStealOf(t *testing.T) {
	has := func(names ...string) func(string) bool {
		return func(m string) bool { return slices.Contains(names, m) }
	}
	for _, c := range []struct {
		metric string
		has    func(string) bool
		want   string
		ok     bool
	}{
		{"conn_rate_remote", has("conn_rate_remote_steal", "conn_rate_steal"), "conn_rate_remote_steal", true},
		{"rr_remote_p50", has("rr_remote_steal", "rr_local_steal"), "rr_remote_steal", true},
		{"p99", has("steal"), "steal", true},
		{"rr_remote_p50", has("rr_local_steal"), "steal", false},
	} {
		got, ok := stealOf(c.metric, c.has)
		if got != c.want || ok != c.ok {
			t.Errorf("stealOf(%q) = %q, %v; want %q, %v", c.metric, got, ok, c.want, c.ok)
		}
	}
}
