package main

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/shuntnet/shunt/internal/lab"
)

// SuiteGatewayMesh is focus 3: the Gateway API conformance suite's mesh
// tests (GAMMA: HTTPRoutes and GRPCRoutes whose parent is a Service), the
// MESH-HTTP and MESH-GRPC profiles, run by the test binary of tools/gwconformance (a module of its
// own: the suite's controller-runtime is not shunt's).
const SuiteGatewayMesh = "gateway-mesh"

// gatewayTestPrefix is the name of the suite's test in tools/gwconformance;
// each conformance test is a subtest of it, named by its ShortName.
const gatewayTestPrefix = "TestMeshConformance/"

// runGatewayMesh brings the cluster up, runs the mesh suite (runTests: a
// regular expression of the tests' names, their ShortName, or "" for all)
// and tears the cluster down. It
// writes the suite's test2json stream (gateway.json), its log
// (gateway.log), its conformance report (report.yaml), a JUnit
// (junit_01.xml) and results.md into reportDir.
func runGatewayMesh(testBin, runTests, reportDir, shuntBin, kubeBin string, nodes int, timeout time.Duration, tableOnly bool) ([]result, error) {
	if _, err := regexp.Compile(runTests); err != nil {
		return nil, fmt.Errorf("--run-test: %w", err)
	}
	reportDir, shuntBin, err := runDirs(reportDir, shuntBin, "shunt-gateway-mesh-")
	if err != nil {
		return nil, err
	}
	if testBin, err = filepath.Abs(testBin); err != nil { // the suite runs in reportDir
		return nil, err
	}
	stream := filepath.Join(reportDir, "gateway.json")
	var runErr, downErr error
	if !tableOnly {
		needed := []string{filepath.Join(shuntBin, "shunt"), filepath.Join(shuntBin, "shuntd"), filepath.Join(shuntBin, "shunt-proxy"), testBin, filepath.Join(kubeBin, "coredns")}
		for _, f := range lab.IstioEchoFiles {
			needed = append(needed, filepath.Join(kubeBin, f))
		}
		if err := requirePrograms(fmt.Sprintf("run make build, scripts/kube-build.sh kube-scheduler coredns istio-echo and build %s (scripts/conformance.sh --suite %s does all three)", testBin, SuiteGatewayMesh), needed...); err != nil {
			return nil, err
		}
		logf := stampedLogf
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		start := time.Now()
		e, err := up(ctx, filepath.Join(reportDir, "cluster"), shuntBin, kubeBin, nodes, logf)
		if err != nil {
			return nil, fmt.Errorf("bringing the cluster up: %w", err)
		}
		logf("cluster up in %.0f s", time.Since(start).Seconds())
		runErr = e.runGatewaySuite(ctx, testBin, runTests, reportDir, stream, timeout)
		logf("tearing down")
		if downErr = e.down(); downErr != nil {
			logf("teardown: %v", downErr)
		}
	}
	f, err := os.Open(stream)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("no test2json stream of the suite (%w): see %s", err, filepath.Join(reportDir, "gateway.log")), runErr, downErr)
	}
	results, err := parseTest2JSON(f, gatewayTestPrefix)
	f.Close()
	if err != nil {
		return nil, err
	}
	if len(results) == 0 {
		return nil, errors.Join(fmt.Errorf("the suite ran no test: see %s", filepath.Join(reportDir, "gateway.log")), runErr, downErr)
	}
	if err := writeJUnit(filepath.Join(reportDir, "junit_01.xml"), "Gateway API conformance "+SuiteGatewayMesh, results); err != nil {
		return nil, err
	}
	table := markdown(results)
	if err := os.WriteFile(filepath.Join(reportDir, "results.md"), []byte(table), 0o644); err != nil {
		return nil, err
	}
	fmt.Print(table)
	fmt.Fprintf(os.Stderr, "results: %s; the suite's log %s, its report %s\n", filepath.Join(reportDir, "results.md"),
		filepath.Join(reportDir, "gateway.log"), filepath.Join(reportDir, "report.yaml"))
	// Failed tests are the results, not an error of the harness: the test
	// binary exits 1 for them.
	var ee *exec.ExitError
	if runErr != nil && errors.As(runErr, &ee) {
		runErr = nil
	}
	return results, errors.Join(runErr, downErr)
}

