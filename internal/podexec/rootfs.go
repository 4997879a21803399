package podexec

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is a bind mount into a container's root file system: a volume.
type Mount struct {
	Source   string // on the node
	Target   string // in the container
	ReadOnly bool
}

// String is the form the shim's --mount flag takes: SOURCE:TARGET[:ro].
func (m Mount) String() string {
	s := m.Source + ":" + m.Target
	if m.ReadOnly {
		s += ":ro"
	}
	return s
}

// ParseMount reads SOURCE:TARGET[:ro].
func ParseMount(s string) (Mount, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !filepath.IsAbs(parts[1]) || (len(parts) == 3 && parts[2] != "ro") {
		return Mount{}, fmt.Errorf("mount %q: want SOURCE:TARGET[:ro] with an absolute TARGET", s)
	}
	return Mount{Source: parts[0], Target: parts[1], ReadOnly: len(parts) == 3}, nil
}

// mountRootfsOnThread gives the locked thread a mount namespace of its own
// (the child forked from it inherits it) where the container's root file
// system has what a runtime gives it: /proc, /sys (of the network
// namespace the thread is in), the node's /dev, and the volumes
// bind-mounted. The mounts are slaves of the node's: a volume sees what
// the node mounts below it later (HostToContainer), nothing mounted here
// reaches the node. The thread then chroots into root (chrootThread).
func mountRootfsOnThread(root string, mounts []Mount, readOnlySys bool) error {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return fmt.Errorf("new mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making the mounts slaves: %w", err)
	}
	// The image's directory on the node, a mount of its own, so that what
	// is mounted below it stays in this namespace.
	if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting the root file system %s: %w", root, err)
	}
	at := func(p string) (string, error) {
		t := filepath.Join(root, filepath.Clean("/"+p))
		return t, os.MkdirAll(t, 0o755)
	}
	proc, err := at("/proc")
	if err != nil {
		return err
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc in %s: %w", root, err)
	}
	sys, err := at("/sys")
	if err != nil {
		return err
	}
	sysFlags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if readOnlySys {
		sysFlags |= unix.MS_RDONLY
	}
	if err := unix.Mount("sysfs", sys, "sysfs", sysFlags, ""); err != nil {
		return fmt.Errorf("mounting /sys in %s: %w", root, err)
	}
	dev, err := at("/dev")
	if err != nil {
		return err
	}
	if err := unix.Mount("/dev", dev, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting /dev in %s: %w", root, err)
	}
	for _, m := range mounts {
		fi, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("volume %s: %w", m.Source, err)
		}
		target := filepath.Join(root, filepath.Clean("/"+m.Target))
		if fi.IsDir() {
			err = os.MkdirAll(target, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
				f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("volume mount point %s: %w", m.Target, err)
		}
		if err := unix.Mount(m.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s at %s: %w", m.Source, m.Target, err)
		}
		if m.ReadOnly {
			if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("making %s read-only: %w", m.Target, err)
			}
		}
	}
	return nil
}

// chrootThread makes root the locked thread's root (and working
// directory), which the child forked from it inherits. The thread gets a
// copy of the process's root and working directory first, so no other
// thread is moved.
func chrootThread(root string) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unsharing the thread's file system attributes: %w", err)
	}
	if err := unix.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	return unix.Chdir("/")
}

// LookPathIn finds a program in a root file system, as a runtime resolves
// a container's argv[0] on the image's PATH: the path in the container.
func LookPathIn(root, name, pathEnv string) (string, error) {
	if strings.Contains(name, "/") {
		if isExecutable(filepath.Join(root, name)) {
			return name, nil
		}
		return "", fmt.Errorf("%s: no such executable in the image", name)
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		p := filepath.Join(dir, name)
		if isExecutable(filepath.Join(root, p)) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found on the image's PATH %s", name, pathEnv)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
