// Package maglev computes Maglev lookup tables (Eisenbud et al., "Maglev:
// A Fast and Reliable Software Network Load Balancer", NSDI 2016, §3.4):
// a table of M slots, M prime, each holding one backend, filled so that
// every backend gets M/N slots within one and removing a backend moves
// few of the flows that were on the others. A connection is hashed to a
// slot, so every node that computes the same table sends it to the same
// backend: a flow keeps its backend when the route to a LoadBalancer
// address moves to another node.
//
// Tables are byte-identical on every node: backends are taken in one
// canonical order (sorted by name) and each one's permutation comes from
// SHA-256 over the cluster's seed and its name, never from a per-process
// hash. Cilium does the same with murmur3 and its maglev.hashSeed.
package maglev

import (
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
			"flows spread less evenly and more of them move when a backend changes; use a size of at least %d",
			m, len(names), MinSlotsPerBackend, MinSlotsPerBackend*len(names))
	}
	offset, skip := make([]uint64, len(names)), make([]uint64, len(names))
	for i, n := range names {
		offset[i], skip[i] = permutation(n, uint64(m), seed)
	}
	const empty = ^uint16(0)
	slots := make([]uint16, m)
	for i := range slots {
		slots[i] = empty
	}
	next := make([]uint64, len(names))
	for filled := 0; ; {
		for i := range names {
			// The backend's next preferred slot that is still free.
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for slots[c] != empty {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			slots[c] = uint16(i)
			next[i]++
			if filled++; filled == m {
				t.Slots = slots
				return t, warning, nil
			}
		}
	}
}

// permutation is a backend's offset in [0, m) and skip in [1, m): with m
// prime, offset + j·skip visits every slot once as j goes from 0 to m-1.
func permutation(name string, m uint64, seed []byte) (offset, skip uint64) {
	h := sha256.New()
	h.Write(seed)
	h.Write([]byte{0})
	h.Write([]byte(name))
	sum := h.Sum(nil)
	return binary.BigEndian.Uint64(sum[0:8]) % m, binary.BigEndian.Uint64(sum[8:16])%(m-1) + 1
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