// runGatewaySuite runs the suite's test binary under test2json against the
// cluster.
func (e *env) runGatewaySuite(ctx context.Context, testBin, runTests, reportDir, stream string, timeout time.Duration) error {
	out, err := os.Create(stream)
	if err != nil {
		return err
	}
	defer out.Close()
	logFile, err := os.Create(filepath.Join(reportDir, "gateway.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	// The tests are subtests named by their ShortName: -test.run selects
	// them (the suite's own --run-test takes one name, and reports every
	// other test as skipped).
	run := "^TestMeshConformance$"
	if runTests != "" {
		run += "/^(?:" + runTests + ")$"
	}
	args := []string{"tool", "test2json", "-t", "-p", SuiteGatewayMesh, testBin,
		"-test.v=test2json", "-test.run=" + run, "-test.timeout=" + timeout.String(),
		"--report-output=" + filepath.Join(reportDir, "report.yaml"),
		// Namespaces and objects are removed after each test and the
		// base manifests at the end, as the suite's defaults do.
		"--cleanup-base-resources=true",
	}
	e.logf("the Gateway API mesh suite, output in %s", logFile.Name())
	cmd := exec.CommandContext(ctx, "go", args...)
	// The stream is read twice: into gateway.json, and its output lines
	// into gateway.log as they come, for a person following the run.
	pr, pw := io.Pipe()
	cmd.Stdout = io.MultiWriter(out, pw)
	cmd.Stderr = logFile
	cmd.Dir = reportDir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.cluster.Kubeconfig, "PATH="+filepath.Dir(e.cluster.Kubectl())+":"+os.Getenv("PATH"))
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	done := make(chan struct{})
	go func() {
		defer close(done)
		s := bufio.NewScanner(pr)
		s.Buffer(make([]byte, 1<<20), 1<<24)
		for s.Scan() {
			var ev testEvent
			if json.Unmarshal(s.Bytes(), &ev) == nil && ev.Action == "output" {
				io.WriteString(logFile, ev.Output)
			}
		}
		io.Copy(io.Discard, pr)
	}()
	start := time.Now()
	err = cmd.Run()
	pw.Close()
	<-done
	e.logf("the suite ran %.0f s (%v)", time.Since(start).Seconds(), err)
	return err
}

// testEvent is one event of `go tool test2json`.
type testEvent struct {
	Action  string
	Test    string
	Elapsed float64
	Output  string
}

// parseTest2JSON reads the subtests of prefix (one level: the conformance
// tests, not their own subtests) with their outcome, and for a failure or
// skip its reason from the test's output.
func parseTest2JSON(r io.Reader, prefix string) ([]result, error) {
	outputs := map[string]*strings.Builder{}
	byName := map[string]*result{}
	var order []string
	dec := json.NewDecoder(r)
	for {
		var ev testEvent
		if err := dec.Decode(&ev); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading the test2json stream: %w", err)
		}
		name, ok := strings.CutPrefix(ev.Test, prefix)
		if !ok || name == "" {
			continue
		}
		top, _, _ := strings.Cut(name, "/")
		if outputs[top] == nil {
			outputs[top] = &strings.Builder{}
			byName[top] = &result{Name: top}
			order = append(order, top)
		}
		switch ev.Action {
		case "output":
			outputs[top].WriteString(ev.Output)
		case "pass", "fail", "skip":
			// A test's parallel subtests end after it: its time is the
			// longest of theirs and its own; its outcome its own.
			byName[top].Seconds = max(byName[top].Seconds, ev.Elapsed)
			if top == name {
				byName[top].Outcome = map[string]string{"pass": "passed", "fail": "failed", "skip": "skipped"}[ev.Action]
			}
		}
	}
	var out []result
	for _, name := range order {
		res := *byName[name]
		log := outputs[name].String()
		switch res.Outcome {
		case "":
			res.Outcome, res.Reason = "failed", "did not finish (the suite's time limit, or it was stopped)"
		case "failed":
			res.Reason, res.Cause = failureReason(log), gatewayCauseOf(log)
		case "skipped":
			res.Reason = skipReason(log)
		}
		out = append(out, res)
	}
	slices.SortFunc(out, func(a, b result) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// testifyError is the message of a failed testify assertion (the suite's
// require and assert): "Error:" then the message, indented.
var testifyError = regexp.MustCompile(`(?m)^\s+Error:\s+(.*)$`)

// lastExpectation is the mesh suite's last word on a request that kept
// failing (echo.MeshPod's log): the request (the echo client's argv) and
// what was wrong with its answer, or why it could not be sent.
var lastExpectation = regexp.MustCompile(`(?:Response expectation failed for request: \[([^\]]*)\]\s+not ready yet|Request \[([^\]]*)\] failed, not ready yet): (.*?) \(after [^)]*\)\s*$`)

// failureReason is the last request the test kept failing on and why, else
// the first assertion that failed, else the last line the test logged.
func failureReason(log string) string {
	var failing []string
	for line := range strings.SplitSeq(log, "\n") {
		if m := lastExpectation.FindStringSubmatch(line); m != nil {
			failing = m
		}
	}
	if failing != nil {
		return oneLine(strings.TrimPrefix(failing[1]+failing[2], "client ")+": "+failing[3], "")
	}
	if m := testifyError.FindStringSubmatch(log); m != nil {
		return oneLine(m[1], "")
	}
	var last string
	for line := range strings.SplitSeq(log, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "--- ") && !strings.HasPrefix(line, "=== ") {
			last = line
		}
	}
	return oneLine(last, "")
}

// skipReason is the test's skip message: "Skipping X: suite does not
// support F".
func skipReason(log string) string {
	for line := range strings.SplitSeq(log, "\n") {
		if _, msg, ok := strings.Cut(line, "Skipping "); ok {
			return oneLine("Skipping "+msg, "")
		}
	}
	return "no reason given by the suite"
}

// gatewayCauses are signatures in a failed test's log, and what each says
// the lab lacks.
var gatewayCauses = []struct {
	re    *regexp.Regexp
	cause string
}{
	{regexp.MustCompile(`ImageNotMapped`), "an image the lab does not map (ImageNotMapped)"},
	{regexp.MustCompile(`executable file not found|no such file or directory.*client`), "the echo image's client, which the suite execs, is not on the container's PATH"},
	{regexp.MustCompile(`(?i)no such host|server misbehaving|i/o timeout.*:53`), "cluster DNS"},
}

func gatewayCauseOf(log string) string {
	for _, c := range gatewayCauses {
		if c.re.MatchString(log) {
			return c.cause
		}
	}
	return ""
}

// writeJUnit writes results as a JUnit report of one suite, as CI tools
// read them (the same elements e2e.test's has).
func writeJUnit(path, suite string, results []result) error {
	s := junitSuite{Name: suite, Tests: len(results)}
	for _, r := range results {
		c := junitCase{Name: r.Name, Status: r.Outcome, Time: r.Seconds}
		switch r.Outcome {
		case "failed":
			s.Failures++
			c.Failure = &junitMessage{Message: r.Reason, Text: r.Cause}
		case "skipped":
			s.Skipped++
			c.Skipped = &junitMessage{Message: r.Reason}
		}
		s.Cases = append(s.Cases, c)
	}
	data, err := xml.MarshalIndent(junitSuites{Suites: []junitSuite{s}}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte(xml.Header), append(data, '\n')...), 0o644)
}

// defaultGatewayTestBin is where scripts/conformance.sh builds the suite's
// test binary.
func defaultGatewayTestBin() string {
	return filepath.Join("bin", "gateway-mesh-conformance.test")
}
