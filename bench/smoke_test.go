// Package bench holds the benchmarks (bench/NAME.sh, run by bench/run) and
// this test, which runs every one of them in smoke mode so that none rots
// unseen: a benchmark is not a test, but a benchmark that no longer runs is
// a bug.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// smokeTimeout bounds one benchmark's smoke run (they take seconds to about
// a minute; a hang must not eat the suite's 30 minutes).
const smokeTimeout = 6 * time.Minute

// TestSmoke runs `bench/run NAME --smoke` for every bench/NAME.sh (a new
// script is covered without touching this file) and checks that each wrote
// its report: results.md with a table of medians, medians.json, chart.svg.
// The output goes to a temporary BENCH_OUT, never to bench/out.
func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the benchmarks create network namespaces and load BPF programs")
	}
	if testing.Short() {
		t.Skip("-short: the benchmarks' smoke runs take about two minutes")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	scripts, err := filepath.Glob(filepath.Join(root, "bench", "*.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range scripts {
		if n := strings.TrimSuffix(filepath.Base(s), ".sh"); n != "lib" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatal("no bench/*.sh found")
	}
	// The Kubernetes binaries are built by `make kube` (make test does it
	// first); a benchmark that needs them would otherwise start a cold
	// build of 15-20 minutes.
	kubeBuilt := exec.Command(filepath.Join(root, "scripts", "kube-build.sh"), "--check").Run() == nil

	// The runs' output folders (logs, reports) are kept when a run failed.
	out, err := os.MkdirTemp("", "bench-smoke-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the runs' output is kept in %s", out)
			return
		}
		os.RemoveAll(out)
	})
	// What bench/run does before every benchmark, once for all of them.
	for _, prepare := range [][]string{{filepath.Join(root, "scripts", "setup.sh")}, {"make", "-s", "build"}} {
		cmd := exec.Command(prepare[0], prepare[1:]...)
		cmd.Dir = root
		if logs, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(prepare, " "), err, tail(logs, 20))
		}
	}
	var mu sync.Mutex
	times := map[string]time.Duration{}
	start := time.Now()
	// Lanes run at once, each its benchmarks one after another.
	// Goroutines, not t.Parallel, which -parallel (GOMAXPROCS: 2 here)
	// would cap below the lanes.
	var wg sync.WaitGroup
	for i, lane := range smokeLanes(names, smokeLaneCount) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(fmt.Sprintf("lane%d", i+1), func(t *testing.T) {
				for _, name := range lane {
					t.Run(name, func(t *testing.T) {
						took := smokeRun(t, root, out, name, kubeBuilt)
						mu.Lock()
						times[name] = took
						mu.Unlock()
					})
				}
			})
		}()
	}
	wg.Wait()
	var parts []string
	for _, n := range names {
		if d, ok := times[n]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f s", n, d.Seconds()))
		}
	}
	t.Logf("smoke runs: %s; %.0f s in all (%d lanes)", strings.Join(parts, ", "), time.Since(start).Seconds(), smokeLaneCount)
}

// smokeRun runs `bench/run NAME --smoke` and checks its report; it returns
// how long the run took.
func smokeRun(t *testing.T, root, out, name string, kubeBuilt bool) time.Duration {
	script, err := os.ReadFile(filepath.Join(root, "bench", name+".sh"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(script, []byte("kube-build.sh")) && !kubeBuilt {
		t.Skip("needs the Kubernetes binaries: run make kube (scripts/kube-build.sh --check fails)")
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), smokeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "bench", "run"), name, "--smoke")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BENCH_OUT="+out, "BENCH_PREPARED=1")
	// bench/run execs bash, which starts labs and servers: on a
	// timeout, SIGTERM lets the script's traps remove them.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	logs, err := cmd.CombinedOutput()
	took := time.Since(start)
	t.Logf("%s: %.1f s", name, took.Seconds())
	if err != nil {
		t.Fatalf("bench/run %s --smoke: %v after %.1f s; its output ends:\n%s", name, err, took.Seconds(), tail(logs, 40))
	}
	checkReport(t, filepath.Join(out, name), start, logs)
	return took
}

// smokeLaneCount: benchmarks mostly wait (sockperf's fixed 2 s start,
// servers, agents and a control plane starting), so four at once on two
// cores take much less than a third of the time of one after another.
const smokeLaneCount = 4

// sharedRanges are benchmarks that put the same addresses in the
// machine's routing table (pod CIDRs; service CIDRs): they never run at
// once. Every other benchmark (a new script too) may run beside any.
var sharedRanges = [][]string{
	{"drift", "observe", "services"}, // pods 10.219.0.0/24 (drift, observe); services 10.216.0.0/16 (drift, services)
	{"ctflood", "policy"},            // 10.217 (ctflood's services, policy's pods)
	{"forwarding", "pktcost"},        // 10.212 (forwarding's veth case, pktcost's pods)
}

// smokeSeconds are the benchmarks' smoke run times, roughly (one after
// another on an idle 2-core machine, bench/README.md): they balance the
// lanes. A benchmark not listed counts as 30 s.
var smokeSeconds = map[string]float64{
	"crossnode": 60, "sockaccel": 45, "forwarding": 30, "k8s": 28, "masquerade": 25, "drift": 22,
	"services": 21, "policy": 17, "pktcost": 17, "observe": 16, "mesh": 12, "ui": 12, "ctflood": 8,
}

