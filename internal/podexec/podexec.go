// Package podexec starts processes inside a lab pod: in the pod's network
// namespace and cgroup, as a container runtime would.
package podexec

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Target is where a process runs.
type Target struct {
	NetnsPath  string // bind-mounted network namespace; empty keeps the caller's
	CgroupPath string // cgroup v2 directory; empty keeps the caller's
}

// Start starts cmd inside the target. The child is cloned straight into the
// cgroup (CLONE_INTO_CGROUP), so it never runs outside it, not even briefly.
func Start(t Target, cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if t.CgroupPath != "" {
		fd, err := unix.Open(t.CgroupPath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening cgroup %s: %w", t.CgroupPath, err)
		}
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = fd
	}
	if t.NetnsPath == "" {
		return cmd.Start()
	}
	ns, err := netns.GetFromPath(t.NetnsPath)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", t.NetnsPath, err)
	}
	defer ns.Close()
	// The child inherits the namespace of the thread that forks it. Switch a
	// locked thread that is never unlocked: Go discards it when this
	// goroutine ends, so no other goroutine runs in the pod's namespace.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("entering network namespace %s: %w", t.NetnsPath, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}
