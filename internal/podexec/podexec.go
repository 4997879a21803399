// Package podexec starts processes inside a lab pod: in the pod's network
// namespace and cgroup, as a container runtime would.
package podexec

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Target is where a process runs.
type Target struct {
	NetnsPath  string // bind-mounted network namespace; empty keeps the caller's
	CgroupPath string // cgroup v2 directory; empty keeps the caller's
	// Security restricts the process as a container's securityContext
	// does; nil keeps the caller's privileges.
	Security *Security
	// Hide covers these directories, where they exist, with an empty
	// read-only tmpfs in a mount namespace of the process's own: what a
	// container runtime leaves out of a container's file system.
	Hide []string
	// Hostname gives the process a UTS namespace of its own with this host
	// name (a pod's: its name, or spec.hostname), as a runtime gives each
	// pod; empty keeps the caller's.
	Hostname string
	// MountNsPath is a mount namespace to join (a running container's,
	// /proc/PID/ns/mnt); empty keeps the caller's (or, with Hide, a new
	// one).
	MountNsPath string
	// UTSNsPath is a UTS namespace to join (a running container's, with
	// its host name); empty keeps the caller's (or, with Hostname, a new
	// one).
	UTSNsPath string
	// Binds are bind-mounted in a mount namespace of the process's own
	// (the one Hide makes, or a new one), before Hide covers anything: what
	// a runtime mounts into a container (the pod's /etc/resolv.conf and
	// /etc/hosts, its volumes).
	Binds []Bind
	// Rootfs runs the process chrooted in this root file system (an
	// image's, unpacked), in a mount namespace of its own with /proc,
	// /sys, /dev and Mounts (rootfs.go); cmd.Path is the path in it.
	Rootfs string
	Mounts []Mount
	// Chroot is a root to run in (a running container's, /proc/PID/root,
	// for an exec into it), entered before the capabilities are dropped:
	// chroot needs CAP_SYS_CHROOT, which the container may not have.
	Chroot string
}

// Bind is one bind mount: Source (a file or directory of the node) seen
// at Target. A missing Target is created as what Source is (an empty
// directory or file), as runc creates mount points in a container's root.
type Bind struct {
	Source, Target string
	ReadOnly       bool
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
	var mask uint64
	if s := t.Security; s != nil {
		var err error
		if mask, err = s.kept(); err != nil {
			return err
		}
		if s.UID != nil || s.GID != nil {
			cred := &syscall.Credential{Groups: s.Groups}
			if s.UID != nil {
				cred.Uid = *s.UID
			}
			if s.GID != nil {
				cred.Gid = *s.GID
			}
			cmd.SysProcAttr.Credential = cred
		}
	}
	if t.NetnsPath == "" && t.Security == nil && len(t.Hide) == 0 && len(t.Binds) == 0 && t.Hostname == "" && t.MountNsPath == "" && t.UTSNsPath == "" && t.Rootfs == "" && t.Chroot == "" {
		return cmd.Start()
	}
	var ns netns.NsHandle = -1
	if t.NetnsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(t.NetnsPath); err != nil {
			return fmt.Errorf("opening network namespace %s: %w", t.NetnsPath, err)
		}
		defer ns.Close()
	}
	mnt := -1
	if t.MountNsPath != "" {
		var err error
		if mnt, err = unix.Open(t.MountNsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("opening mount namespace %s: %w", t.MountNsPath, err)
		}
		defer unix.Close(mnt)
	}
	uts := -1
	if t.UTSNsPath != "" {
		var err error
		if uts, err = unix.Open(t.UTSNsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("opening UTS namespace %s: %w", t.UTSNsPath, err)
		}
		defer unix.Close(uts)
	}
	// The child inherits the namespace and the capabilities of the thread
	// that forks it. Change a locked thread that is never unlocked: Go
	// discards it when this goroutine ends, so no other goroutine runs in
	// the pod's namespace or with the container's privileges.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if ns != -1 {
			if err := netns.Set(ns); err != nil {
				errc <- fmt.Errorf("entering network namespace %s: %w", t.NetnsPath, err)
				return
			}
		}
		if t.Hostname != "" {
			if err := unix.Unshare(unix.CLONE_NEWUTS); err != nil {
				errc <- fmt.Errorf("new UTS namespace: %w", err)
				return
			}
			if err := unix.Sethostname([]byte(t.Hostname)); err != nil {
				errc <- fmt.Errorf("setting the host name %q: %w", t.Hostname, err)
				return
			}
		}
		if uts != -1 {
			if err := unix.Setns(uts, unix.CLONE_NEWUTS); err != nil {
				errc <- fmt.Errorf("entering UTS namespace %s: %w", t.UTSNsPath, err)
				return
			}
		}
		if mnt != -1 {
			// A thread shares its root and working directory with the
			// process's other threads; setns refuses a mount namespace
			// to a thread that does, so it takes a copy first.
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				errc <- fmt.Errorf("unsharing the thread's file system attributes: %w", err)
				return
			}
			if err := unix.Setns(mnt, unix.CLONE_NEWNS); err != nil {
				errc <- fmt.Errorf("entering mount namespace %s: %w", t.MountNsPath, err)
				return
			}
		}
		if t.Rootfs != "" {
			privileged := t.Security == nil || t.Security.Privileged
			if err := mountRootfsOnThread(t.Rootfs, t.Mounts, !privileged); err != nil {
				errc <- err
				return
			}
			if err := chrootThread(t.Rootfs); err != nil {
				errc <- err
				return
			}
		} else if len(t.Hide) > 0 || len(t.Binds) > 0 {
			if err := mountOnThread(t.Binds, t.Hide); err != nil {
				errc <- err
				return
			}
		}
		if t.Chroot != "" {
			if err := chrootThread(t.Chroot); err != nil {
				errc <- err
				return
			}
		}
		if t.Security != nil {
			if err := restrictThread(mask, cmd.SysProcAttr.Credential != nil); err != nil {
				errc <- err
				return
			}
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// mountOnThread gives the locked thread a mount namespace of its own (the
// child forked from it inherits it) with binds mounted, then each directory
// of hide an empty read-only tmpfs (binds come first: their sources may be
// in a hidden directory). Mounts stay slaves of the node's, so nothing
// done here reaches the node.
func mountOnThread(binds []Bind, hide []string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("new mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making the mounts slaves: %w", err)
	}
	for _, b := range binds {
		if err := bindMount(b); err != nil {
			return err
		}
	}
	for _, d := range hide {
		if _, err := os.Stat(d); err != nil {
			continue // nothing to hide
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555"); err != nil {
			return fmt.Errorf("hiding %s: %w", d, err)
		}
	}
	return nil
}

// bindMount mounts b.Source at b.Target (read-only when asked: a bind
// mount takes that flag only from a remount).
func bindMount(b Bind) error {
	st, err := os.Stat(b.Source)
	if err != nil {
		return fmt.Errorf("bind mount source: %w", err)
	}
	if _, err := os.Lstat(b.Target); errors.Is(err, os.ErrNotExist) {
		if st.IsDir() {
			err = os.MkdirAll(b.Target, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(b.Target), 0o755); err == nil {
			err = os.WriteFile(b.Target, nil, 0o644)
		}
		if err != nil {
			return fmt.Errorf("creating the mount point %s: %w", b.Target, err)
		}
	}
	if err := unix.Mount(b.Source, b.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mounting %s at %s: %w", b.Source, b.Target, err)
	}
	if b.ReadOnly {
		if err := unix.Mount("", b.Target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", b.Target, err)
		}
	}
	return nil
}
