package lab

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shuntnet/shunt/internal/podexec"
)

// An exec (`shunt lab exec`, the kubelet API's exec) enters a container as
// it runs: it joins the container's process (podexec.Join), found here from
// the kubelet's records, so both take one path and neither can hold more
// than the container does.

// ErrContainerNotRunning: the container has no process to enter.
type ErrContainerNotRunning struct{ Pod, Container, Why string }

func (e ErrContainerNotRunning) Error() string {
	return fmt.Sprintf("container %s of pod %s is not running (%s)", e.Container, e.Pod, e.Why)
}

// container returns the pod's container of that name (empty: its first,
// as kubectl's default).
func (r *PodRecord) container(name string) (*ContainerRecord, error) {
	if len(r.Containers) == 0 {
		return nil, ErrContainerNotRunning{Pod: r.key(), Container: name, Why: "its containers are not started"}
	}
	if name == "" {
		return &r.Containers[0], nil
	}
	var names []string
	for i := range r.Containers {
		if r.Containers[i].Name == name {
			return &r.Containers[i], nil
		}
		names = append(names, r.Containers[i].Name)
	}
	return nil, fmt.Errorf("pod %s has no container %q (it has %s)", r.key(), name, strings.Join(names, ", "))
}

// process is the container's process: the child of its shim.
func (c *ContainerRecord) process(pod string) (int, error) {
	if es, ok := readExitStatus(c.ExitFile); ok {
		return 0, ErrContainerNotRunning{Pod: pod, Container: c.Name, Why: fmt.Sprintf("it exited with code %d at %s", es.ExitCode, es.FinishedAt.Format("15:04:05"))}
	}
	// The shim's command line names the exit file: a PID reused by
	// another process after a reboot is no shim of this container.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.ShimPID))
	if err != nil || !strings.Contains(string(cmdline), "\x00"+c.ExitFile+"\x00") {
		return 0, ErrContainerNotRunning{Pod: pod, Container: c.Name, Why: "its shim is gone"}
	}
	// A shim just started may not have started the container yet: its
	// child comes within moments (the shim enters the pod, then forks).
	deadline := time.Now().Add(containerStartWait)
	for {
		pids, err := childrenOf(c.ShimPID)
		if err != nil {
			return 0, err
		}
		if len(pids) == 1 {
			return pids[0], nil
		}
		if es, ok := readExitStatus(c.ExitFile); ok {
			return 0, ErrContainerNotRunning{Pod: pod, Container: c.Name, Why: fmt.Sprintf("it exited with code %d at %s", es.ExitCode, es.FinishedAt.Format("15:04:05"))}
		}
		if len(pids) > 1 || time.Now().After(deadline) {
			return 0, ErrContainerNotRunning{Pod: pod, Container: c.Name, Why: fmt.Sprintf("its shim (pid %d) has %d processes, not one", c.ShimPID, len(pids))}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// containerStartWait is how long an exec waits for a just started shim to
// start its container.
const containerStartWait = 3 * time.Second

// childrenOf lists the processes whose parent is pid (the kernel's
// /proc/PID/task/TID/children needs CONFIG_PROC_CHILDREN, often absent).
func childrenOf(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var kids []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, n)
		}
	}
	return kids, nil
}

// joinContainer is the container's running process, as an exec enters it.
func joinContainer(rec *PodRecord, container, cgroupRoot string) (podexec.Joined, error) {
	c, err := rec.container(container)
	if err != nil {
		return podexec.Joined{}, err
	}
	pid, err := c.process(rec.key())
	if err != nil {
		return podexec.Joined{}, err
	}
	j, err := podexec.Join(pid, cgroupRoot)
	if err != nil {
		return j, fmt.Errorf("container %s of pod %s: %w", c.Name, rec.key(), err)
	}
	return j, nil
}

// JoinContainer is a pod's running container, as `shunt lab exec` enters
// it: found in the records of the node instance whose state directory is
// stateDir (container "": the pod's first).
func JoinContainer(stateDir, namespace, pod, container, cgroupRoot string) (podexec.Joined, error) {
	pods, _, err := loadPodRecords(podRecordsPath(stateDir), nil)
	if err != nil {
		return podexec.Joined{}, err
	}
	rec := pods[namespace+"/"+pod]
	if rec == nil {
		return podexec.Joined{}, fmt.Errorf("pod %s/%s has no sandbox on this node", namespace, pod)
	}
	return joinContainer(rec, container, cgroupRoot)
}
