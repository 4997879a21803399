package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/kubecluster"
)

// fastSubset are specs of focus 1 that pass today: make test runs them
// through the whole harness (control plane, kube-scheduler, two lab
// nodes, e2e.test), so the harness itself cannot rot between full runs.
// The last two send packets: pod to pod across the nodes (exec into an
// agnhost pod, its /agnhost and netcat), and to a ClusterIP Service's TCP
// and UDP port of one number (no kube-proxy: shunt's datapath).
var fastSubset = []string{
	"[sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance]",
	"[sig-network] Services should find a service from listing all namespaces [Conformance]",
	"[sig-network] Services should delete a collection of services [Conformance]",
	"[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http [Conformance] [NodeConformance]",
	"[sig-network] Services should serve endpoints on same port and different protocols [Conformance]",
}

// subsetSetup skips the test when it cannot run (not root, a Kubernetes
// program not built: kubeBuild says how to build them) and builds shunt
// into a directory of the test's; the Kubernetes bin directory and that.
func subsetSetup(t *testing.T, kubeBuild string, programs ...string) (kubeBin, bin string) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, BPF, cgroups)")
	}
	kubeBin = kubecluster.DefaultBinDir()
	for _, p := range programs {
		if _, err := os.Stat(filepath.Join(kubeBin, p)); err != nil {
			t.Skipf("%s is not built: run %s (make test does)", p, kubeBuild)
		}
	}
	bin = t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../../cmd/shunt", "../../cmd/shuntd", "../../cmd/shunt-proxy", "../../cmd/shunt-cni")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building shunt: %v\n%s", err, out)
	}
	return kubeBin, bin
}

func TestConformanceFastSubset(t *testing.T) {
	kubeBin, bin := subsetSetup(t, "scripts/kube-build.sh kube-scheduler agnhost e2e.test", "e2e.test", "kube-scheduler", "agnhost")
	quoted := make([]string, len(fastSubset))
	for i, s := range fastSubset {
		quoted[i] = regexp.QuoteMeta(s)
	}
	start := time.Now()
	results, err := runConformance(strings.Join(quoted, "|"), "", t.TempDir(), bin, kubeBin, 2, 1, 10*time.Minute, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d specs in %.0f s, cluster up and down included", len(results), time.Since(start).Seconds())
	passed := map[string]bool{}
	for _, r := range results {
		passed[r.Name] = r.Outcome == "passed"
		if r.Outcome != "passed" {
			t.Errorf("%s: %s: %s %s", r.Name, r.Outcome, r.Reason, r.Cause)
		}
	}
	for _, s := range fastSubset {
		if _, ran := passed[s]; !ran {
			t.Errorf("%s did not run", s)
		}
	}
}

// Focus 3, the Gateway API mesh suite, runs whole in make test: its 22
// tests (the MESH-HTTP and MESH-GRPC profiles) take about 10 s once the
// cluster is up (13 s), through the same harness, with Istio's echo app as
// the suite's echo-advanced image and requests sent by its client, exec'd
// in a pod. Every test passes but those skipped for a feature shunt does
// not claim, named here (none today).
var gatewayMeshSkips = map[string]string{}

func TestGatewayMeshFastSubset(t *testing.T) {
	kubeBin, bin := subsetSetup(t, "scripts/kube-build.sh kube-scheduler coredns istio-echo",
		"kube-scheduler", "coredns", "istio-echo-server", "istio-echo-client", "istio-echo-cert.crt", "istio-echo-cert.key")
	// The suite's test binary, from its own module.
	suiteBin := filepath.Join(bin, "gateway-mesh-conformance.test")
	build := exec.Command("go", "test", "-c", "-o", suiteBin, ".")
	build.Dir = "../../tools/gwconformance"
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the Gateway API mesh suite: %v\n%s", err, out)
	}
	start := time.Now()
	results, err := runGatewayMesh(suiteBin, "", t.TempDir(), bin, kubeBin, 2, 10*time.Minute, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tests in %.0f s, cluster up and down included", len(results), time.Since(start).Seconds())
	passed := 0
	for _, r := range results {
		switch skip, known := gatewayMeshSkips[r.Name]; {
		case r.Outcome == "passed":
			passed++
		case r.Outcome == "skipped" && known && strings.Contains(r.Reason, skip):
		default:
			t.Errorf("%s: %s: %s %s", r.Name, r.Outcome, r.Reason, r.Cause)
		}
	}
	// The suite's mesh tests of gateway-api v1.6.3: a run that selects
	// fewer has lost some.
	if passed+len(gatewayMeshSkips) < 22 {
		t.Errorf("%d tests passed and %d are known skips, want 22 in all", passed, len(gatewayMeshSkips))
	}
}
