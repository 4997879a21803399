package proxy

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
)

// SetProcs applies SHUNT_PROXY_GOMAXPROCS, the proxy's own GOMAXPROCS
// (GOMAXPROCS would set every Go process the agent starts); without it the
// proxy runs on Go's default (the CPUs, or the cgroup's limit). A governor
// that ran the proxy on one P while quiet was measured and dropped: with
// the fast path's raw socket calls it saved nothing (bench/RESULTS.md,
// "Request fast path", 2026-11-27).
func SetProcs() error {
	v := os.Getenv("SHUNT_PROXY_GOMAXPROCS")
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return fmt.Errorf("SHUNT_PROXY_GOMAXPROCS=%q: want a number of threads, 1 or more", v)
	}
	runtime.GOMAXPROCS(n)
	return nil
}
