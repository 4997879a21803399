package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAgentRestartUnderLoad: while a client pod opens new TCP connections
// to a ClusterIP in a loop, talks over one long-lived TCP connection and
// sends UDP requests through the ClusterIP, the agent is stopped and
// started again several times: SIGTERM, SIGKILL, SIGTERM with the
// connection tables resized (--conntrack-max, then back to the default at
// the next start), and SIGKILL in the middle of a large apply (and of a
// large delete). Not one new connection may
// fail, the long connection may not break, no UDP reply may be lost; after
// each crash the objects hold either the whole change or none of it, the
// service map agrees with them, and the NetworkPolicy still keeps the
// intruder out.
func TestAgentRestartUnderLoad(t *testing.T) {
	began := time.Now()
	l := newLab(t, "redirect-peer", servicesManifest, "testdata/other-pod.yaml", "testdata/reliability-policy.yaml")
	l.waitWebServes()
	web := l.clusterIP("web")
	l.probe("client", "connected", "--tcp", web+":80", "--udp", web+":53")
	l.probe("other", "timeout", "--tcp", web+":80")

	// The load: new connections, UDP requests and the long-lived
	// connection each in a probe of their own (one timing out must not
	// hold back the others), 1 s per attempt at most.
	fresh := l.startLoad("client", "--tcp", web+":80")
	udpLoad := l.startLoad("client", "--udp", web+":53")
	long := l.startLoad("client", "--persistent", "--tcp", web+":80")
	time.Sleep(time.Second)

	// restart signals the agent (by the PID it reports), waits for it to
	// exit and starts it again with the flags up; during, if set, starts
	// what the signal is to interrupt and returns what waits for it to end.
	restarts := 0
	restart := func(sig syscall.Signal, during func() (wait func()), up ...string) {
		t.Helper()
		pid := l.status().PID
		var wait func()
		if during != nil {
			wait = during()
		}
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatalf("signalling agent %d: %v", pid, err)
		}
		waitGone(t, pid)
		if wait != nil {
			wait()
		}
		time.Sleep(300 * time.Millisecond) // the node runs without an agent for a moment
		l.mustShunt(append([]string{"lab", "up"}, up...)...)
		restarts++
		l.probe("other", "timeout", "--tcp", web+":80") // the policy still holds
	}

	restart(syscall.SIGTERM, nil)
	restart(syscall.SIGKILL, nil)
	// The connection tables pinned at the default size are replaced by
	// smaller ones holding their entries; the next start (the default
	// again) grows them back.
	restart(syscall.SIGTERM, nil, "--conntrack-max", "8192")
	if got := mapCapacity(t, l, "shunt_ct"); got != 8192 {
		t.Errorf("shunt_ct holds %d entries after a restart with --conntrack-max 8192", got)
	}

	// A large change: 100 services (each with its EndpointSlice) and 1000
	// NetworkPolicies in one apply. The agent is killed in the middle of
	// applying the second such set (or of deleting it, when it is all
	// there): while it reads and admits the request (a delay, adjusted
	// until the request has reached the agent), while it writes the
	// snapshot (objects.json.tmp appeared), and just after the snapshot
	// became durable but before the answer (objects.json was replaced).
	const nsvc, npol = 100, 1000
	dir := t.TempDir()
	bulkA, bulkB := bulkManifest(t, dir, "bulka", nsvc, npol), bulkManifest(t, dir, "bulkb", nsvc, npol)
	start := time.Now()
	l.mustShunt("apply", "-f", bulkA)
	took := time.Since(start)
	l.checkWholeOrNone("bulka", nsvc, npol)
	snapshot := filepath.Join("/var/lib/shunt", l.instance, "objects.json")
	present := false
	// crashDuring SIGKILLs the agent in the middle of applying (or
	// deleting) bulkB, once killNow says so, and checks what is left.
	crashDuring := func(what string, killNow func() bool) (answered, reached bool) {
		t.Helper()
		verb := "apply"
		if present {
			verb = "delete"
		}
		var out bytes.Buffer
		var err error
		restart(syscall.SIGKILL, func() func() {
			cmd := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, verb, "-f", bulkB)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); !killNow() && time.Now().Before(deadline); {
				time.Sleep(100 * time.Microsecond)
			}
			return func() { err = cmd.Wait() }
		})
		before := present
		present = l.checkWholeOrNone("bulkb", nsvc, npol)
		t.Logf("%s bulkb, agent killed %s: %v %s; bulkb there before: %v, after: %v",
			verb, what, err, strings.TrimSpace(out.String()), before, present)
		return err == nil, err == nil || !strings.Contains(out.String(), "connection refused")
	}
	delay := took / 2
	for try := 0; try < 3; try++ {
		at := time.Now().Add(delay)
		answered, reached := crashDuring(fmt.Sprintf("%v after the request began", delay.Round(time.Millisecond)), func() bool { return time.Now().After(at) })
		if reached && !answered {
			break
		}
		if answered {
			delay = delay * 2 / 3
		} else {
			delay = delay * 3 / 2
		}
	}
	fileChanged := func(path string, appeared bool) func() bool {
		old, _ := os.Stat(path)
		return func() bool {
			now, err := os.Stat(path)
			if appeared {
				return err == nil
			}
			return err == nil && (old == nil || !os.SameFile(old, now))
		}
	}
	crashDuring("while it wrote the snapshot", fileChanged(snapshot+".tmp", true))
	if _, reached := crashDuring("once the snapshot was renamed into place", fileChanged(snapshot, false)); !reached {
		t.Error("the snapshot was replaced before the request reached the agent?")
	}
	restart(syscall.SIGTERM, nil)
	l.checkWholeOrNone("bulkb", nsvc, npol)
	if got := mapCapacity(t, l, "shunt_ct"); got != 131072 {
		t.Errorf("shunt_ct holds %d entries after restarts with the default --conntrack-max, want 131072", got)
	}
	time.Sleep(time.Second)

	var failed []string
	count := func(rs []probeResult, proto string) (ok, all int) {
		ok, all, f := tally(rs, proto)
		failed = append(failed, f...)
		return ok, all
	}
	longRs := long.stop()
	conns, connsAll := count(fresh.stop(), "tcp")
	udp, udpAll := count(udpLoad.stop(), "udp")
	reqs, reqsAll := count(longRs, "tcp")
	if locals := distinctLocals(longRs); locals != 1 {
		t.Errorf("the long-lived connection was dialled again (%d local addresses): it broke", locals)
	}
	t.Logf("%d agent restarts (SIGTERM, SIGKILL, SIGTERM to resize the connection tables, SIGKILL in the middle of 1200-object applies, SIGTERM; an uninterrupted apply took %v): "+
		"%d/%d new TCP connections, %d/%d requests on one long-lived TCP connection, %d/%d UDP replies (1 s timeout each); %v in all",
		restarts, took.Round(time.Millisecond), conns, connsAll, reqs, reqsAll, udp, udpAll, time.Since(began).Round(time.Second))
	if len(failed) > 0 {
		t.Errorf("%d attempts failed across agent restarts:\n%s", len(failed), strings.Join(failed[:min(len(failed), 20)], "\n"))
	}
	if conns < 100 || reqs < 100 || udp < 100 {
		t.Errorf("too little load to tell: %d connections, %d requests, %d UDP replies", conns, reqs, udp)
	}
}

