package datapath

import (
	"fmt"
	"maps"
	"sync"
	"testing"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// probedFallbacks are the fallbacks this kernel needs, probed once per test
// binary as the agent probes them when it starts (ProbeKernel).
var probedFallbacks = sync.OnceValues(func() (dpinfo.Fallbacks, error) {
	take, _, err := ProbeKernel(nil)
	return take, err
})

// thisKernel is cfg with the fallbacks this kernel needs added, as the
// agent adds them: on a kernel without tcx, sockmap links, bpf_sock_destroy
// or DSR's GSO decapsulation the tests take the older paths the agent would
// take, so the whole package runs on every kernel scripts/kernel-vm.sh
// boots. On a kernel that has every feature (6.18 here) it adds nothing,
// and a test that asks for a fallback still gets it.
func thisKernel(t testing.TB, cfg Config) Config {
	t.Helper()
	take, err := probedFallbacks()
	if err != nil {
		t.Fatal(err)
	}
	if len(take) == 0 {
		return cfg
	}
	merged := maps.Clone(take)
	maps.Copy(merged, cfg.Fallbacks)
	cfg.Fallbacks = merged
	return cfg
}

// requireKernelFeature skips a test of the newer path a fallback replaces
// on a kernel that lacks it: there the agent takes the fallback, which
// tests of their own cover.
func requireKernelFeature(t testing.TB, f dpinfo.Fallback) {
	t.Helper()
	requireBPF(t)
	take, err := probedFallbacks()
	if err != nil {
		t.Fatal(err)
	}
	if take.Has(f) {
		for _, feat := range dpinfo.KernelFeatures {
			if feat.Fallback == f {
				t.Skipf("needs %s (Linux %s+), which this kernel (%s) lacks: the agent takes the %s fallback here", feat.What, feat.Since, KernelRelease(), f)
			}
		}
		t.Skipf("this kernel (%s) takes the %s fallback", KernelRelease(), f)
	}
}

// kernelAtLeast says whether the running kernel's release (uname -r) is
// major.minor or later.
func kernelAtLeast(t testing.TB, major, minor int) bool {
	t.Helper()
	var gotMajor, gotMinor int
	if _, err := fmt.Sscanf(KernelRelease(), "%d.%d", &gotMajor, &gotMinor); err != nil {
		t.Fatalf("reading the kernel's version from %q: %v", KernelRelease(), err)
	}
	return gotMajor > major || gotMajor == major && gotMinor >= minor
}
