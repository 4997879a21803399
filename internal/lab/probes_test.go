package lab

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestProbeStateThresholds(t *testing.T) {
	timing := probeTiming{period: time.Second, timeout: time.Second, success: 2, failure: 3}
	type step struct {
		ok            bool
		result        bool
		changed, kill bool
	}
	cases := []struct {
		kind  probeKind
		start bool
		steps []step
	}{
		{probeReadiness, false, []step{
			{true, false, false, false}, // one success of two
			{true, true, true, false},   // ready
			{false, true, false, false}, // failures 1 and 2 of 3
			{false, true, false, false},
			{true, true, false, false}, // the run of failures is broken
			{false, true, false, false},
			{false, true, false, false},
			{false, false, true, false}, // not ready; readiness never kills
			{false, false, false, false},
		}},
		{probeLiveness, true, []step{
			{false, true, false, false},
			{false, true, false, false},
			{false, false, true, true},  // third failure in a row: kill
			{true, false, false, false}, // on hold: this instance is no longer probed
		}},
		{probeStartup, false, []step{
			{false, false, false, false},
			{false, false, false, false},
			{false, false, false, true}, // failed, not changed (never started): kill
		}},
	}
	for _, c := range cases {
		tm := timing
		if c.kind != probeReadiness {
			tm.success = 1 // as the API server requires
		}
		s := newProbeState(c.kind, tm)
		if s.result != c.start {
			t.Errorf("%s: initial result %v, want %v", c.kind, s.result, c.start)
		}
		for i, st := range c.steps {
			changed, kill := s.observe(st.ok)
			if s.result != st.result || changed != st.changed || kill != st.kill {
				t.Errorf("%s step %d (ok=%v): result %v changed %v kill %v, want %v %v %v",
					c.kind, i, st.ok, s.result, changed, kill, st.result, st.changed, st.kill)
			}
		}
	}
}

func TestProbeTimingDefaults(t *testing.T) {
	got := timingOf(&corev1.Probe{SuccessThreshold: 3}, probeLiveness)
	want := probeTiming{period: 10 * time.Second, timeout: time.Second, success: 1, failure: 3}
	if got != want {
		t.Errorf("liveness defaults: %+v, want %+v", got, want)
	}
	got = timingOf(&corev1.Probe{InitialDelaySeconds: 5, PeriodSeconds: 2, TimeoutSeconds: 4, SuccessThreshold: 3, FailureThreshold: 1}, probeReadiness)
	want = probeTiming{initialDelay: 5 * time.Second, period: 2 * time.Second, timeout: 4 * time.Second, success: 3, failure: 1}
	if got != want {
		t.Errorf("readiness: %+v, want %+v", got, want)
	}
}

// fakeProbe counts its runs and answers what ok says.
type fakeProbe struct {
	ok   atomic.Bool
	runs atomic.Int32
	ran  chan struct{}
}

func newFakeProbe(ok bool) *fakeProbe {
	f := &fakeProbe{ran: make(chan struct{}, 100)}
	f.ok.Store(ok)
	return f
}

func (f *fakeProbe) run(context.Context) (bool, string) {
	f.runs.Add(1)
	defer func() { f.ran <- struct{}{} }()
	return f.ok.Load(), "fake said no"
}