// mapCapacity is the capacity of the datapath's map name (`shunt map list`).
func mapCapacity(t *testing.T, l *lab, name string) int {
	t.Helper()
	var maps []struct {
		Name     string `json:"name"`
		Capacity int    `json:"capacity"`
	}
	if err := json.Unmarshal([]byte(l.mustShunt("map", "list", "-o", "json")), &maps); err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if m.Name == name {
			return m.Capacity
		}
	}
	t.Fatalf("no map %s in `shunt map list`", name)
	return 0
}

// load is a `lab probe --for` running in a pod until stop.
type load struct {
	l   *lab
	cmd *exec.Cmd
	out bytes.Buffer
	err bytes.Buffer
}

// startLoad probes args round after round (10 ms apart) from pod until
// stop. It runs in its own process group, the probe inside the pod
// included, so stop (and the cleanup, should the test fail first) can
// signal exactly it.
func (l *lab) startLoad(pod string, args ...string) *load {
	l.t.Helper()
	args = append([]string{"--instance", l.instance, "lab", "exec", pod, "--", filepath.Join(binDir, "shunt"),
		"lab", "probe", "-o", "json", "--expect", "any", "--timeout", "1s", "--for", "10m", "--interval", "10ms"}, args...)
	ld := &load{l: l, cmd: exec.Command(filepath.Join(binDir, "shunt"), args...)}
	ld.cmd.Stdout, ld.cmd.Stderr = &ld.out, &ld.err
	ld.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := ld.cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { ld.stop() })
	return ld
}

