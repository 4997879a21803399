package datapath

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/cilium/ebpf/asm"
)

// olderVerifierStack is the stack a program and the functions it calls may
// use together, counted as verifiers before Linux 6.9 count it: each frame
// rounded up to 32 bytes (6.9 rounds a JITed program's frames to 16).
// Linux 6.1, the kernel of Debian 12, rejected shunt_from_pod with
// "combined stack size of 2 calls is 544" (360 rounded to 384, plus
// service_l4_refusal's 144 rounded to 160) while 6.18 took it (368 + 144):
// found by booting 6.1 (scripts/kernel-vm.sh), kept from coming back here.
const olderVerifierStack = 512

// TestStackFitsOlderVerifiers: along every chain of calls of every program
// of the compiled objects, the frames rounded to 32 bytes fit in 512. A
// frame is the deepest stack offset its instructions touch (a load or store
// through r10, or a pointer r10 less a constant), read from the object, so
// it holds whatever configuration leaves alive; the verifier counts only
// what it walks, never more.
func TestStackFitsOlderVerifiers(t *testing.T) {
	specs, err := loadSpecs()
	if err != nil {
		t.Fatal(err)
	}
	destroy, err := loadSockdestroy()
	if err != nil {
		t.Fatal(err)
	}
	var report []string
	for _, o := range append(specs.named(), namedSpec{"sockdestroy", destroy}) {
		for _, name := range sortedKeys(o.spec.Programs) {
			frames, calls := stackFrames(o.spec.Programs[name].Instructions)
			depth, chain := deepestChain(name, frames, calls, 32)
			where := fmt.Sprintf("%s/%s", o.name, name)
			if depth > olderVerifierStack {
				t.Errorf("%s: %d bytes of stack along %s, counted in 32-byte frames as Linux < 6.9 does: over %d, so those kernels refuse the program; take stack off one of these functions",
					where, depth, strings.Join(chain, " → "), olderVerifierStack)
			}
			report = append(report, fmt.Sprintf("%s: %d (%s)", where, depth, strings.Join(chain, " → ")))
		}
	}
	t.Logf("deepest chain of each program, frames rounded to 32 bytes:\n%s", strings.Join(report, "\n"))
}

// A chain over the limit is caught, with the frames rounded as those
// kernels do.
func TestDeepestChain(t *testing.T) {
	frames := map[string]int{"main": 360, "refusal": 144, "track": 80}
	calls := map[string][]string{"main": {"track", "refusal"}}
	depth, chain := deepestChain("main", frames, calls, 32)
	if depth != 544 || strings.Join(chain, ",") != "main(360),refusal(144)" {
		t.Errorf("deepestChain = %d along %v, want 544 along main(360), refusal(144)", depth, chain)
	}
	if depth, _ := deepestChain("main", frames, calls, 16); depth != 512 {
		t.Errorf("with 16-byte frames: %d, want 512 (368 + 144)", depth)
	}
}

// stackFrames reads a program's instructions (its own function, then those
// it calls, each starting at a symbol): each function's frame and the
// functions it calls.
func stackFrames(insns asm.Instructions) (frames map[string]int, calls map[string][]string) {
	frames, calls = map[string]int{}, map[string][]string{}
	fn := ""
	fromFP := map[asm.Register]bool{} // registers holding r10 plus nothing yet
	deepen := func(off int) {
		if off < 0 && -off > frames[fn] {
			frames[fn] = -off
		}
	}
	for _, ins := range insns {
		if sym := ins.Symbol(); sym != "" {
			fn = sym
			frames[fn] = 0
			clear(fromFP)
		}
		op := ins.OpCode
		switch {
		case ins.IsFunctionCall():
			calls[fn] = append(calls[fn], ins.Reference())
		case op.Class().IsLoad() && ins.Src == asm.R10:
			deepen(int(ins.Offset))
		case op.Class().IsStore() && ins.Dst == asm.R10:
			deepen(int(ins.Offset))
		case op.Class().IsALU() && op.ALUOp() == asm.Mov && op.Source() == asm.RegSource && ins.Src == asm.R10:
			fromFP[ins.Dst] = true
			continue
		case op.Class().IsALU() && op.ALUOp() == asm.Add && op.Source() == asm.ImmSource && fromFP[ins.Dst]:
			deepen(int(ins.Constant))
		}
		if op.Class().IsALU() || op.Class().IsLoad() {
			delete(fromFP, ins.Dst)
		}
	}
	return frames, calls
}

// deepestChain is the largest sum of frames, each rounded up to round
// bytes, along a chain of calls from fn, and that chain.
func deepestChain(fn string, frames map[string]int, calls map[string][]string, round int) (int, []string) {
	own := (max(frames[fn], 1) + round - 1) / round * round
	best, bestChain := 0, []string(nil)
	callees := append([]string(nil), calls[fn]...)
	sort.Strings(callees)
	for _, c := range callees {
		if d, chain := deepestChain(c, frames, calls, round); d > best {
			best, bestChain = d, chain
		}
	}
	return own + best, append([]string{fmt.Sprintf("%s(%d)", fn, frames[fn])}, bestChain...)
}