// smokeLanes deals the benchmarks into n lanes: those sharing ranges
// stay together in one lane, in name order; groups go, longest first, to
// the lane with the least time so far.
func smokeLanes(names []string, n int) [][]string {
	group := map[string]int{}
	for i, g := range sharedRanges {
		for _, name := range g {
			group[name] = i + 1
		}
	}
	var groups [][]string
	byGroup := map[int]int{}
	for _, name := range names {
		g, ok := group[name]
		if idx, seen := byGroup[g]; ok && seen {
			groups[idx] = append(groups[idx], name)
			continue
		}
		if ok {
			byGroup[g] = len(groups)
		}
		groups = append(groups, []string{name})
	}
	weight := func(g []string) float64 {
		var s float64
		for _, name := range g {
			if w, ok := smokeSeconds[name]; ok {
				s += w
			} else {
				s += 30
			}
		}
		return s
	}
	sort.SliceStable(groups, func(i, j int) bool { return weight(groups[i]) > weight(groups[j]) })
	lanes := make([][]string, n)
	load := make([]float64, n)
	for _, g := range groups {
		least := 0
		for i := range lanes {
			if load[i] < load[least] {
				least = i
			}
		}
		lanes[least] = append(lanes[least], g...)
		load[least] += weight(g)
	}
	var nonEmpty [][]string
	for _, l := range lanes {
		if len(l) > 0 {
			nonEmpty = append(nonEmpty, l)
		}
	}
	return nonEmpty
}

// checkReport: the run wrote, after start, a results.md whose table has at
// least one data row, a value in some row for every metric and no NaN, a medians.json of
// finite numbers, and a chart.
func checkReport(t *testing.T, dir string, start time.Time, logs []byte) {
	t.Helper()
	fresh := func(file string) []byte {
		t.Helper()
		p := filepath.Join(dir, file)
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("no %s: %v; the run's output ends:\n%s", file, err, tail(logs, 20))
		}
		if st.ModTime().Before(start.Add(-time.Second)) {
			t.Fatalf("%s is older than this run (%s)", file, st.ModTime())
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			t.Fatalf("%s is empty", file)
		}
		return b
	}

	md := string(fresh("results.md"))
	header, rows := table(md)
	if header == nil {
		t.Fatalf("results.md has no markdown table:\n%s", md)
	}
	if len(rows) == 0 {
		t.Fatalf("results.md's table has no data row:\n%s", md)
	}
	valued := make([]bool, len(header))
	for _, r := range rows {
		if len(r) != len(header) {
			t.Errorf("results.md: row %q has %d cells, the header %d", strings.Join(r, " | "), len(r), len(header))
			continue
		}
		for i, c := range r {
			switch {
			case c == "" || strings.EqualFold(c, "NaN") || strings.Contains(strings.ToLower(c), "inf"):
				t.Errorf("results.md: column %q of row %q is %q", header[i], r[0], c)
			case c != "—":
				valued[i] = true
			}
		}
	}
	for i, ok := range valued {
		// A ratio column stays empty when the baseline lacks that metric
		// (policy's load_time: the no-policy baseline loads nothing).
		if !ok && !strings.HasPrefix(header[i], "× ") {
			t.Errorf("results.md: column %q has no value in any row", header[i])
		}
	}

	var medians []struct {
		Case   string   `json:"case"`
		Metric string   `json:"metric"`
		Value  *float64 `json:"value"`
	}
	if err := json.Unmarshal(fresh("medians.json"), &medians); err != nil {
		t.Fatalf("medians.json: %v", err)
	}
	if len(medians) == 0 {
		t.Error("medians.json holds no median")
	}
	for _, m := range medians {
		if m.Value == nil || math.IsNaN(*m.Value) || math.IsInf(*m.Value, 0) {
			t.Errorf("medians.json: %s %s has no finite value", m.Case, m.Metric)
		}
	}

	svg := fresh("chart.svg")
	if !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("</svg>")) {
		t.Errorf("chart.svg is not an SVG document (%d bytes)", len(svg))
	}
}

// table: the first markdown table of md, its header cells and data rows.
func table(md string) (header []string, rows [][]string) {
	lines := strings.Split(md, "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "|") || !strings.HasPrefix(lines[i+1], "|---") {
			continue
		}
		header = cells(lines[i])
		for _, l := range lines[i+2:] {
			if !strings.HasPrefix(l, "|") {
				break
			}
			rows = append(rows, cells(l))
		}
		return header, rows
	}
	return nil, nil
}

func cells(line string) []string {
	parts := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestSmokeLanes: every benchmark runs once, in one lane; those sharing
// address ranges share a lane.
func TestSmokeLanes(t *testing.T) {
	names := []string{"crossnode", "ctflood", "drift", "forwarding", "k8s", "masquerade", "mesh", "newone", "observe", "pktcost", "policy", "services", "sockaccel"}
	lanes := smokeLanes(names, 4)
	if len(lanes) != 4 {
		t.Fatalf("%d lanes, want 4: %v", len(lanes), lanes)
	}
	laneOf := map[string]int{}
	for i, l := range lanes {
		for _, n := range l {
			if _, dup := laneOf[n]; dup {
				t.Errorf("%s in two lanes: %v", n, lanes)
			}
			laneOf[n] = i
		}
	}
	for _, n := range names {
		if _, ok := laneOf[n]; !ok {
			t.Errorf("%s in no lane: %v", n, lanes)
		}
	}
	for _, g := range sharedRanges {
		for _, n := range g[1:] {
			if laneOf[n] != laneOf[g[0]] {
				t.Errorf("%s and %s share ranges but not a lane: %v", g[0], n, lanes)
			}
		}
	}
}
