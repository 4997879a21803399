// Package mountpoint creates the mount points lab containers that see the
// node's file system need (a volume at /etc/coredns, a program at
// /agnhost: paths the node does not have) and removes them when no
// container of any lab node on the machine holds them any more, so a lab
// leaves nothing on the machine. Only what it created is ever removed,
// and only when empty.
//
// The machine's lab nodes share one file system, so the record is the
// machine's: a directory per created path below Dir, holding a file per
// holder (a node instance's pod); a lock file serializes changes.
package mountpoint

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is where the machine's record is kept (cleared by a reboot, which
// the holders' containers do not survive either).
var Dir = "/run/shunt-lab/mountpoints"

// Target is a mount point a container needs: a directory, or a file for
// a bind-mounted file.
type Target struct {
	Path string
	File bool
}

// Holder names a holder of mount points: a pod of a node instance.
func Holder(instance, podFile string) string { return instance + "@" + podFile }

// Acquire creates each target the node lacks (and the directories above
// it it lacks) and records holder as holding each created path; targets
// that exist and were not created here are left alone.
func Acquire(holder string, targets []Target) error {
	return locked(func() error {
		var errs []error
		for _, t := range targets {
			errs = append(errs, acquire(holder, t))
		}
		return errors.Join(errs...)
	})
}

func acquire(holder string, t Target) error {
	p := filepath.Clean(t.Path)
	if !filepath.IsAbs(p) {
		return fmt.Errorf("mount point %q is not an absolute path", t.Path)
	}
	// Every missing path from the first missing ancestor down.
	var missing []string
	for q := p; q != "/"; q = filepath.Dir(q) {
		if _, err := os.Lstat(q); err == nil {
			break
		}
		missing = append(missing, q)
	}
	// Created here before (another holder's), or to be created now: hold
	// each, parents first, so a crash leaves a record of what exists.
	var chain []string
	for q := p; q != "/"; q = filepath.Dir(q) {
		if recorded(q) || slices.Contains(missing, q) {
			chain = append(chain, q)
		}
	}
	slices.Reverse(chain)
	for _, q := range chain {
		if err := hold(holder, q); err != nil {
			return err
		}
		if !slices.Contains(missing, q) {
			continue
		}
		var err error
		if q == p && t.File {
			err = os.WriteFile(q, nil, 0o644)
		} else {
			err = os.Mkdir(q, 0o755)
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating the mount point %s: %w", q, err)
		}
	}
	return nil
}

// Release drops holder's hold on every path and removes each path no one
// holds any more, if it is empty (deepest first).
func Release(holder string) error {
	return locked(func() error { return release(func(h string) bool { return h == holder }) })
}

// ReleaseInstance drops the holds of every pod of a node instance (the
// instance is torn down).
func ReleaseInstance(instance string) error {
	return locked(func() error { return release(func(h string) bool { return strings.HasPrefix(h, instance+"@") }) })
}

func release(match func(holder string) bool) error {
	entries, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var paths []string
	for _, e := range entries {
		if p, err := url.PathUnescape(e.Name()); err == nil && e.IsDir() {
			paths = append(paths, p)
		}
	}
	// Deepest first: a directory goes after what was created in it.
	slices.SortFunc(paths, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range paths {
		rec := recordDir(p)
		holders, _ := os.ReadDir(rec)
		left := 0
		for _, h := range holders {
			if name, err := url.PathUnescape(h.Name()); err == nil && match(name) {
				errs = append(errs, os.Remove(filepath.Join(rec, h.Name())))
			} else {
				left++
			}
		}
		if left > 0 {
			continue
		}
		errs = append(errs, removeIfEmpty(p), os.Remove(rec))
	}
	return errors.Join(errs...)
}

// removeIfEmpty removes an empty directory or empty file; anything else
// (someone put something there) stays.
func removeIfEmpty(p string) error {
	st, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if st.Mode().IsRegular() && st.Size() > 0 {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("removing the mount point %s: %w", p, err)
	}
	return nil
}

func recordDir(p string) string { return filepath.Join(Dir, url.PathEscape(p)) }

func recorded(p string) bool {
	_, err := os.Stat(recordDir(p))
	return err == nil
}

func hold(holder, p string) error {
	rec := recordDir(p)
	if err := os.MkdirAll(rec, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(rec, url.PathEscape(holder)), nil, 0o644)
}

// locked runs f holding the machine's lock.
func locked(f func() error) error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(Dir), "mountpoints.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	return f()
}
