package datapath

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// TestNoSetRetvalOnKernelsWithoutIt plays a kernel that does not know
// bpf_set_retval (before Linux 5.18): every call of it in the objects is
// made a call of a helper no kernel has. With the no-set-retval fallback the
// objects load (the verifier never walks the branch the load-time constant
// rules out, as an older one would not); without it the verifier refuses
// them, which shows that the calls were there and are what the fallback
// guards.
func TestNoSetRetvalOnKernelsWithoutIt(t *testing.T) {
	requireBPF(t)
	const unknownHelper = 100000
	calls := 0
	unknownSetRetval := func(spec *ebpf.CollectionSpec) {
		for _, p := range spec.Programs {
			for i, ins := range p.Instructions {
				if ins.IsBuiltinCall() && ins.Constant == int64(asm.FnSetRetval) {
					p.Instructions[i].Constant = unknownHelper
					calls++
				}
			}
		}
	}
	cfg := Config{Mode: ModeRedirectPeer, Fallbacks: dpinfo.Fallbacks{dpinfo.FallbackNoSetRetval: true}}
	openConfiguredDatapath(t, cfg, unknownSetRetval)
	if calls == 0 {
		t.Fatal("the objects call bpf_set_retval nowhere: nothing was checked")
	}
	t.Logf("%d calls of bpf_set_retval, none walked by the verifier with the fallback", calls)

	cfg.Fallbacks, cfg.PinDir = nil, testPinDir(t)
	d, err := open(thisKernel(t, cfg), unknownSetRetval)
	if err == nil {
		d.Close()
		t.Fatal("without the fallback, objects calling an unknown helper were loaded: the guard checks nothing")
	}
	if !strings.Contains(err.Error(), "invalid func") {
		t.Errorf("without the fallback: %v, want the verifier's \"invalid func\"", err)
	}
}
