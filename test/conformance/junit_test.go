package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// As e2e.test writes it: the suite's nodes, specs the focus left out
// (skipped with no reason), a pass, a failure whose reason is in the text,
// a skip with its reason.
const sampleJUnit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="0" errors="0" failures="1" time="130">
  <testsuite name="Kubernetes e2e suite" package="/tmp" tests="6" skipped="0" disabled="0" errors="0" failures="1" time="130">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0.02"></testcase>
    <testcase name="[It] [sig-apps] Deployment should run [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance]" classname="Kubernetes e2e suite" status="passed" time="0.1"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" classname="Kubernetes e2e suite" status="failed" time="125.4"><failure message="" type="failed">[FAILED] service is not reachable within 2m0s timeout on endpoint endpoint-test2:80 over TCP protocol&#xA;In [It] at: k8s.io/kubernetes/test/e2e/network/service.go:812</failure><system-err>error sending request: Post &#34;https://172.31.112.2:10250/exec/services-9015/execpod2bjw9/agnhost-container?command=%2Fbin%2Fsh&#34;: dial tcp 172.31.112.2:10250: connect: connection refused</system-err></testcase>
    <testcase name="[It] [sig-network] Services should have session affinity work for LoadBalancer service [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0.5"><skipped message="skipped - Only supported for providers [gce gke aws] (not local)"></skipped></testcase>
    <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
  </testsuite>
</testsuites>`

func TestJUnitToMarkdown(t *testing.T) {
	results, err := parseJUnit(strings.NewReader(sampleJUnit), regexp.MustCompile(FocusNetwork), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []result{
		{Name: "[sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance]", Outcome: "passed", Seconds: 0.1},
		{Name: "[sig-network] Services should have session affinity work for LoadBalancer service [Conformance]", Outcome: "skipped", Seconds: 0.5,
			Reason: "Only supported for providers [gce gke aws] (not local)"},
		{Name: "[sig-network] Services should serve a basic endpoint from pods [Conformance]", Outcome: "failed", Seconds: 125.4,
			Reason: "service is not reachable within 2m0s timeout on endpoint endpoint-test2:80 over TCP protocol",
			Cause:  "kubelet API: exec (no server on the node's kubelet port 10250)"},
	}
	if !slices.Equal(results, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", results, want)
	}
	md := markdown(results)
	for _, line := range []string{
		"3 specs: 1 passed, 1 failed, 1 skipped",
		"| [sig-network] Services should serve a basic endpoint from pods [Conformance] | failed | 125 | service is not reachable within 2m0s timeout on endpoint endpoint-test2:80 over TCP protocol | kubelet API: exec (no server on the node's kubelet port 10250) |",
		"| [sig-network] Services should have session affinity work for LoadBalancer service [Conformance] | skipped | 0 | Only supported for providers [gce gke aws] (not local) |  |",
	} {
		if !strings.Contains(md, line) {
			t.Errorf("table lacks %q:\n%s", line, md)
		}
	}
	// A skip expression leaves its specs out of the table.
	results, _ = parseJUnit(strings.NewReader(sampleJUnit), regexp.MustCompile(FocusNetwork), regexp.MustCompile("LoadBalancer"))
	if len(results) != 2 {
		t.Errorf("with --skip LoadBalancer: %+v", results)
	}
}

// Specs a suite timeout left unrun say so.
func TestJUnitSuiteTimeout(t *testing.T) {
	doc := strings.Replace(sampleJUnit, `<skipped message="skipped - Only supported for providers [gce gke aws] (not local)"></skipped>`, `<skipped message="skipped"></skipped>`, 1)
	doc = strings.Replace(doc, `[FAILED] service is not reachable`, `[TIMEDOUT] A suite timeout occurred`, 1)
	results, err := parseJUnit(strings.NewReader(doc), regexp.MustCompile(FocusNetwork), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := results[1]; r.Outcome != "skipped" || !strings.Contains(r.Reason, "not run") {
		t.Errorf("%+v: want skipped, not run for the time limit", r)
	}
}

// A failed suite node is a row of its own: it is why every spec failed.
func TestJUnitSuiteFailure(t *testing.T) {
	doc := strings.Replace(sampleJUnit, `<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0.02"></testcase>`,
		`<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="failed" time="120"><failure message="" type="failed">[FAILED] Error waiting for all pods to be running and ready</failure></testcase>`, 1)
	results, err := parseJUnit(strings.NewReader(doc), regexp.MustCompile(FocusNetwork), nil)
	if err != nil {
		t.Fatal(err)
	}
	if results[0].Name != "[SynchronizedBeforeSuite]" || results[0].Outcome != "failed" || results[0].Reason != "Error waiting for all pods to be running and ready" {
		t.Errorf("first row %+v, want the failed [SynchronizedBeforeSuite] with its reason", results[0])
	}
}

// Each spec goes to exactly one process, whose focus matches it.
func TestShard(t *testing.T) {
	specs := []string{"[sig-network] A (x) [Conformance]", "[sig-network] B [LinuxOnly] [Conformance]", "[sig-network] C.d"}
	shards := shard(specs, 2)
	if len(shards) != 2 {
		t.Fatalf("%d shards, want 2", len(shards))
	}
	for _, s := range specs {
		n := 0
		for _, f := range shards {
			if regexp.MustCompile(f).MatchString(s) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%q matched by %d shards, want 1", s, n)
		}
	}
	if got := shard(specs, 9); len(got) != 3 {
		t.Errorf("9 processes for 3 specs: %d shards, want 3", len(got))
	}
}

// The signatures name what a failed spec's log shows, and a log that
// merely mentions a word (a pod dump's hostNetwork: false) names nothing.
func TestCauseOf(t *testing.T) {
	cases := []struct{ log, want string }{
		{`nc: getaddrinfo for host "nodeport-test" port 80: Temporary failure in name resolution`, "cluster DNS (no CoreDNS, no resolv.conf of the cluster in pods)"},
		{`sh: 1: cannot create /results/glibc_hosts@dns-querier-2: Directory nonexistent`, "emptyDir volumes (the DNS probers' /results), and cluster DNS"},
		{`stderr: "/bin/sh: 1: nc: not found"`, "a program of the image the node lacks (scripts/setup.sh installs them)"},
		{`connectivity expected :: x/a -> 10.198.33.11 :: stderr - OTHER: protocol not supported`, "SCTP: the node's kernel has none (CONFIG_IP_SCTP unset on this machine), and shunt balances no SCTP Service port (services.Unsupported)"},
		{`Expected allowed pod connection was instead BLOCKED --- run 'kubectl exec a -n x -- /agnhost connect 10.198.1.2:81 --timeout=3s --protocol=sctp'`, "SCTP: the node's kernel has none (CONFIG_IP_SCTP unset on this machine), and shunt balances no SCTP Service port (services.Unsupported)"},
		{`Spec:PodSpec{HostNetwork:false, ...} Waiting for service`, ""},
		{`Exec: execute(https://127.0.0.1:46643/api/v1/namespaces/x/pods/a/exec?command=%2Fagnhost)`, ""},
	}
	for _, c := range cases {
		if got := causeOf(c.log); got != c.want {
			t.Errorf("causeOf(%q) = %q, want %q", c.log, got, c.want)
		}
	}
}
