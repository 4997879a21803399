package datapath

import (
	"slices"
	"testing"

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
