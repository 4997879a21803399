// Package maglev computes Maglev lookup tables (Eisenbud et al., "Maglev:
// A Fast and Reliable Software Network Load Balancer", NSDI 2016, §3.4):
// a table of M slots, M prime, each holding one backend, filled so that
// every backend gets M/N slots within one and removing a backend moves
// few of the flows that were on the others. A connection is hashed to a
// slot, so every node that computes the same table sends it to the same
// backend: a flow keeps its backend when the route to a LoadBalancer
// address moves to another node.
//
// The table is Maglev's; its fill is not the paper's (each backend's
// permutation taken in turn) but balanced rendezvous hashing (fill), which
// moves fewer of the other backends' flows when one goes.
//
// Tables are byte-identical on every node: backends are taken in one
// canonical order (sorted by name) and each one's scores come from
// SHA-256 over the seed (cluster-wide data: shunt gives the service
// port's name) and its name, never from a per-process hash. Cilium does
// the same with murmur3 and its maglev.hashSeed.
package maglev

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
)

// DefaultSize is the table size Cilium uses by default (a prime).
const DefaultSize = 16381

// MinSlotsPerBackend is the slots per backend below which a table is
// uneven enough to warn about: the paper's M ≥ 100·N.
const MinSlotsPerBackend = 100

// Table is a computed lookup table.
type Table struct {
	// Backends are the names given, in canonical (sorted) order.
	Backends []string
	// Slots hold indices into Backends; len(Slots) is the table size.
	Slots []uint16
}

// Lookup returns the backend of a flow's hash.
func (t *Table) Lookup(hash uint64) string {
	return t.Backends[t.Slots[hash%uint64(len(t.Slots))]]
}

// Compute fills a table of size m (a prime) for the backends (unique
// names, e.g. "10.0.1.5:8080") with the cluster's seed. No backends: an
// empty table. The warning is non-empty when m < MinSlotsPerBackend × the
// number of backends: the table is still correct, but less even and less
// stable when backends change.
func Compute(backends []string, m int, seed []byte) (t *Table, warning string, err error) {
	if !isPrime(m) {
		return nil, "", fmt.Errorf("maglev table size %d is not a prime: use one such as %d, 32749 or 65521", m, DefaultSize)
	}
	names := slices.Clone(backends)
	slices.Sort(names)
	if i := duplicate(names); i >= 0 {
		return nil, "", fmt.Errorf("maglev: backend %q given twice", names[i])
	}
	if len(names) > m {
		return nil, "", fmt.Errorf("maglev: %d backends do not fit a table of %d slots", len(names), m)
	}
	if len(names) > 1<<16 {
		return nil, "", errors.New("maglev: more than 65536 backends")
	}
	t = &Table{Backends: names}
	if len(names) == 0 {
		return t, "", nil
	}
	if m < MinSlotsPerBackend*len(names) {
		warning = fmt.Sprintf("maglev table of %d slots for %d backends: below %d slots per backend, "+
			"more of the flows move when a backend changes; use a size of at least %d",
			m, len(names), MinSlotsPerBackend, MinSlotsPerBackend*len(names))
	}
	t.Slots = fill(names, m, seed)
	return t, warning, nil
}

