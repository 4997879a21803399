package benchrun

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPUTimes are the machine's CPU times so far (all CPUs) from /proc/stat's
// "cpu" line, the columns the benchmarks read.
type CPUTimes struct {
	// Softirq: time in softirq handlers, where most packet work is done.
	Softirq time.Duration
	// Steal: time the hypervisor took from this virtual machine for other
	// guests. A benchmark cannot see it any other way: a task whose
	// virtual CPU the host stops counts that time as its own run time,
	// and its requests wait. Its growth over a run says how much of the
	// run's tail (and rate) is the host's, not the code's.
	Steal time.Duration
}

// userHZ: /proc/stat counts in USER_HZ, 100 on every Linux architecture
// shunt supports.
const userHZ = 100

// ReadCPUTimes reads /proc/stat.
func ReadCPUTimes() (CPUTimes, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUTimes{}, err
	}
	return parseCPUTimes(strings.SplitN(string(raw), "\n", 2)[0])
}

// parseCPUTimes reads /proc/stat's first line: "cpu user nice system idle
// iowait irq softirq steal ...", in USER_HZ ticks.
func parseCPUTimes(line string) (CPUTimes, error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return CPUTimes{}, fmt.Errorf("/proc/stat: unexpected first line %q (want cpu user nice system idle iowait irq softirq steal ...)", line)
	}
	var ticks [2]uint64
	for i, col := range []int{7, 8} {
		v, err := strconv.ParseUint(f[col], 10, 64)
		if err != nil {
			return CPUTimes{}, fmt.Errorf("/proc/stat: column %d of %q: %w", col, line, err)
		}
		ticks[i] = v
	}
	tick := time.Second / userHZ
	return CPUTimes{Softirq: time.Duration(ticks[0]) * tick, Steal: time.Duration(ticks[1]) * tick}, nil
}

// Sub is the CPU time spent between earlier and t.
func (t CPUTimes) Sub(earlier CPUTimes) CPUTimes {
	return CPUTimes{Softirq: t.Softirq - earlier.Softirq, Steal: t.Steal - earlier.Steal}
}