// stop ends the load (SIGTERM: the probe finishes its attempt and reports
// it) and returns every attempt.
func (ld *load) stop() []probeResult {
	if ld.cmd.ProcessState != nil {
		return nil
	}
	syscall.Kill(-ld.cmd.Process.Pid, syscall.SIGTERM)
	ld.cmd.Wait()
	var rs []probeResult
	for _, line := range strings.Split(strings.TrimSpace(ld.out.String()), "\n") {
		var r probeResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			ld.l.t.Errorf("load output %q: %v (stderr: %s)", line, err, ld.err.String())
			continue
		}
		rs = append(rs, r)
	}
	return rs
}

// tally counts the attempts of proto that connected and all of them, and
// says when and how each other one failed.
func tally(rs []probeResult, proto string) (ok, all int, failed []string) {
	for _, r := range rs {
		if r.Proto != proto {
			continue
		}
		all++
		if r.Result == "connected" {
			ok++
		} else {
			failed = append(failed, fmt.Sprintf("%s %s: %s: %s", r.Start.UTC().Format("15:04:05.000"), proto, r.Result, r.Error))
		}
	}
	return ok, all, failed
}

// distinctLocals counts the local addresses of the attempts: 1 for a
// `--persistent` probe whose connection never broke.
func distinctLocals(rs []probeResult) int {
	locals := map[string]bool{}
	for _, r := range rs {
		locals[r.Local] = true
	}
	return len(locals)
}

