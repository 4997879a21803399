package lab

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// The lab kubelet's prober, as kubelet's prober manager works: a worker
// goroutine per probe of each running container instance, started with
// the container and stopped when it exits, restarts or its pod goes. The
// startup probe gates the others; a readiness result decides the
// container's ready, a liveness (or startup) failure kills the container,
// whose restart policy then decides what follows.

type probeKind int

const (
	probeStartup probeKind = iota
	probeReadiness
	probeLiveness
)

func (k probeKind) String() string {
	return [...]string{"startup", "readiness", "liveness"}[k]
}

// probeTiming is a probe's timing with the API server's defaults applied
// (the lab's API server stores probes as written).
type probeTiming struct {
	initialDelay, period, timeout time.Duration
	success, failure              int
}

func timingOf(p *corev1.Probe, kind probeKind) probeTiming {
	t := probeTiming{
		initialDelay: time.Duration(p.InitialDelaySeconds) * time.Second,
		period:       10 * time.Second, timeout: time.Second, success: 1, failure: 3,
	}
	if p.PeriodSeconds > 0 {
		t.period = time.Duration(p.PeriodSeconds) * time.Second
	}
	if p.TimeoutSeconds > 0 {
		t.timeout = time.Duration(p.TimeoutSeconds) * time.Second
	}
	// The API server refuses successThreshold > 1 for liveness and startup.
	if p.SuccessThreshold > 0 && kind == probeReadiness {
		t.success = int(p.SuccessThreshold)
	}
	if p.FailureThreshold > 0 {
		t.failure = int(p.FailureThreshold)
	}
	return t
}

// probeState is what a kubelet's probe worker decides from a probe's
// outcomes, without I/O or clock: the result changes after successThreshold
// successes or failureThreshold failures in a row. Readiness starts failed
// (a container is not ready before its probe says so), liveness succeeded,
// startup not yet succeeded. A liveness or startup failure holds the
// worker: the container is killed and this instance never probed again.
type probeState struct {
	kind   probeKind
	timing probeTiming
	result bool
	last   bool // the latest outcome
	run    int  // how many outcomes in a row were last
	onHold bool
}

func newProbeState(kind probeKind, t probeTiming) probeState {
	return probeState{kind: kind, timing: t, result: kind == probeLiveness}
}

// observe records one outcome: changed says the result changed, kill that
// the container must be killed.
func (s *probeState) observe(ok bool) (changed, kill bool) {
	if s.onHold {
		return false, false
	}
	if s.run > 0 && ok == s.last {
		s.run++
	} else {
		s.last, s.run = ok, 1
	}
	need := s.timing.failure
	if ok {
		need = s.timing.success
	}
	if s.run < need {
		return false, false
	}
	changed = s.result != ok
	s.result = ok
	if !ok && s.kind != probeReadiness {
		s.onHold, s.run = true, 0
		return changed, true
	}
	return changed, false
}

// firstProbe is when a worker first probes a container that started at
// started: once initialDelaySeconds have passed; then every periodSeconds.
func (t probeTiming) firstProbe(started time.Time) time.Time {
	return started.Add(t.initialDelay)
}

// nextProbe is the probe after the one due at prev: a period later, or,
// when a slow probe let that pass too, the first period boundary after
// now (as a ticker drops the ticks it missed).
func (t probeTiming) nextProbe(prev, now time.Time) time.Time {
	next := prev.Add(t.period)
	if next.After(now) {
		return next
	}
	return prev.Add((now.Sub(prev)/t.period + 1) * t.period)
}

// probeFunc runs one probe; it returns within the probe's timeout (ctx
// ends then), false with why on failure.
type probeFunc func(ctx context.Context) (ok bool, why string)

// containerProbes are the probe workers of one container instance.
type containerProbes struct {
	instance int // the instance's shim: a restarted container gets new workers
	cancel   context.CancelFunc
	states   map[probeKind]*probeState
}

// started says whether the startup probe (if any) succeeded.
func (c *containerProbes) started() bool {
	s := c.states[probeStartup]
	return s == nil || s.result
}

// ready says whether the container is ready: started, and its readiness
// probe (if any) succeeded.
func (c *containerProbes) ready() bool {
	if !c.started() {
		return false
	}
	s := c.states[probeReadiness]
	return s == nil || s.result
}

