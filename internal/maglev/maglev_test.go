package maglev

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func backends(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.%d.%d:8080", i/65536, i/256%256, i%256)
	}
	return out
}

var seed = []byte("cluster-seed-for-tests")

// Every backend gets M/N slots, within one.
func TestEven(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 97, 160} {
		tab, _, err := Compute(backends(n), DefaultSize, seed)
		if err != nil {
			t.Fatal(err)
		}
		count := make([]int, n)
		for _, s := range tab.Slots {
			count[s]++
		}
		lo, hi := DefaultSize/n, (DefaultSize+n-1)/n
		for i, c := range count {
			if c < lo || c > hi {
				t.Errorf("%d backends: %s has %d slots, want %d..%d", n, tab.Backends[i], c, lo, hi)
			}
		}
	}
}

// Removing one of N backends moves few of the flows that were on the
// others (the slots of the removed backend move anyway; only the others'
// count). Measured over every removal (N ≤ 16) or four of them, mean and
// worst: N=10 M=1009 1.96% / 3.08%, N=50 M=5003 1.03% / 1.08%, N=100
// M=10007 0.81% / 1.01%, N=160 M=16381 0.69% / 0.71%, and 0.5-0.7% at
// M ≥ 1000·N. Maglev's own fill (the paper's permutations taken in turn,
// which fill replaced) gave 2.98% / 4.08%, 2.89% / 3.30%, 1.62% / 1.66%,
// 1.67% / 1.68% and the same 0.5-0.96% at M ≥ 1000·N. Issue 27 asked for
// 1% at M ≥ 100·N: met from M ≥ 1000·N (the default size for up to 16
// backends) and about met with N ≥ 100, not with few backends at M ≈ 100·N,
// where keeping every share within one slot moves slots between the
// remaining backends.
func TestRemovingOneBackendMovesFewFlows(t *testing.T) {
	for _, c := range []struct{ n, m int }{{10, 1009}, {10, DefaultSize}, {16, DefaultSize}, {50, 5003}, {100, 10007}, {160, DefaultSize}} {
		all := backends(c.n)
		before, warn, err := Compute(all, c.m, seed)
		if err != nil || warn != "" {
			t.Fatalf("n=%d m=%d: %v %q", c.n, c.m, err, warn)
		}
		removals := []int{0, c.n / 3, c.n / 2, c.n - 1}
		if c.n <= 16 {
			removals = nil
			for i := range c.n {
				removals = append(removals, i)
			}
		}
		worst, sum := 0.0, 0.0
		for _, gone := range removals {
			rest := append(append([]string{}, all[:gone]...), all[gone+1:]...)
			after, _, err := Compute(rest, c.m, seed)
			if err != nil {
				t.Fatal(err)
			}
			f := Disruption(before, after, all[gone])
			worst = max(worst, f)
			sum += f
		}
		t.Logf("n=%d m=%d: %.3f%% of the other backends' slots moved on average over %d removals, at most %.3f%%",
			c.n, c.m, 100*sum/float64(len(removals)), len(removals), 100*worst)
		bound := 0.035
		switch {
		case c.m >= 1000*c.n:
			bound = 0.01
		case c.n >= 50:
			bound = 0.0125
		}
		if worst > bound {
			t.Errorf("n=%d m=%d: %.2f%% of the other backends' slots moved, want ≤ %.1f%%", c.n, c.m, 100*worst, 100*bound)
		}
	}
}

// The table depends on the set of backends and the seed only: any order
// of the same backends gives the same bytes, and this build's table for a
// fixed input is the one recorded here, so nodes running different builds
// of shunt during an upgrade still agree.
func TestIdenticalEverywhere(t *testing.T) {
	b := backends(37)
	first, _, _ := Compute(b, DefaultSize, seed)
	r := rand.New(rand.NewPCG(1, 2))
	for range 5 {
		r.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
		again, _, _ := Compute(b, DefaultSize, seed)
		if fmt.Sprint(again.Slots) != fmt.Sprint(first.Slots) {
			t.Fatal("the same backends in another order gave another table")
		}
	}
	other, _, _ := Compute(b, DefaultSize, []byte("another cluster"))
	if fmt.Sprint(other.Slots) == fmt.Sprint(first.Slots) {
		t.Error("another seed gave the same table")
	}
	sum := sha256.Sum256([]byte(fmt.Sprint(first.Slots)))
	const golden = "ac40e800511777cf"
	if got := fmt.Sprintf("%x", sum[:8]); got != golden {
		t.Errorf("table digest %s, recorded %s: the table computation changed, and nodes of two builds would disagree", got, golden)
	}
}

func TestRefusals(t *testing.T) {
	if _, _, err := Compute(backends(2), 1000, seed); err == nil || !strings.Contains(err.Error(), "not a prime") {
		t.Errorf("size 1000: %v", err)
	}
	if _, _, err := Compute([]string{"a", "b", "a"}, 7, seed); err == nil || !strings.Contains(err.Error(), `"a" given twice`) {
		t.Errorf("duplicate: %v", err)
	}
	if _, _, err := Compute(backends(8), 7, seed); err == nil {
		t.Error("8 backends in 7 slots accepted")
	}
	if _, warn, err := Compute(backends(200), DefaultSize, seed); err != nil || !strings.Contains(warn, "at least 20000") {
		t.Errorf("200 backends in %d slots: warning %q, %v", DefaultSize, warn, err)
	}
	if tab, _, err := Compute(nil, DefaultSize, seed); err != nil || len(tab.Slots) != 0 {
		t.Errorf("no backends: %v %v", tab, err)
	}
}

func BenchmarkCompute(b *testing.B) {
	all := backends(100)
	for b.Loop() {
		Compute(all, DefaultSize, seed)
	}
}
