package lab

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// initContainerTimeout bounds how long the kubelet waits for one init
// container: they run while the pod's start waits (the chart's install-cni
// copies two files).
const initContainerTimeout = 2 * time.Minute

// runInitContainers runs the pod's init containers one after another, each
// to its end, before its containers start, as kubelet does; one that fails
// fails the start (retried at the next pass, init containers again).
func (k *kubelet) runInitContainers(pod *corev1.Pod, rec *PodRecord) error {
	dir := k.podDir(rec)
	for _, c := range pod.Spec.InitContainers {
		cr := ContainerRecord{Name: c.Name, LogFile: filepath.Join(dir, c.Name+".log"), ExitFile: filepath.Join(dir, c.Name+".exit")}
		os.Remove(cr.ExitFile)
		if err := k.startContainer(pod, rec, c, &cr); err != nil {
			return fmt.Errorf("init %w", err) // "init container NAME: ..."
		}
		deadline := time.Now().Add(initContainerTimeout)
		for {
			if st, ok := readExitStatus(cr.ExitFile); ok {
				if st.ExitCode != 0 {
					return fmt.Errorf("init container %s exited with %d %s: %s", c.Name, st.ExitCode, st.Error, tail(readLogText(cr.LogFile), 512))
				}
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("init container %s still runs after %s", c.Name, initContainerTimeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
