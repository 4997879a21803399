package main

// -bpf-stats: shunt's agents run with --bpf-stats (the kernel counts each
// program's runs and run time), and every measured new-connections run of
// a shunt case logs, per node and hook, the runs per connection and the
// time per run over the run: which program a connection's BPF time goes
// to, which the machine-wide profile (-profile) shows only as helpers'
// and the kernel's symbols. Statistics cost two clock reads per program
// run, so the rates of such a run are not the benchmark's.

import (
	"encoding/json"
	"fmt"
	"log"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// programStats reads each of cn's agents' statistics, by node (1, 2) and
// hook; nil without -bpf-stats or for a case without shunt's agents.
func (b *bench) programStats(cn *caseNet) map[string]dpinfo.ProgramStat {
	if !b.bpfStats || cn.agents[0] == "" {
		return nil
	}
	out := map[string]dpinfo.ProgramStat{}
	for i, inst := range cn.agents {
		var st struct {
			ProgramStats []dpinfo.ProgramStat `json:"programStats"`
		}
		if err := b.agentStatus(inst, &st); err != nil {
			log.Printf("  %s: %v", cn.name, err)
			return nil
		}
		for _, p := range st.ProgramStats {
			out[fmt.Sprintf("node-%d %s", i+1, p.Hook)] = p
		}
	}
	return out
}

// agentStatus decodes agent inst's `shunt status -o json` into st.
func (b *bench) agentStatus(inst string, st any) error {
	raw, err := exec.Command(filepath.Join(b.bin, "shunt"), "--instance", inst, "status", "-o", "json").Output()
	if err != nil {
		return fmt.Errorf("status of %s: %w", inst, err)
	}
	if err := json.Unmarshal(raw, st); err != nil {
		return fmt.Errorf("status of %s: %w", inst, err)
	}
	return nil
}

// logProgramStats logs what the programs did between before and after, a
// run of conns connections, and appends it to bpf-stats.tsv: per node and
// hook the runs per connection, the time per run, and the time per
// connection, then the total per connection.
func (b *bench) logProgramStats(caseName, metric string, n, rep int, conns float64, before, after map[string]dpinfo.ProgramStat) {
	if before == nil || after == nil || conns <= 0 {
		return
	}
	var keys []string
	for k := range after {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	var tsv strings.Builder
	var total time.Duration
	for _, k := range keys {
		runs := after[k].Runs - before[k].Runs
		took := after[k].RunTime - before[k].RunTime
		if runs == 0 {
			continue
		}
		total += took
		perConn := float64(took.Nanoseconds()) / conns
		parts = append(parts, fmt.Sprintf("%s %.1f runs × %.0f ns = %.0f ns", k, float64(runs)/conns, float64(took.Nanoseconds())/float64(runs), perConn))
		node, hook, _ := strings.Cut(k, " ")
		fmt.Fprintf(&tsv, "%s\t%s\t%d\t%d\t%s\t%s\t%.2f\t%.1f\t%.1f\n", caseName, metric, n, rep, node, hook,
			float64(runs)/conns, float64(took.Nanoseconds())/float64(runs), perConn)
	}
	log.Printf("  %-16s %s: BPF per connection (kernel statistics, both nodes): %.0f ns in all: %s", caseName, metric,
		float64(total.Nanoseconds())/conns, strings.Join(parts, "; "))
	b.appendOut("bpf-stats.tsv", tsv.String())
}
