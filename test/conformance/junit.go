package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// The JUnit e2e.test writes (--report-dir, junit_01.xml): Ginkgo's, one
// testcase per spec of the suite, those the focus left out among them
// (skipped, with no reason).
// The mesh suite's JUnit (gateway.go) is written with the same types.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr,omitempty"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string        `xml:"name,attr"`
	Status  string        `xml:"status,attr"`
	Time    float64       `xml:"time,attr"`
	Skipped *junitMessage `xml:"skipped"`
	Failure *junitMessage `xml:"failure"`
	Error   *junitMessage `xml:"error"`
	// SystemErr is the spec's log (e2e.test keeps it for failed specs).
	SystemErr string `xml:"system-err"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Text    string `xml:",chardata"`
}

// result is one spec's outcome.
type result struct {
	Name    string
	Outcome string // passed, failed, skipped
	Seconds float64
	Reason  string // for failed and skipped: why, one line
	// Cause (failed) is what shunt lacks, when the spec's log shows
	// one of the signatures of causes (none: "").
	Cause string
}

// causes are signatures in a failed spec's log, and what each says shunt
// lacks; the first that matches is the cause.
var causes = []struct {
	re    *regexp.Regexp
	cause string
}{
	{regexp.MustCompile(`:10250/(exec|attach)/\S*: dial tcp`), "kubelet API: exec (no server on the node's kubelet port 10250)"},
	{regexp.MustCompile(`:10250/containerLogs/\S*: dial tcp`), "kubelet API: logs (no server on the node's kubelet port 10250)"},
	{regexp.MustCompile(`:10250/portForward/\S*: dial tcp`), "kubelet API: port-forward (no server on the node's kubelet port 10250)"},
	{regexp.MustCompile(`:10250/\S*: dial tcp`), "kubelet API (no server on the node's kubelet port 10250)"},
	{regexp.MustCompile(`ImageNotMapped`), "an image the lab does not map (ImageNotMapped)"},
	// The DNS probers write what they resolved into an emptyDir at
	// /results, which the spec reads through the API server's proxy.
	{regexp.MustCompile(`cannot create /results/\S*: Directory nonexistent`), "emptyDir volumes (the DNS probers' /results), and cluster DNS"},
	{regexp.MustCompile(`Temporary failure in name resolution|Could not find DNS search list|no servers could be reached|Unable to read \S+ from pod`),
		"cluster DNS (no CoreDNS, no resolv.conf of the cluster in pods)"},
	// A program of the image that the node, whose programs the lab's
	// mapped images run (internal/lab/images.go), does not have.
	{regexp.MustCompile(`/bin/sh: \d+: \S+: not found`), "a program of the image the node lacks (scripts/setup.sh installs them)"},
	// agnhost connect --protocol=sctp: socket(..., IPPROTO_SCTP) refused,
	// or a probe of SCTP that found it blocked.
	{regexp.MustCompile(`OTHER: protocol not supported|instead BLOCKED --- run 'kubectl exec [^']*--protocol=sctp'`), "SCTP: the node's kernel has none (CONFIG_IP_SCTP unset on this machine), and shunt balances no SCTP Service port (services.Unsupported)"},
	{regexp.MustCompile(`(?i)readiness probe failed|liveness probe failed|startup probe failed`), "probes"},
}

// causeOf is the cause the spec's log shows, or "".
func causeOf(log string) string {
	for _, c := range causes {
		if c.re.MatchString(log) {
			return c.cause
		}
	}
	return ""
}

// parseJUnit reads the report and keeps the specs the run selected: those
// whose full name focus matches and skip does not (Ginkgo's own rule; a
// nil skip skips nothing), and the suite's nodes that failed (a failed
// [SynchronizedBeforeSuite] fails every spec).
func parseJUnit(r io.Reader, focus, skip *regexp.Regexp) ([]result, error) {
	var doc junitSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("reading the JUnit report: %w", err)
	}
	var out []result
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			name, spec := strings.CutPrefix(c.Name, "[It] ")
			failed := c.Failure != nil || c.Error != nil
			switch {
			case !spec && !failed:
				// The suite's own nodes ([SynchronizedBeforeSuite],
				// reporters) count only when they fail.
				continue
			case spec && (!focus.MatchString(name) || (skip != nil && skip.MatchString(name))):
				continue
			}
			res := result{Name: name, Seconds: c.Time}
			switch {
			case c.Failure != nil:
				res.Outcome, res.Reason, res.Cause = "failed", oneLine(c.Failure.Message, c.Failure.Text), causeOf(c.Failure.Text+c.SystemErr)
			case c.Error != nil:
				res.Outcome, res.Reason, res.Cause = "failed", oneLine(c.Error.Message, c.Error.Text), causeOf(c.Error.Text+c.SystemErr)
			case c.Skipped != nil || c.Status == "skipped":
				res.Outcome = "skipped"
				if c.Skipped != nil {
					res.Reason = oneLine(strings.TrimPrefix(c.Skipped.Message, "skipped - "), c.Skipped.Text)
				}
			default:
				res.Outcome = "passed"
			}
			out = append(out, res)
		}
	}
	// Ginkgo skips the specs a suite timeout leaves unrun with no reason.
	timedOut := slices.ContainsFunc(out, func(r result) bool { return strings.Contains(r.Reason, "A suite timeout occurred") })
	for i, r := range out {
		if r.Outcome == "skipped" && (r.Reason == "" || r.Reason == "skipped") {
			out[i].Reason = "no reason given by e2e.test"
			if timedOut {
				out[i].Reason = "not run: the run's time limit (--timeout) ended first"
			}
		}
	}
	slices.SortFunc(out, func(a, b result) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// oneLine is the first meaningful line of a message (or of text when the
// message is empty), cut to a table cell.
func oneLine(message, text string) string {
	for _, s := range []string{message, text} {
		for line := range strings.SplitSeq(s, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || line == "[FAILED]" || line == "[PANICKED]" {
				continue
			}
			line = strings.TrimPrefix(line, "[FAILED] ")
			if len(line) > 300 {
				line = line[:300] + "…"
			}
			return line
		}
	}
	return ""
}

// markdown is the results as a table, counts first.
func markdown(results []result) string {
	counts := map[string]int{}
	for _, r := range results {
		counts[r.Outcome]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d specs: %d passed, %d failed, %d skipped\n\n", len(results), counts["passed"], counts["failed"], counts["skipped"])
	b.WriteString("| Spec | Result | Seconds | Reason | What shunt lacks (from the spec's log) |\n|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s |\n", cell(r.Name), r.Outcome, r.Seconds, cell(r.Reason), cell(r.Cause))
	}
	return b.String()
}

func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
