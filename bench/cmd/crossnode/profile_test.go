package main

import (
	"math"
	"testing"
)

// profileShares sorts perf report's lines by kind of work; headers,
// blank lines and anything not a sample line are skipped.
func TestProfileShares(t *testing.T) {
	report := []byte(`# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 30K of event 'cpu-clock:ppp'
#
# Overhead  Symbol
# ........  ..............................
#
     6.06%  [k] finish_task_switch.isra.0
     4.03%  [k] lookup_nulls_elem_raw
     2.31%  [k] nft_do_chain
     1.87%  [k] __nf_conntrack_find_get
     1.67%  [k] pv_native_safe_halt
     1.49%  [k] bpf_prog_1862b086b9421bd7_shunt_from_uplink
     0.86%  [k] br_nf_pre_routing
     0.78%  [k] trie_lookup_elem
     0.51%  [.] internal/runtime/syscall/linux.Syscall6
     0.50%  [k] vxlan_rcv
     0.44%  [k] __htab_map_lookup_elem
     0.38%  [k] nf_nat_ipv4_out

`)
	got, err := profileShares(report)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"netfilter": 2.31 + 1.87 + 0.38, "bpf": 4.03 + 1.49 + 0.78 + 0.44, "bridge-netfilter": 0.86,
		"vxlan": 0.50, "idle": 1.67, "other": 6.06 + 0.51,
	}
	for k, w := range want {
		if math.Abs(got[k]-w) > 1e-9 {
			t.Errorf("%s: %.2f%%, want %.2f%%", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
	if _, err := profileShares([]byte("# nothing\n")); err == nil {
		t.Error("a report without samples: no error")
	}
}
