package datapath

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// Every helper, kfunc, program, attach and map type of the compiled
// objects is in the feature table with its first kernel, and whatever is
// newer than the floor (Linux 5.15) is guarded by a fallback: a new helper
// without one fails here, before it fails a user's node.
func TestObjectsUseOnlyTabledFeatures(t *testing.T) {
	uses, err := objectUses()
	if err != nil {
		t.Fatal(err)
	}
	var report []string
	for _, o := range uses {
		guard, guarded := objectGuard[o.object]
		for _, name := range sortedKeys(o.programs) {
			p := o.programs[name]
			where := fmt.Sprintf("%s/%s (%s, %s)", o.object, name, p.typ, p.attach)
			since, ok := programSince[p.typ][p.attach]
			if !ok {
				t.Errorf("%s: program and attach type not in programSince: add them with their first kernel", where)
			} else if newerThanFloor(since) && !guarded {
				t.Errorf("%s: needs Linux %s, newer than the floor %s, and no fallback guards it", where, since, dpinfo.KernelFloor)
			}
			var hs []string
			for _, h := range p.helpers {
				since, ok := helperSince[h]
				switch {
				case !ok:
					t.Errorf("%s calls %s, which is not in helperSince: add it with its first kernel from bcc's docs/kernel-versions.md", where, helperName(h))
				case newerThanFloor(since) && !guarded && helperGuard[h] == "":
					t.Errorf("%s calls %s (Linux %s), newer than the floor %s, and no fallback guards it: branch around it on a load-time constant and add it to helperGuard",
						where, helperName(h), since, dpinfo.KernelFloor)
				}
				hs = append(hs, fmt.Sprintf("%s %s", helperName(h), since))
			}
			for _, k := range p.kfuncs {
				since, ok := kfuncSince[k]
				switch {
				case !ok:
					t.Errorf("%s calls kfunc %s, which is not in kfuncSince", where, k)
				case newerThanFloor(since) && !guarded && kfuncWeak[k] == "":
					t.Errorf("%s calls kfunc %s (Linux %s) and no fallback keeps its object unloaded, nor is it weak (kfuncWeak)", where, k, since)
				}
				hs = append(hs, fmt.Sprintf("kfunc %s %s", k, since))
			}
			g := ""
			if guarded {
				g = " [object loaded only without fallback " + string(guard) + "]"
			}
			report = append(report, fmt.Sprintf("%s%s: %s", where, g, strings.Join(hs, ", ")))
		}
		for _, name := range sortedKeys(o.maps) {
			typ := o.maps[name]
			since, ok := mapSince[typ]
			switch {
			case !ok:
				t.Errorf("%s: map %s of type %s is not in mapSince", o.object, name, typ)
			case newerThanFloor(since):
				t.Errorf("%s: map %s of type %s needs Linux %s, newer than the floor", o.object, name, typ, since)
			}
		}
	}
	t.Logf("what the objects use, with the first kernel of each:\n%s", strings.Join(report, "\n"))
}

// Every guard names a fallback of the table, and the helpers guarded are
// the ones the table says.
func TestGuardsAreFallbacks(t *testing.T) {
	for h, g := range helperGuard {
		if !slices.Contains(dpinfo.AllFallbacks, g) {
			t.Errorf("%s is guarded by %q, not a fallback of dpinfo", helperName(h), g)
		}
	}
	for o, g := range objectGuard {
		if !slices.Contains(dpinfo.AllFallbacks, g) {
			t.Errorf("object %s is guarded by %q, not a fallback of dpinfo", o, g)
		}
	}
	if got := helperName(asm.FnGetPrandomU32); got != "bpf_get_prandom_u32" {
		t.Errorf("helperName: %s", got)
	}
	for _, c := range []struct {
		a, b string
		want int
	}{{"5.15", "5.15", 0}, {"5.18", "5.15", 1}, {"6.1", "5.15", 1}, {"4.18", "5.15", -1}, {"5.2", "5.15", -1}} {
		if got := compareRelease(c.a, c.b); (got > 0) != (c.want > 0) || (got < 0) != (c.want < 0) {
			t.Errorf("compareRelease(%s, %s) = %d", c.a, c.b, got)
		}
	}
}

// This kernel has everything: the check passes, with and without every
// fallback.
func TestCheckKernel(t *testing.T) {
	requireBPF(t)
	if err := CheckKernel(nil); err != nil {
		t.Fatal(err)
	}
	all, _ := dpinfo.ParseFallbacks("all")
	if err := CheckKernel(all); err != nil {
		t.Fatal(err)
	}
}

// A kernel without a helper the objects need and no fallback for it is
// refused, naming the helper, the program type and the kernel that has it;
// one lacking only a guarded helper passes once its fallback is taken.
func TestCheckKernelRefusesWhatIsMissing(t *testing.T) {
	lacking := func(missing asm.BuiltinFunc) {
		haveProgramHelper = func(pt ebpf.ProgramType, h asm.BuiltinFunc) error {
			if h == missing {
				return fmt.Errorf("%w: helper %s", ebpf.ErrNotSupported, h)
			}
			return nil
		}
	}
	haveProgramType = func(ebpf.ProgramType) error { return nil }
	haveMapType = func(ebpf.MapType) error { return nil }
	t.Cleanup(func() {
		haveProgramType, haveProgramHelper, haveMapType = features.HaveProgramType, features.HaveProgramHelper, features.HaveMapType
	})
	lacking(asm.FnRedirectPeer)
	err := CheckKernel(nil)
	if err == nil || !strings.Contains(err.Error(), "the bpf_redirect_peer helper in SchedCLS programs (Linux 5.10)") ||
		!strings.Contains(err.Error(), "Linux 5.15 and later") {
		t.Errorf("a kernel without bpf_redirect_peer: %v", err)
	}
	lacking(asm.FnSetRetval)
	if err := CheckKernel(nil); err == nil || !strings.Contains(err.Error(), "bpf_set_retval") {
		t.Errorf("a kernel without bpf_set_retval, fallback not taken: %v", err)
	}
	if err := CheckKernel(dpinfo.Fallbacks{dpinfo.FallbackNoSetRetval: true}); err != nil {
		t.Errorf("a kernel without bpf_set_retval, fallback taken: %v", err)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