// fill assigns the m slots to the backends (sorted names): balanced
// rendezvous hashing. Every (backend, slot) pair has a score; a slot
// goes to the backend of its highest score, then backends above their
// share (m/n, the m mod n backends with the most slots one more) give up
// their lowest-scoring slots, which go, highest score first, to the
// backends still below theirs.
//
// Removing a backend then moves its own slots and only the few others
// the new shares call for: measured (TestRemovingOneBackendMovesFewFlows)
// 0.7-2.0% of the other backends' slots on average at m ≈ 100·n and
// 0.5-0.6% at m ≥ 1000·n, where Maglev's own fill (the paper's
// permutations taken in turn, which this replaced) moved 1.6-3.0% and
// 0.5-0.7%. The price is n·m scores instead of about m·ln m steps.
func fill(names []string, m int, seed []byte) []uint16 {
	n := len(names)
	keys := make([]uint64, n)
	for i, name := range names {
		keys[i] = backendKey(name, seed)
	}
	slotKeys := make([]uint64, m)
	for s := range slotKeys {
		slotKeys[s] = mix64(uint64(s) + 0x9e3779b97f4a7c15)
	}
	score := func(b, s int) uint64 { return mix64(keys[b] ^ slotKeys[s]) }

	slots := make([]uint16, m)
	count := make([]int, n)
	for s, sk := range slotKeys {
		best, bestScore := 0, uint64(0)
		for b, k := range keys {
			if sc := mix64(k ^ sk); sc > bestScore || b == 0 {
				best, bestScore = b, sc
			}
		}
		slots[s] = uint16(best)
		count[best]++
	}

	// Shares: m/n each, one more for the m mod n backends the scores
	// favoured most (ties by key), so that the fewest slots must move.
	share := make([]int, n)
	byDemand := make([]int, n)
	for b := range byDemand {
		byDemand[b] = b
	}
	slices.SortFunc(byDemand, func(a, b int) int {
		if count[a] != count[b] {
			return count[b] - count[a]
		}
		return cmp.Compare(keys[a], keys[b])
	})
	for rank, b := range byDemand {
		share[b] = m / n
		if rank < m%n {
			share[b]++
		}
	}

	// Backends above their share give up their lowest-scoring slots.
	held := make([][]int, n)
	for s, b := range slots {
		held[b] = append(held[b], s)
	}
	var free []int
	for b, ss := range held {
		if len(ss) <= share[b] {
			continue
		}
		slices.SortFunc(ss, func(x, y int) int { return cmp.Compare(score(b, y), score(b, x)) })
		free = append(free, ss[share[b]:]...)
		count[b] = share[b]
	}

	// The freed slots go to the backends below their share, the pairs of
	// highest score first.
	type pair struct {
		slot, backend int
		score         uint64
	}
	var pairs []pair
	for _, s := range free {
		for b := range n {
			if count[b] < share[b] {
				pairs = append(pairs, pair{s, b, score(b, s)})
			}
		}
	}
	slices.SortFunc(pairs, func(x, y pair) int {
		if c := cmp.Compare(y.score, x.score); c != 0 {
			return c
		}
		if c := cmp.Compare(x.slot, y.slot); c != 0 {
			return c
		}
		return cmp.Compare(x.backend, y.backend)
	})
	placed := make([]bool, m)
	for _, p := range pairs {
		if placed[p.slot] || count[p.backend] >= share[p.backend] {
			continue
		}
		slots[p.slot] = uint16(p.backend)
		count[p.backend]++
		placed[p.slot] = true
	}
	return slots
}

// backendKey is a backend's 64-bit key: SHA-256 over the cluster's seed
// and its name, never a per-process hash.
func backendKey(name string, seed []byte) uint64 {
	h := sha256.New()
	h.Write(seed)
	h.Write([]byte{0})
	h.Write([]byte(name))
	return binary.BigEndian.Uint64(h.Sum(nil)[:8])
}

// mix64 is SplitMix64's finalizer: every input bit reaches every output
// bit, so scores of one slot across backends are independent.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func duplicate(sorted []string) int {
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return i
		}
	}
	return -1
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// FlowHash is the hash the datapath takes a new flow's slot from
// (bpf/lib/maglev.h, maglev_hash): the kernel's jhash_3words over the
// client's address, the client's and the frontend's ports and the
// protocol, in host byte order. The frontend's address is left out: it is
// the same for every flow of one table and differs between the nodes of a
// NodePort, which share a table. Its slot is FlowHash % M.
func FlowHash(client [4]byte, clientPort, frontendPort uint16, proto uint8) uint32 {
	a := binary.BigEndian.Uint32(client[:])
	b := uint32(clientPort)<<16 | uint32(frontendPort)
	c := uint32(proto)
	const init = 0xdeadbeef + 3<<2
	a, b, c = a+init, b+init, c+init
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

// Slot is the slot of a flow's hash in the table.
func (t *Table) Slot(hash uint32) int { return int(hash % uint32(len(t.Slots))) }

// Disruption is the share of the slots that were not on the removed
// backend in before and name another backend in after: the flows a
// removal moves beyond the removed backend's own.
func Disruption(before, after *Table, removed string) float64 {
	moved, kept := 0, 0
	for i, b := range before.Slots {
		was := before.Backends[b]
		if was == removed {
			continue
		}
		kept++
		if after.Backends[after.Slots[i]] != was {
			moved++
		}
	}
	if kept == 0 {
		return 0
	}
	return float64(moved) / float64(kept)
}
