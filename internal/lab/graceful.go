package lab

import (
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/procstat"
)

// stopGracefully stops a deleted pod's containers as kubelet does before
// it removes the pod: SIGTERM to each (its shim passes it on) at the
// first call, and the pod may go once they all exited or its deletion
// grace period has passed (the sandbox's removal then kills what is
// left). It says whether the pod may go now; the kubelet's passes call it
// again meanwhile, so no pass waits. An agent uses that time to uninstall
// itself when its DaemonSet is gone (shuntd --uninstall-when-removed).
func (k *kubelet) stopGracefully(pod *corev1.Pod, rec *PodRecord) bool {
	alive := false
	for _, c := range rec.Containers {
		alive = alive || procstat.Running(c.ShimPID)
	}
	key := rec.key()
	if !alive {
		delete(k.stopping, key)
		return true
	}
	if k.stopping == nil {
		k.stopping = map[string]time.Time{}
	}
	since, ok := k.stopping[key]
	if !ok {
		k.stopping[key] = time.Now()
		for _, c := range rec.Containers {
			syscall.Kill(c.ShimPID, syscall.SIGTERM)
		}
		k.cfg.Log.Info("stopping the containers of a deleted pod", "pod", key)
		return false
	}
	grace := 30 * time.Second
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	if time.Since(since) < grace {
		return false
	}
	delete(k.stopping, key)
	return true
}
