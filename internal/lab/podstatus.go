package lab

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// status is the pod's status as a kubelet reports it: address, phase,
// readiness and container states, read from the shims' records and the
// probes' results.
func (k *kubelet) status(pod *corev1.Pod, notStarted string) corev1.PodStatus {
	rec := k.pods[pod.Namespace+"/"+pod.Name]
	if rec == nil || rec.IP == "" {
		return corev1.PodStatus{Phase: corev1.PodPending}
	}
	created := metav1.NewTime(rec.Created)
	st := corev1.PodStatus{
		Phase: corev1.PodPending, PodIP: rec.IP, PodIPs: []corev1.PodIP{{IP: rec.IP}},
		HostIP: k.cfg.NodeIP.String(), HostIPs: []corev1.HostIP{{IP: k.cfg.NodeIP.String()}}, StartTime: &created,
	}
	if rec.Containers == nil {
		st.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotStarted", Message: notStarted}}
		if waiting, unmapped := k.imageWaits(pod); unmapped != "" {
			st.ContainerStatuses = waiting
			st.Conditions[0].Message = unmapped
		}
		return st
	}
	policy := restartPolicyOf(pod)
	running, restarting, failed := 0, 0, 0
	var unready []string
	for i := range rec.Containers {
		c := &rec.Containers[i]
		spec, _ := containerSpec(pod, c.Name)
		cs := corev1.ContainerStatus{Name: c.Name, Image: spec.Image, RestartCount: int32(c.RestartCount), Started: ptr(false)}
		if c.Last != nil {
			cs.LastTerminationState.Terminated = terminated(&c.Last.Exit, c.Last.Reason, c.Last.Started)
		}
		es, reason, ended := exitOf(c)
		switch {
		case !ended:
			running++
			started, ready, known := k.probes.state(rec.key(), c.Name, c.ShimPID)
			if !known { // no workers yet
				if seed := seedOf(pod, c); seed != nil { // the agent restarted: as it was
					started, ready = seed.started, seed.ready
				} else { // what kubelet assumes before a probe ran
					started = spec.StartupProbe == nil
					ready = started && spec.ReadinessProbe == nil
				}
			}
			cs.Started, cs.Ready = &started, ready
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.Started)}
		case restarts(policy, es.ExitCode):
			restarting++
			cs.LastTerminationState.Terminated = terminated(es, reason, c.Started)
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", c.BackOff, c.Name, pod.Name, pod.Namespace, pod.UID)}
		default:
			if es.ExitCode != 0 {
				failed++
			}
			cs.State.Terminated = terminated(es, reason, c.Started)
		}
		if !cs.Ready {
			unready = append(unready, c.Name)
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	// kubelet's getPhase: a pod whose containers run or will run again is
	// Running; once none will, Failed if one failed, else Succeeded.
	switch {
	case running > 0 || restarting > 0:
		st.Phase = corev1.PodRunning
	case failed > 0:
		st.Phase = corev1.PodFailed
	default:
		st.Phase = corev1.PodSucceeded
	}
	ready := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	switch {
	case st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed:
		ready.Status, ready.Reason = corev1.ConditionFalse, "PodCompleted"
	case len(unready) > 0:
		ready.Status, ready.Reason = corev1.ConditionFalse, "ContainersNotReady"
		ready.Message = "containers with unready status: [" + strings.Join(unready, " ") + "]"
	}
	st.Conditions = []corev1.PodCondition{ready}
	return st
}

func terminated(es *ExitStatus, reason string, started time.Time) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{
		ExitCode: int32(es.ExitCode), Reason: reason, Message: es.Error,
		StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(es.FinishedAt.Truncate(time.Second)),
	}
}