// bulkManifest writes services (selecting no pod) and NetworkPolicies
// named prefix-N, to be applied in one request.
func bulkManifest(t *testing.T, dir, prefix string, services, policies int) string {
	t.Helper()
	var b strings.Builder
	for i := range services {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s-%d}\nspec:\n  selector: {app: %s-%d}\n  ports: [{port: 80}]\n", prefix, i, prefix, i)
	}
	for i := range policies {
		fmt.Fprintf(&b, "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: %s-%d}\nspec:\n  podSelector: {matchLabels: {app: %s-%d}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [{port: %d}]\n", prefix, i, prefix, i, 1000+i)
	}
	path := filepath.Join(dir, prefix+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkWholeOrNone checks that the objects named prefix-N are all there
// (want services and policies) or none of them, never a part of one
// change, and that the service map holds exactly the frontends of the
// services the objects hold, once the agent caught up. It says whether
// they are there.
func (l *lab) checkWholeOrNone(prefix string, services, policies int) bool {
	l.t.Helper()
	var svcs struct {
		Items []struct {
			Metadata struct{ Name string }
			Spec     struct {
				ClusterIP string `json:"clusterIP"`
				Ports     []struct {
					Port     int
					Protocol string
				}
			}
		}
	}
	var pols struct {
		Items []struct{ Metadata struct{ Name string } }
	}
	if err := json.Unmarshal([]byte(l.mustShunt("get", "services", "-A", "-o", "json")), &svcs); err != nil {
		l.t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(l.mustShunt("get", "networkpolicies", "-A", "-o", "json")), &pols); err != nil {
		l.t.Fatal(err)
	}
	want := map[string]bool{}
	nsvc, npol := 0, 0
	for _, s := range svcs.Items {
		if strings.HasPrefix(s.Metadata.Name, prefix+"-") {
			nsvc++
		}
		for _, p := range s.Spec.Ports {
			want[fmt.Sprintf("%s:%d/%s", s.Spec.ClusterIP, p.Port, p.Protocol)] = true
		}
	}
	for _, p := range pols.Items {
		if strings.HasPrefix(p.Metadata.Name, prefix+"-") {
			npol++
		}
	}
	if !(nsvc == 0 && npol == 0) && !(nsvc == services && npol == policies) {
		l.t.Errorf("%s: %d services and %d NetworkPolicies of one change of %d and %d: a part of a change was kept", prefix, nsvc, npol, services, policies)
	}
	var got map[string]bool
	for deadline := time.Now().Add(15 * time.Second); ; {
		var entries []struct {
			VIP      string `json:"vip"`
			Port     int    `json:"port"`
			Protocol string `json:"protocol"`
		}
		if err := json.Unmarshal([]byte(l.mustShunt("map", "dump", "services", "-o", "json")), &entries); err != nil {
			l.t.Fatal(err)
		}
		got = map[string]bool{}
		for _, e := range entries {
			got[fmt.Sprintf("%s:%d/%s", e.VIP, e.Port, e.Protocol)] = true
		}
		if equalSets(got, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !equalSets(got, want) {
		var missing, extra []string
		for k := range want {
			if !got[k] {
				missing = append(missing, k)
			}
		}
		for k := range got {
			if !want[k] {
				extra = append(extra, k)
			}
		}
		l.t.Errorf("%s: the service map does not match the services: %d frontends missing %.5v, %d not of any service %.5v", prefix, len(missing), missing, len(extra), extra)
	}
	l.t.Logf("%s: %d services, %d NetworkPolicies; %d frontends in the service map", prefix, nsvc, npol, len(got))
	return nsvc > 0
}

func equalSets(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// TestAgentDownForLong: with the agent killed and not started again, the
// node keeps forwarding and keeps its policy (the pinned datapath holds
// the last state), and a change cannot be applied: the CLI refuses it,
// saying the agent is down and how to start it, instead of losing it.
func TestAgentDownForLong(t *testing.T) {
	l := newLab(t, "redirect-peer", servicesManifest, "testdata/other-pod.yaml", "testdata/reliability-policy.yaml")
	l.waitWebServes()
	web, web1 := l.clusterIP("web"), l.podIP("web-1")+":8080"
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	time.Sleep(3 * time.Second) // long enough for anything that would lapse without an agent

	l.probeWithoutAgent("client", "connected", "--tcp", web+":80", "--udp", web+":53")
	l.probeWithoutAgent("client", "connected", "--tcp", web1)
	l.probeWithoutAgent("other", "timeout", "--tcp", web+":80", "--tcp", web1)

	out, code := l.shunt("apply", "-f", "testdata/third-pod.yaml")
	if code == 0 || !strings.Contains(out, "cannot reach the shunt agent") || !strings.Contains(out, "shunt lab up") {
		t.Errorf("apply with the agent down: exit %d:\n%s\nwant a refusal naming the agent and `shunt lab up`", code, out)
	}
	// Started again, it has lost nothing and takes changes.
	l.mustShunt("lab", "up")
	l.apply("testdata/third-pod.yaml")
	l.probe("client", "connected", "--tcp", web+":80")
	l.probe("other", "timeout", "--tcp", web+":80")
}

// probeWithoutAgent probes straight from a pod's network namespace (pod of
// the default namespace), for when no agent runs: `lab exec` asks the
// agent.
func (l *lab) probeWithoutAgent(pod, want string, targets ...string) {
	l.t.Helper()
	args := append([]string{"netns", "exec", l.instance + "-default-" + pod, filepath.Join(binDir, "shunt"),
		"lab", "probe", "--timeout", "1s", "--expect", want}, targets...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Errorf("agent down: probe from %s %v, want %s: %v\n%s", pod, targets, want, err, out)
	}
}
