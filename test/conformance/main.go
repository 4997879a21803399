// Command conformance runs the Kubernetes e2e suite (e2e.test, built by
// scripts/kube-build.sh e2e.test at the pinned release) against a shunt
// cluster with no kube-proxy: `shunt dev cluster`'s control plane on
// loopback with kube-scheduler, and lab nodes whose agents play the
// kubelet (cluster.go). It writes e2e.test's JUnit and its Markdown table
// (results.md: passed, failed, skipped, with the reason of every failure
// and skip) into --report-dir, and tears everything down, on failure and
// on Ctrl-C too. scripts/conformance.sh builds what it needs and runs it.
//
// --suite gateway-mesh runs focus 3 instead: the Gateway API conformance
// suite's mesh profile (gateway.go), against the same cluster.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shuntnet/shunt/internal/kubecluster"
)

// Focuses of issue 28.
const (
	// FocusNetwork is focus 1: the sig-network conformance specs.
	FocusNetwork = `\[sig-network\] (Services|Networking|HostPort|EndpointSlice|DNS).*\[Conformance\]`
	// FocusNetpol is focus 2: the NetworkPolicy specs of test/e2e/network/netpol.
	FocusNetpol = `\[sig-network\] Netpol `
)

func main() {
	var (
		focus, skip, reportDir, shuntBin, kubeBin string
		suiteName, gatewayTestBin, runTest        string
		nodes, parallel                           int
		tableOnly                                 bool
		timeout                                   time.Duration
	)
	flag.StringVar(&focus, "focus", FocusNetwork, "regular expression of the specs to run (e2e.test --ginkgo.focus); 'netpol' is focus 2: "+FocusNetpol)
	flag.StringVar(&skip, "skip", "", "regular expression of specs to leave out (--ginkgo.skip)")
	flag.StringVar(&reportDir, "report-dir", "", "where JUnit, results.md, e2e.log and the cluster's logs go (default: a new directory under /tmp)")
	flag.StringVar(&shuntBin, "shunt-bin", "bin", "directory of shunt, shuntd, shunt-cni (make build)")
	flag.StringVar(&kubeBin, "kube-bin", kubecluster.DefaultBinDir(), "directory of the Kubernetes programs, e2e.test, kube-scheduler and agnhost among them (scripts/kube-build.sh)")
	flag.IntVar(&nodes, "nodes", 2, "lab nodes")
	flag.IntVar(&parallel, "parallel", 3, "e2e.test processes at once, the specs dealt among them (upstream runs conformance in parallel too)")
	flag.BoolVar(&tableOnly, "table-only", false, "run nothing: write results.md again from the JUnit of an earlier run in --report-dir (the same --focus, --skip and --parallel)")
	flag.DurationVar(&timeout, "timeout", time.Hour, "the whole run's limit (e2e.test's --ginkgo.timeout)")
	flag.StringVar(&suiteName, "suite", "kubernetes", "the suite: kubernetes (e2e.test, focuses 1 and 2) or "+SuiteGatewayMesh+" (focus 3: the Gateway API conformance suite's mesh profile)")
	flag.StringVar(&gatewayTestBin, "gateway-test-bin", defaultGatewayTestBin(), "with --suite "+SuiteGatewayMesh+": the suite's test binary (go test -c of tools/gwconformance)")
	flag.StringVar(&runTest, "run-test", "", "with --suite "+SuiteGatewayMesh+": a regular expression of the tests to run, by their ShortName (e.g. 'MeshBasic|MeshPorts'); default all")
	flag.Parse()
	switch suiteName {
	case "kubernetes":
	case SuiteGatewayMesh:
		if _, err := runGatewayMesh(gatewayTestBin, runTest, reportDir, shuntBin, kubeBin, nodes, timeout, tableOnly); err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
			os.Exit(1)
		}
		return
	default:
		fmt.Fprintf(os.Stderr, "conformance: --suite %q: the suites are kubernetes and %s\n", suiteName, SuiteGatewayMesh)
		os.Exit(2)
	}
	if focus == "netpol" {
		focus = FocusNetpol
	}
	if _, err := runConformance(focus, skip, reportDir, shuntBin, kubeBin, nodes, parallel, timeout, tableOnly); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

