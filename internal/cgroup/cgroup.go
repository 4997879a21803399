// Package cgroup manages the cgroup v2 directories of lab pods. A pod's
// processes live in its own cgroup so that shunt's socket-layer BPF programs
// (attached to cgroups) see them as that pod, and so a pod can be killed whole.
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Root finds the cgroup v2 mount point (e.g. /sys/fs/cgroup/unified on
// hybrid hosts, /sys/fs/cgroup on pure v2 ones).
func Root() (string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// Fields: ID parent major:minor root mountpoint options... - fstype source superopts
		f := strings.Fields(sc.Text())
		for i, x := range f {
			if x == "-" && i+1 < len(f) && f[i+1] == "cgroup2" {
				return f[4], nil
			}
		}
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted: shunt needs cgroup v2 " +
		"(mount -t cgroup2 none /sys/fs/cgroup/unified)")
}

// Create makes a cgroup directory and its parents (idempotent).
func Create(path string) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("creating cgroup %s: %w", path, err)
	}
	return nil
}

// Remove kills every process in the cgroup tree at path and removes it,
// deepest directories first. Absent is not an error.
func Remove(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// cgroup.kill (Linux 5.14+) kills the whole subtree atomically, so a
	// process forking at the wrong moment cannot escape.
	if err := os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0o644); err != nil {
		return fmt.Errorf("killing processes of cgroup %s (cgroup.kill needs Linux 5.14+): %w", path, err)
	}
	var dirs []string
	filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	deadline := time.Now().Add(5 * time.Second)
	for i := len(dirs) - 1; i >= 0; i-- {
		for {
			err := os.Remove(dirs[i])
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			// EBUSY until the killed processes are reaped.
			if time.Now().After(deadline) {
				return fmt.Errorf("removing cgroup %s: %w", dirs[i], err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// Populated says whether any process is left in the cgroup tree.
func Populated(path string) bool {
	data, err := os.ReadFile(filepath.Join(path, "cgroup.events"))
	return err == nil && bytes.Contains(data, []byte("populated 1"))
}
