package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/podexec"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/procstat"
)

// Containers after they start, as kubelet keeps them: restarted after an
// exit as the pod's restartPolicy says (Always, the API server's default,
// OnFailure, Never), with kubelet's crash-loop back-off (the first restart
// at once, then 10 s doubling up to 5 min, reset once a container ran 10
// min; Config.CrashLoopBackOff shortens it), and probed (probes.go).

const (
	defaultCrashLoopBackOff    = 10 * time.Second
	defaultMaxCrashLoopBackOff = 5 * time.Minute
)

// LastRun is how a container's previous instance ended.
type LastRun struct {
	Started time.Time  `json:"started"`
	Exit    ExitStatus `json:"exit"`
	Reason  string     `json:"reason"`
	// LogFile is its log (kubectl logs --previous), kept until the next
	// restart.
	LogFile string `json:"logFile,omitempty"`
}

func (c Config) backOffs() (initial, most time.Duration) {
	initial, most = c.CrashLoopBackOff, c.MaxCrashLoopBackOff
	if initial <= 0 {
		initial = defaultCrashLoopBackOff
	}
	if most <= 0 {
		most = defaultMaxCrashLoopBackOff
	}
	return initial, max(initial, most)
}

// nextBackOff is the back-off after a restart that waited cur: the
// initial one after an immediate restart, else double, at most most.
func nextBackOff(cur, initial, most time.Duration) time.Duration {
	if cur <= 0 {
		return initial
	}
	return min(2*cur, most)
}

func restartPolicyOf(p *corev1.Pod) corev1.RestartPolicy {
	if p.Spec.RestartPolicy == "" {
		return corev1.RestartPolicyAlways // the API server's default
	}
	return p.Spec.RestartPolicy
}

// restarts says whether a container that exited with code restarts.
func restarts(policy corev1.RestartPolicy, code int) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return true
}

// exitOf says whether a container instance ended, how, and the reason a
// kubelet gives: its shim's record, or a shim gone without one (killed,
// or the node rebooted).
func exitOf(c *ContainerRecord) (*ExitStatus, string, bool) {
	if es, ok := readExitStatus(c.ExitFile); ok {
		if es.ExitCode == 0 {
			return es, "Completed", true
		}
		return es, "Error", true
	}
	if procstat.Running(c.ShimPID) {
		return nil, "", false
	}
	return &ExitStatus{ExitCode: 137, Error: "the container's shim is gone without recording an exit status"}, "Unknown", true
}

// syncContainers brings the containers of the node's running pods to
// their spec: those that exited restart when their policy and back-off
// say so, running ones get their probe workers, ended ones lose them.
// Records it changed are saved.
func (k *kubelet) syncContainers(pods []*corev1.Pod) error {
	var errs []error
	restarted := false
	now := time.Now()
	initial, most := k.cfg.backOffs()
	for _, pod := range pods {
		rec := k.pods[pod.Namespace+"/"+pod.Name]
		if rec == nil || rec.Containers == nil {
			continue
		}
		for i := range rec.Containers {
			c := &rec.Containers[i]
			spec, ok := containerSpec(pod, c.Name)
			if !ok {
				continue
			}
			es, reason, ended := exitOf(c)
			if !ended {
				k.probeContainer(pod, rec, spec, c)
				continue
			}
			k.probes.forget(rec.key(), c.Name)
			if !restarts(restartPolicyOf(pod), es.ExitCode) {
				continue
			}
			if !es.FinishedAt.IsZero() && es.FinishedAt.Sub(c.Started) >= 2*most {
				c.BackOff = 0 // it ran long enough: kubelet forgets its back-off
			}
			if now.Before(es.FinishedAt.Add(c.BackOff)) {
				continue
			}
			// A new exit file per instance: the old one is the record of
			// this exit until the new instance runs.
			next := *c
			next.ExitFile = filepath.Join(filepath.Dir(c.ExitFile), fmt.Sprintf("%s.%d.exit", c.Name, c.RestartCount+1))
			// A log per instance: the one before stays for --previous.
			next.LogFile = filepath.Join(filepath.Dir(c.LogFile), fmt.Sprintf("%s.%d.log", c.Name, c.RestartCount+1))
			if err := k.startContainer(pod, rec, spec, &next); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: restarting %w", rec.key(), err))
				continue
			}
			os.Remove(c.ExitFile)
			if c.Last != nil && c.Last.LogFile != "" {
				os.Remove(c.Last.LogFile)
			}
			next.Last = &LastRun{Started: c.Started, Exit: *es, Reason: reason, LogFile: c.LogFile}
			next.RestartCount++
			next.BackOff = nextBackOff(c.BackOff, initial, most)
			*c = next
			restarted = true
			k.cfg.Log.Info("container restarted", "pod", rec.key(), "container", c.Name, "restarts", c.RestartCount,
				"exitCode", es.ExitCode, "nextBackOff", c.BackOff)
		}
	}
	if restarted {
		errs = append(errs, k.save())
	}
	return errors.Join(errs...)
}