// runConformance runs the specs (or, tableOnly, reads an earlier run's
// JUnit) and writes the table; the specs' results.
func runConformance(focus, skip, reportDir, shuntBin, kubeBin string, nodes, parallel int, timeout time.Duration, tableOnly bool) ([]result, error) {
	// Go's regular expressions, as Ginkgo's: checked before anything runs.
	if _, err := regexp.Compile(focus); err != nil {
		return nil, fmt.Errorf("--focus: %w", err)
	}
	if _, err := regexp.Compile(skip); err != nil {
		return nil, fmt.Errorf("--skip: %w", err)
	}
	reportDir, shuntBin, err := runDirs(reportDir, shuntBin, "shunt-conformance-")
	if err != nil {
		return nil, err
	}
	if err := requirePrograms("run make build and scripts/kube-build.sh kube-scheduler agnhost e2e.test coredns (scripts/conformance.sh does both)",
		filepath.Join(shuntBin, "shunt"), filepath.Join(shuntBin, "shuntd"), filepath.Join(kubeBin, "e2e.test"), filepath.Join(kubeBin, "coredns")); err != nil {
		return nil, err
	}
	logf := stampedLogf
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The specs selected, dealt to parallel e2e.test processes: most of a
	// failing spec's time is a timeout, spent waiting.
	specs, err := listSpecs(ctx, kubeBin, focus, skip, filepath.Join(reportDir, "dry-run"))
	if err != nil {
		return nil, err
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("no spec of e2e.test %s matches --focus %q --skip %q", kubecluster.KubeVersion, focus, skip)
	}
	shards := shard(specs, parallel)
	logf("%d specs in %d e2e.test processes", len(specs), len(shards))

	runErrs := make([]error, len(shards))
	var downErr error
	if !tableOnly {
		runErrs, downErr = runShards(ctx, shards, reportDir, shuntBin, kubeBin, nodes, timeout, logf)
		if len(runErrs) == 0 {
			return nil, downErr // the cluster did not come up
		}
	}

	var results []result
	var errs []error
	for i, focus := range shards {
		junit := filepath.Join(shardDir(reportDir, i), "junit_01.xml")
		f, err := os.Open(junit)
		if err != nil {
			errs = append(errs, fmt.Errorf("no JUnit report from e2e.test (%w): see %s", err, filepath.Join(shardDir(reportDir, i), "e2e.log")))
			continue
		}
		res, err := parseJUnit(f, regexp.MustCompile(focus), nil)
		f.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		results = append(results, res...)
		// Failed specs are the results, not an error of the harness:
		// e2e.test exits 1 for them.
		var ee *exec.ExitError
		if runErrs[i] != nil && !errors.As(runErrs[i], &ee) {
			errs = append(errs, runErrs[i])
		}
	}
	slices.SortFunc(results, func(a, b result) int { return strings.Compare(a.Name, b.Name) })
	table := markdown(results)
	if err := os.WriteFile(filepath.Join(reportDir, "results.md"), []byte(table), 0o644); err != nil {
		return nil, err
	}
	fmt.Print(table)
	logf("results: %s; JUnit and e2e.test's log of each process: %s/e2e-*/; the cluster's logs: %s", filepath.Join(reportDir, "results.md"),
		reportDir, filepath.Join(reportDir, "cluster", "logs"))
	return results, errors.Join(append(errs, downErr)...)
}

// runDirs makes the report directory (a new one under /tmp, its name
// starting with prefix, when reportDir is "") and shuntBin absolute.
func runDirs(reportDir, shuntBin, prefix string) (string, string, error) {
	var err error
	if reportDir == "" {
		if reportDir, err = os.MkdirTemp("", prefix); err != nil {
			return "", "", err
		}
	}
	if shuntBin, err = filepath.Abs(shuntBin); err != nil {
		return "", "", err
	}
	return reportDir, shuntBin, os.MkdirAll(reportDir, 0o755)
}

// requirePrograms names the first of paths that is missing, and how to
// build it.
func requirePrograms(howToBuild string, paths ...string) error {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s is missing: %s", p, howToBuild)
		}
	}
	return nil
}

// stampedLogf logs a line of progress to stderr, the time first.
func stampedLogf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