// waitArmed waits until n probe workers wait on the fake clock (each
// re-arms its timer once it recorded its probe's outcome).
func waitArmed(t *testing.T, clk *clocktesting.FakeClock, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for clk.Waiters() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d probe workers wait on the clock, want %d", clk.Waiters(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// step advances the fake clock by d and waits for one run of each probe.
func step(t *testing.T, clk *clocktesting.FakeClock, d time.Duration, ran ...*fakeProbe) {
	t.Helper()
	clk.Step(d)
	for _, p := range ran {
		select {
		case <-p.ran:
		case <-time.After(5 * time.Second):
			t.Fatalf("after %s: the probe did not run", d)
		}
	}
}

func TestProberPeriodsAndStartupGate(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	var changes atomic.Int32
	p := &prober{clock: clk, changed: func() { changes.Add(1) }}
	startup, readiness := newFakeProbe(false), newFakeProbe(true)
	var killed atomic.Int32
	p.ensure("ns/pod", "c", 1234, start, []probeSpec{
		{kind: probeStartup, probe: &corev1.Probe{InitialDelaySeconds: 3, PeriodSeconds: 2, FailureThreshold: 10}, run: startup.run},
		{kind: probeReadiness, probe: &corev1.Probe{PeriodSeconds: 10, SuccessThreshold: 2}, run: readiness.run},
	}, nil, func(probeKind, string) { killed.Add(1) })
	defer p.stop("ns/pod")

	state := func() (bool, bool) {
		s, r, known := p.state("ns/pod", "c", 1234)
		if !known {
			t.Fatal("the container's probes are unknown")
		}
		return s, r
	}
	if s, r := state(); s || r {
		t.Fatalf("before any probe: started %v ready %v, want neither", s, r)
	}
	// Readiness is due at 0 s but gated (not started): no run, next at
	// 10 s. Startup waits its initial delay of 3 s.
	waitArmed(t, clk, 2)
	step(t, clk, time.Second)
	waitArmed(t, clk, 2)
	if startup.runs.Load() != 0 || readiness.runs.Load() != 0 {
		t.Fatalf("at 1 s: startup ran %d, readiness %d times; want 0 (initial delay, gate)", startup.runs.Load(), readiness.runs.Load())
	}
	step(t, clk, 2*time.Second, startup) // 3 s: the first startup probe fails
	waitArmed(t, clk, 2)
	startup.ok.Store(true)
	step(t, clk, 2*time.Second, startup) // 5 s: started
	waitArmed(t, clk, 2)
	if s, r := state(); !s || r {
		t.Fatalf("at 5 s: started %v ready %v, want started, not ready", s, r)
	}
	// At 7 s the startup worker ends (it succeeded); readiness runs at 10
	// and 20 s and needs both.
	step(t, clk, 5*time.Second, readiness)
	waitArmed(t, clk, 1)
	if _, r := state(); r {
		t.Fatal("ready after one success of two")
	}
	step(t, clk, 10*time.Second, readiness)
	waitArmed(t, clk, 1)
	if _, r := state(); !r {
		t.Fatal("not ready after two successes")
	}
	if s, r := startup.runs.Load(), readiness.runs.Load(); s != 2 || r != 2 {
		t.Errorf("startup ran %d, readiness %d times; want 2, 2", s, r)
	}
	if changes.Load() != 2 || killed.Load() != 0 {
		t.Errorf("%d changes, %d kills; want 2 (started, ready), 0", changes.Load(), killed.Load())
	}
	p.stop("ns/pod")
	waitArmed(t, clk, 0)
}

func TestProberLivenessKillsOnce(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	p := &prober{clock: clk}
	live := newFakeProbe(false)
	killed := make(chan probeKind, 10)
	spec := []probeSpec{{kind: probeLiveness, probe: &corev1.Probe{PeriodSeconds: 5, FailureThreshold: 2}, run: live.run}}
	p.ensure("ns/pod", "c", 1, start, spec, nil, func(k probeKind, _ string) { killed <- k })
	defer p.stop("ns/pod")
	waitArmed(t, clk, 1)
	step(t, clk, 0, live) // at once: no initial delay
	waitArmed(t, clk, 1)
	if len(killed) != 0 {
		t.Fatal("killed after one failure of two")
	}
	if _, r, _ := p.state("ns/pod", "c", 1); !r {
		t.Error("not ready after one liveness failure of two (liveness starts succeeded)")
	}
	step(t, clk, 5*time.Second, live)
	select {
	case k := <-killed:
		if k != probeLiveness {
			t.Errorf("killed by %s", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not killed after two failures")
	}
	waitArmed(t, clk, 1)
	clk.Step(20 * time.Second)
	waitArmed(t, clk, 0) // on hold: the worker ends
	if n := live.runs.Load(); n != 2 || len(killed) != 0 {
		t.Errorf("after the kill: %d runs, %d more kills; want 2, 0", n, len(killed))
	}
	// A new instance (the restarted container) gets new workers.
	p.ensure("ns/pod", "c", 2, clk.Now(), spec, nil, func(k probeKind, _ string) { killed <- k })
	if s, r, known := p.state("ns/pod", "c", 2); !known || !s || !r {
		t.Errorf("new instance: started %v ready %v known %v, want all", s, r, known)
	}
	if _, _, known := p.state("ns/pod", "c", 1); known {
		t.Error("the old instance still has workers")
	}
}

func TestNextProbeSkipsMissedPeriods(t *testing.T) {
	tm := probeTiming{period: 10 * time.Second}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := tm.nextProbe(t0, t0.Add(time.Second)); !got.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("next after a quick probe: %s", got.Sub(t0))
	}
	if got := tm.nextProbe(t0, t0.Add(25*time.Second)); !got.Equal(t0.Add(30 * time.Second)) {
		t.Errorf("next after a probe that ran 25 s: %s, want 30s", got.Sub(t0))
	}
}

func TestCrashLoopBackOff(t *testing.T) {
	initial, most := Config{}.backOffs()
	if initial != 10*time.Second || most != 5*time.Minute {
		t.Fatalf("defaults %s, %s; want kubelet's 10s, 5m", initial, most)
	}
	var got []time.Duration
	b := time.Duration(0)
	for range 8 {
		b = nextBackOff(b, initial, most)
		got = append(got, b)
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 300 * time.Second, 300 * time.Second, 300 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("back-offs %v, want %v", got, want)
		}
	}
	if i, m := (Config{CrashLoopBackOff: time.Second, MaxCrashLoopBackOff: 4 * time.Second}).backOffs(); i != time.Second || m != 4*time.Second {
		t.Errorf("configured: %s, %s", i, m)
	}
}

func TestRestartPolicy(t *testing.T) {
	for _, c := range []struct {
		policy corev1.RestartPolicy
		code   int
		want   bool
	}{
		{"", 0, true}, {"", 1, true}, // Always, the default
		{corev1.RestartPolicyOnFailure, 0, false}, {corev1.RestartPolicyOnFailure, 2, true},
		{corev1.RestartPolicyNever, 0, false}, {corev1.RestartPolicyNever, 137, false},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: c.policy}}
		if got := restarts(restartPolicyOf(pod), c.code); got != c.want {
			t.Errorf("policy %q exit %d: restarts %v, want %v", c.policy, c.code, got, c.want)
		}
	}
}

// An agent that restarts keeps a running container's results from the
// pod's status until its probes say otherwise.
func TestProberSeededFromStatus(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	p := &prober{clock: clk}
	readiness := newFakeProbe(false)
	p.ensure("ns/pod", "c", 7, start.Add(-time.Hour), []probeSpec{
		{kind: probeStartup, probe: &corev1.Probe{}, run: newFakeProbe(true).run},
		{kind: probeReadiness, probe: &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 2}, run: readiness.run},
	}, &probeSeed{started: true, ready: true}, func(probeKind, string) {})
	defer p.stop("ns/pod")
	if s, r, _ := p.state("ns/pod", "c", 7); !s || !r {
		t.Fatalf("seeded: started %v ready %v, want both", s, r)
	}
	waitArmed(t, clk, 2)
	step(t, clk, 0, readiness) // the startup worker ends: started already

	waitArmed(t, clk, 1)
	step(t, clk, time.Second, readiness)
	waitArmed(t, clk, 1)
	if _, r, _ := p.state("ns/pod", "c", 7); r {
		t.Error("still ready after two failures")
	}
}
