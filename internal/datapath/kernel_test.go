package datapath

import (
	"errors"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// This machine's kernel (6.18) has every feature of the table: nothing is
// taken unless forced, and what is forced is reported as forced.
func TestProbeKernel(t *testing.T) {
	requireBPF(t)
	for _, f := range dpinfo.KernelFeatures {
		have, err := kernelHas(f.Fallback)
		if err != nil {
			t.Fatalf("probing %s: %v", f.Name, err)
		}
		if !have {
			t.Logf("this kernel (%s) lacks %s (Linux %s)", KernelRelease(), f.What, f.Since)
		}
	}
	taken, rep, err := ProbeKernel(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Forced) != 0 || rep.Release == "" {
		t.Errorf("nothing forced: report %+v", rep)
	}
	all, _ := dpinfo.ParseFallbacks("all")
	taken, rep, err = ProbeKernel(all)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range dpinfo.AllFallbacks {
		if !taken.Has(f) || !slices.Contains(rep.Taken, string(f)) {
			t.Errorf("forced %s not taken: %v, report %+v", f, taken, rep)
		}
	}
	t.Logf("kernel: %s", rep.Line())
}

// TestProbeAdjustRoomShrink: the probe behind the fallback
// dsr-no-gso-decap finds BPF_F_ADJ_ROOM_DECAP_L3_IPV4 on a kernel that has
// it (6.3 and later: 6.18 here) and not on one before (6.1 in
// scripts/kernel-vm.sh), no flag at all on every kernel, and tells a flag
// the kernel refuses (one no kernel has: bit 40) as missing, not as a
// failure of the probe.
func TestProbeAdjustRoomShrink(t *testing.T) {
	requireBPF(t)
	decap := error(nil)
	if !kernelAtLeast(t, 6, 3) {
		decap = ebpf.ErrNotSupported
	}
	for _, c := range []struct {
		name  string
		flags uint64
		want  error
	}{
		{"BPF_F_ADJ_ROOM_DECAP_L3_IPV4", adjRoomDecapL3IPv4, decap},
		{"no flag", 0, nil},
		{"an unknown flag", 1 << 40, ebpf.ErrNotSupported},
	} {
		if err := probeAdjustRoomShrink(c.flags); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}