// runShards brings the cluster up, runs one e2e.test per shard at once and
// tears the cluster down; the error of each e2e.test (none when the cluster
// did not come up) and the teardown's.
func runShards(ctx context.Context, shards []string, reportDir, shuntBin, kubeBin string, nodes int, timeout time.Duration, logf func(string, ...any)) ([]error, error) {
	start := time.Now()
	e, err := up(ctx, filepath.Join(reportDir, "cluster"), shuntBin, kubeBin, nodes, logf)
	if err != nil {
		return nil, fmt.Errorf("bringing the cluster up: %w", err)
	}
	logf("cluster up in %.0f s", time.Since(start).Seconds())
	runErrs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i, focus := range shards {
		wg.Go(func() {
			runErrs[i] = e.runE2E(ctx, kubeBin, focus, shardDir(reportDir, i), timeout)
		})
	}
	wg.Wait()
	logf("tearing down")
	downErr := e.down()
	if downErr != nil {
		logf("teardown: %v", downErr)
	}
	return runErrs, downErr
}

func shardDir(reportDir string, i int) string {
	return filepath.Join(reportDir, fmt.Sprintf("e2e-%d", i+1))
}

// listSpecs asks e2e.test which specs focus and skip select (a dry run).
func listSpecs(ctx context.Context, kubeBin, focus, skip, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	args := []string{"--ginkgo.dry-run", "--ginkgo.no-color", "--report-dir=" + dir, "--ginkgo.focus=" + focus}
	if skip != "" {
		args = append(args, "--ginkgo.skip="+skip)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(kubeBin, "e2e.test"), args...)
	tmp, err := e2eTempDir(cmd)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("e2e.test --ginkgo.dry-run: %w\n%s", err, out)
	}
	f, err := os.Open(filepath.Join(dir, "junit_01.xml"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	all, err := parseJUnit(f, regexp.MustCompile(focus), nil)
	if err != nil {
		return nil, err
	}
	var specs []string
	for _, r := range all {
		if r.Outcome == "passed" { // a dry run passes what it would run
			specs = append(specs, r.Name)
		}
	}
	return specs, nil
}

// shard deals the specs to n focuses, each matching its specs by name.
func shard(specs []string, n int) []string {
	n = max(1, min(n, len(specs)))
	parts := make([][]string, n)
	for i, s := range specs {
		parts[i%n] = append(parts[i%n], regexp.QuoteMeta(s))
	}
	var out []string
	for _, p := range parts {
		out = append(out, strings.Join(p, "|"))
	}
	return out
}

// e2eTempDir gives e2e.test a TMPDIR of its own, which the caller removes
// when it is done: the process leaves files there (kubectl's kuberc specs
// leave two test-kuberc* directories at every start, dry runs included).
func e2eTempDir(cmd *exec.Cmd) (string, error) {
	tmp, err := os.MkdirTemp("", "shunt-e2e.test-tmp")
	if err != nil {
		return "", err
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
	return tmp, nil
}

// runE2E runs e2e.test against the cluster, its output in reportDir/e2e.log.
func (e *env) runE2E(ctx context.Context, kubeBin, focus, reportDir string, timeout time.Duration) error {
	if err := os.MkdirAll(reportDir, 0o755); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(reportDir, "e2e.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{
		"--kubeconfig=" + e.cluster.Kubeconfig,
		// No cloud: the local provider (LoadBalancer specs skip, naming it).
		"--provider=local",
		"--kubectl-path=" + filepath.Join(kubeBin, "kubectl"),
		"--report-dir=" + reportDir,
		// The lab runs no system pods (no DaemonSet, no CoreDNS yet).
		"--minStartupPods=0",
		"--e2e-verify-service-account=false",
		"--dump-logs-on-failure=false",
		"--disable-log-dump",
		"--node-os-distro=debian",
		"--ginkgo.focus=" + focus,
		"--ginkgo.no-color",
		"--ginkgo.v",
		"--ginkgo.timeout=" + timeout.String(),
	}
	e.logf("e2e.test, output in %s", logFile.Name())
	cmd := exec.CommandContext(ctx, filepath.Join(kubeBin, "e2e.test"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = reportDir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.cluster.Kubeconfig, "PATH="+kubeBin+":"+os.Getenv("PATH"))
	tmp, err := e2eTempDir(cmd)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// Ctrl-C: e2e.test is asked to stop (it reports what ran), then killed.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	start := time.Now()
	err = cmd.Run()
	e.logf("e2e.test ran %.0f s (%v)", time.Since(start).Seconds(), err)
	return err
}