// podProbes are the probe workers of one pod.
type podProbes struct {
	containers map[string]*containerProbes
}

// prober runs the probes of a node's pods. Its zero value is usable.
type prober struct {
	clock clock.WithTicker // nil: the real clock
	// changed is called when a result changes (the kubelet writes the
	// pod's status sooner than its next pass); may be nil.
	changed func()

	mu   sync.Mutex
	pods map[string]*podProbes // by namespace/name
}

func (p *prober) clk() clock.WithTicker {
	if p.clock == nil {
		return clock.RealClock{}
	}
	return p.clock
}

// probeSeed is what the API last said of a container instance that ran
// before this prober started (the agent restarted): its results carry on
// rather than a restart making every probed pod unready until its next
// probe.
type probeSeed struct{ started, ready bool }

// probeSpec is one probe of a container to run.
type probeSpec struct {
	kind  probeKind
	probe *corev1.Probe
	run   probeFunc
}

// ensure starts the workers of a running container instance (its shim's
// PID; started when it started) unless they run already; the workers of an older instance
// stop. kill kills the instance when its liveness or startup probe fails
// (the kubelet's restart policy follows its exit).
func (p *prober) ensure(pod, container string, instance int, started time.Time, specs []probeSpec, seed *probeSeed, kill func(kind probeKind, why string)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pods == nil {
		p.pods = map[string]*podProbes{}
	}
	pp := p.pods[pod]
	if pp == nil {
		pp = &podProbes{containers: map[string]*containerProbes{}}
		p.pods[pod] = pp
	}
	if c := pp.containers[container]; c != nil {
		if c.instance == instance {
			return
		}
		c.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &containerProbes{instance: instance, cancel: cancel, states: map[probeKind]*probeState{}}
	pp.containers[container] = c
	for _, s := range specs {
		st := newProbeState(s.kind, timingOf(s.probe, s.kind))
		if seed != nil {
			switch s.kind {
			case probeStartup:
				st.result = seed.started
			case probeReadiness:
				st.result = seed.ready
			}
		}
		c.states[s.kind] = &st
		go p.work(ctx, c, &st, started, s.run, kill)
	}
}

// forget stops the workers of a container that is not running.
func (p *prober) forget(pod, container string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pp := p.pods[pod]; pp != nil {
		if c := pp.containers[container]; c != nil {
			c.cancel()
			delete(pp.containers, container)
		}
	}
}

// stop stops every worker of a pod (it is gone).
func (p *prober) stop(pod string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pp := p.pods[pod]; pp != nil {
		for _, c := range pp.containers {
			c.cancel()
		}
		delete(p.pods, pod)
	}
}

// state says whether a running container instance has started and is
// ready; a container without workers (yet) is neither when it has probes.
func (p *prober) state(pod, container string, instance int) (started, ready bool, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.pods[pod]
	if pp == nil {
		return false, false, false
	}
	c := pp.containers[container]
	if c == nil || c.instance != instance {
		return false, false, false
	}
	return c.started(), c.ready(), true
}

// work is one probe worker: it probes at firstProbe, then every period,
// until ctx ends or the probe holds (liveness, startup failed) or, for a
// startup probe, succeeded. Readiness and liveness wait for the startup
// probe.
func (p *prober) work(ctx context.Context, c *containerProbes, st *probeState, started time.Time, run probeFunc, kill func(probeKind, string)) {
	clk := p.clk()
	due := st.timing.firstProbe(started)
	timer := clk.NewTimer(max(due.Sub(clk.Now()), 0))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		}
		p.mu.Lock()
		gated := st.kind != probeStartup && !c.started()
		done := st.onHold || (st.kind == probeStartup && st.result)
		p.mu.Unlock()
		if done {
			return
		}
		if !gated {
			pctx, cancel := context.WithTimeout(ctx, st.timing.timeout)
			ok, why := run(pctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			changed, failed := st.observe(ok)
			p.mu.Unlock()
			if failed {
				kill(st.kind, st.kind.String()+" probe failed: "+why)
			}
			if changed && p.changed != nil {
				p.changed()
			}
		}
		due = st.timing.nextProbe(due, clk.Now())
		timer.Reset(due.Sub(clk.Now()))
	}
}
