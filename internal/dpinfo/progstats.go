package dpinfo

import "time"

// ProgramStat is what the kernel counted for the programs attached at one
// hook while its run-time statistics were on (BPF_ENABLE_STATS, Linux
// 5.8; `shuntd --bpf-stats` or `sysctl kernel.bpf_stats_enabled=1`): how
// often they ran and for how long, summed over the distinct programs
// there (the pod programs are one program on every pod's interface).
type ProgramStat struct {
	Hook     string        `json:"hook"`
	Programs int           `json:"programs"`
	Runs     uint64        `json:"runs"`
	RunTime  time.Duration `json:"runTimeNs"`
}

// NsPerRun is the mean time of one run, 0 before the first.
func (p ProgramStat) NsPerRun() float64 {
	if p.Runs == 0 {
		return 0
	}
	return float64(p.RunTime.Nanoseconds()) / float64(p.Runs)
}
