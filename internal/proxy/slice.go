package proxy

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSlice is the scheduling slice the proxy asks for (SetSlice).
const DefaultSlice = 100 * time.Microsecond

// SetSlice asks the kernel to give every thread of the proxy a short
// scheduling slice: sched_attr.sched_runtime of a SCHED_OTHER thread,
// which EEVDF (Linux 6.12+) reads as the thread's request. A shorter
// request gets an earlier virtual deadline, so a proxy thread woken by a
// request runs before a longer-sliced thread that holds the CPU finishes
// its slice, instead of queueing behind it: on a node whose CPUs the pods
// keep busy, that wait is most of what the proxy adds to a request's tail
// (proxy_wait in bench/RESULTS.md, "Mesh"). Its share of the CPU does not
// change: the slice moves when the thread runs, not how much (its weight,
// the nice value, stays).
//
// The kernel clamps the slice to 100 µs-100 ms. Threads made later
// inherit it (clone copies the slice); the threads that exist are set one
// by one, twice, so that one cloned during the first pass from a thread not
// yet set is caught by the second. It returns the slice in force (0: none,
// d being 0), and an error when the kernel refused or ignored it: older
// kernels accept the call and keep their default, which sched_getattr
// then shows.
func SetSlice(d time.Duration) (time.Duration, error) {
	if d == 0 {
		return 0, nil
	}
	for range 2 {
		tids, err := threads()
		if err != nil {
			return 0, err
		}
		for _, tid := range tids {
			if err := setThreadSlice(tid, d); err != nil && !errors.Is(err, unix.ESRCH) {
				return 0, fmt.Errorf("asking for a %s scheduling slice for thread %d (sched_setattr): %w", d, tid, err)
			}
		}
	}
	attr, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return 0, fmt.Errorf("reading the scheduling slice back (sched_getattr): %w", err)
	}
	if got := time.Duration(attr.Runtime); got != clampSlice(d) {
		return 0, fmt.Errorf("the kernel kept its own scheduling slice (%s, asked for %s): a slice per thread needs Linux 6.12 or later (EEVDF's sched_attr.sched_runtime)", got, d)
	}
	return clampSlice(d), nil
}

// SliceSetting is the slice the proxy asks for: SHUNT_PROXY_SLICE when set
// (a Go duration; 0 leaves the kernel's default), else d. A malformed value
// is an error, as a malformed SHUNT_PROXY_GOMAXPROCS is: a setting someone
// typed must not be dropped with a warning few read.
func SliceSetting(d time.Duration) (time.Duration, error) {
	v, ok := os.LookupEnv("SHUNT_PROXY_SLICE")
	if !ok {
		return d, nil
	}
	parsed, err := time.ParseDuration(v)
	if err != nil || parsed < 0 {
		return 0, fmt.Errorf("SHUNT_PROXY_SLICE=%q: want a duration such as 100us, or 0 for the kernel's default", v)
	}
	return parsed, nil
}

// clampSlice is d as the kernel takes it (100 µs to 100 ms).
func clampSlice(d time.Duration) time.Duration {
	return min(max(d, 100*time.Microsecond), 100*time.Millisecond)
}

// setThreadSlice sets thread tid's slice, keeping its policy and nice
// value (sched_setattr sets both).
func setThreadSlice(tid int, d time.Duration) error {
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return err
	}
	if attr.Policy != unix.SCHED_NORMAL && attr.Policy != unix.SCHED_BATCH {
		return nil // a real-time thread has no fair slice
	}
	attr.Size = unix.SizeofSchedAttr
	attr.Runtime = uint64(d)
	attr.Flags = 0
	return unix.SchedSetAttr(tid, attr, 0)
}

// threads are the proxy's thread ids.
func threads() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("listing the proxy's threads: %w", err)
	}
	var tids []int
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