func containerSpec(pod *corev1.Pod, name string) (corev1.Container, bool) {
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return c, true
		}
	}
	return corev1.Container{}, false
}

// netnsOf is the network namespace a pod's containers run in ("": the
// node's, for hostNetwork pods).
func (k *kubelet) netnsOf(pod *corev1.Pod, rec *PodRecord) string {
	if rec.HostNetwork {
		return ""
	}
	return podnet.NetnsPath(rec.Netns)
}

// killContainer stops a container instance as kubelet does before a
// restart: SIGTERM (its shim passes it on), then after the grace period
// SIGKILL to what still runs under the shim, which records the exit.
func killContainer(shimPID int, grace time.Duration) {
	if !procstat.Running(shimPID) {
		return
	}
	syscall.Kill(shimPID, syscall.SIGTERM)
	go func() {
		deadline := time.Now().Add(grace)
		for time.Now().Before(deadline) {
			if !procstat.Running(shimPID) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", shimPID, shimPID))
		if err != nil {
			return
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
}

// gracePeriod is how long a container killed for a failed probe may take
// to stop: the probe's terminationGracePeriodSeconds, else the pod's, else
// 30 s.
func gracePeriod(pod *corev1.Pod, probe *corev1.Probe) time.Duration {
	switch {
	case probe != nil && probe.TerminationGracePeriodSeconds != nil:
		return time.Duration(*probe.TerminationGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// probeContainer makes sure a running container instance has its probe
// workers.
func (k *kubelet) probeContainer(pod *corev1.Pod, rec *PodRecord, spec corev1.Container, c *ContainerRecord) {
	target := probeTarget{podIP: rec.IP, env: c.env, dir: spec.WorkingDir, exec: k.execTarget(pod, rec, spec, c.Binds)}
	imagePath := ""
	if img, _ := findLayoutImage(k.cfg.Images.Layouts, spec.Image); img != nil {
		target.imageShim = c.ShimPID
		imagePath = img.imagePath()
	}
	if target.env == nil {
		// An instance an earlier agent started: its environment again.
		env, err := k.containerEnv(pod, rec, spec, imagePath)
		if err != nil {
			k.cfg.Log.Warn("exec probes run without the container's variables", "pod", rec.key(), "container", c.Name, "err", err)
			env = k.labEnv(pod, rec, imagePath)
		}
		c.env, target.env = env, env
	}
	var specs []probeSpec
	for kind, p := range map[probeKind]*corev1.Probe{probeStartup: spec.StartupProbe, probeReadiness: spec.ReadinessProbe, probeLiveness: spec.LivenessProbe} {
		if p != nil {
			specs = append(specs, probeSpec{kind: kind, probe: p, run: runnerOf(spec, p, target)})
		}
	}
	shim := c.ShimPID
	name, key := c.Name, rec.key()
	kill := func(kind probeKind, why string) {
		probe := spec.LivenessProbe
		if kind == probeStartup {
			probe = spec.StartupProbe
		}
		k.cfg.Log.Info("killing container: it failed its probe", "pod", key, "container", name, "why", why)
		killContainer(shim, gracePeriod(pod, probe))
	}
	k.probes.ensure(key, c.Name, c.ShimPID, c.Started, specs, seedOf(pod, c), kill)
}

// seedOf is the pod status's word on this container instance, if it has
// one (the instance ran before this agent).
func seedOf(pod *corev1.Pod, c *ContainerRecord) *probeSeed {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == c.Name && cs.State.Running != nil && cs.State.Running.StartedAt.Time.Equal(c.Started) &&
			int(cs.RestartCount) == c.RestartCount {
			return &probeSeed{started: cs.Started != nil && *cs.Started, ready: cs.Ready}
		}
	}
	return nil
}

// execTarget is where an exec probe runs: inside the container, as its
// shim starts it (network namespace, cgroup, privileges, the node's
// directories hidden unless privileged, its resolv.conf, hosts and volumes
// mounted).
func (k *kubelet) execTarget(pod *corev1.Pod, rec *PodRecord, spec corev1.Container, binds []podexec.Bind) podexec.Target {
	sec := containerSecurity(pod, spec)
	t := podexec.Target{NetnsPath: k.netnsOf(pod, rec), CgroupPath: rec.Cgroup, Security: &sec, Binds: binds}
	if !sec.Privileged {
		t.Hide = instance.NodeOnlyDirs()
	}
	return t
}
