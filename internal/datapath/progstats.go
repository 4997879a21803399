package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// Run-time statistics of the programs: the kernel counts each program's
// runs and their time only while statistics are on, which costs two clock
// reads per run (tens of nanoseconds), so they are off unless asked for.
// They tell which hook a packet's or a connection's CPU goes to, which a
// profile of the whole machine (perf) shows only as the helpers' and the
// kernel's symbols.

// ProgramStat is one hook's statistics (dpinfo, which the CLI reads
// without linking the kernel code).
type ProgramStat = dpinfo.ProgramStat

// EnableProgramStats turns the kernel's run-time statistics on for as long
// as this datapath is open (BPF_ENABLE_STATS: released with the file
// descriptor, so a crashed agent leaves them off).
func (d *Datapath) EnableProgramStats() error {
	if d.stats != nil {
		return nil
	}
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return fmt.Errorf("turning on the run-time statistics of BPF programs (--bpf-stats): %w (BPF_ENABLE_STATS needs Linux 5.8)", err)
	}
	d.stats = c
	return nil
}

// ProgramStatsOn says whether the kernel counts run time now: turned on by
// this datapath, or by someone through kernel.bpf_stats_enabled.
func (d *Datapath) ProgramStatsOn() bool {
	if d.stats != nil {
		return true
	}
	b, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// ProgramStats reads, for every hook with a pinned link (tcx, cgroup,
// sockops, sk_msg), the statistics of the programs attached there, sorted
// by hook. The tc fallback's cls_bpf filters are not links and are left
// out.
func (d *Datapath) ProgramStats() ([]ProgramStat, error) {
	pins, err := filepath.Glob(filepath.Join(d.cfg.PinDir, "links", "*"))
	if err != nil {
		return nil, err
	}
	byHook := map[string]*ProgramStat{}
	seen := map[ebpf.ProgramID]bool{}
	var errs []error
	for _, pin := range pins {
		id, err := linkProgram(pin)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) { // a pod gone meanwhile
				errs = append(errs, err)
			}
			continue
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			errs = append(errs, fmt.Errorf("program %d of %s: %w", id, pin, err))
			continue
		}
		ps, err := prog.Stats()
		prog.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("program %d of %s: %w", id, pin, err))
			continue
		}
		hook := d.hookOf(filepath.Base(pin))
		st := byHook[hook]
		if st == nil {
			st = &ProgramStat{Hook: hook}
			byHook[hook] = st
		}
		st.Programs++
		st.Runs += ps.RunCount
		st.RunTime += ps.Runtime
	}
	out := make([]ProgramStat, 0, len(byHook))
	for _, st := range byHook {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b ProgramStat) int { return strings.Compare(a.Hook, b.Hook) })
	return out, errors.Join(errs...)
}

// linkProgram is the program a pinned link runs.
func linkProgram(pin string) (ebpf.ProgramID, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return 0, fmt.Errorf("link %s: %w", pin, err)
	}
	return info.Program, nil
}
