// Package ipam hands out pod addresses from the node's pod CIDR. It is pure:
// the caller passes the addresses in use (from its persisted state), so an
// address is never given twice while a pod holds it.
package ipam

import (
	"fmt"
	"net/netip"
)

// Pool is a node's pod CIDR. The network address, the broadcast address and
// the node's own address (the first host address) are never allocated.
type Pool struct {
	CIDR netip.Prefix
}

// NewPool validates an IPv4 CIDR with room for at least one pod.
func NewPool(cidr string) (Pool, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return Pool{}, fmt.Errorf("invalid pod CIDR %q: %w", cidr, err)
	}
	if !p.Addr().Is4() {
		return Pool{}, fmt.Errorf("pod CIDR %s: only IPv4 is supported", cidr)
	}
	if p.Bits() > 29 {
		return Pool{}, fmt.Errorf("pod CIDR %s is too small: use /29 or larger", cidr)
	}
	return Pool{CIDR: p.Masked()}, nil
}

// NodeIP is the node's address in the pool: the pods' gateway.
func (p Pool) NodeIP() netip.Addr { return p.CIDR.Addr().Next() }

func (p Pool) broadcast() netip.Addr {
	a := p.CIDR.Addr().As4()
	hostBits := 32 - p.CIDR.Bits()
	for i := 3; i >= 0 && hostBits > 0; i-- {
		n := min(hostBits, 8)
		a[i] |= byte(1<<n - 1)
		hostBits -= n
	}
	return netip.AddrFrom4(a)
}

// Contains says whether ip may be given to a pod.
func (p Pool) Contains(ip netip.Addr) bool {
	return p.CIDR.Contains(ip) && ip != p.CIDR.Addr() && ip != p.NodeIP() && ip != p.broadcast()
}

// Size is how many pods the pool holds.
func (p Pool) Size() int { return 1<<(32-p.CIDR.Bits()) - 3 }

// Allocate returns the lowest free address.
func (p Pool) Allocate(inUse map[netip.Addr]bool) (netip.Addr, error) {
	for ip := p.NodeIP().Next(); p.Contains(ip); ip = ip.Next() {
		if !inUse[ip] {
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("pod CIDR %s is full (%d addresses in use): delete pods or use a larger --pod-cidr", p.CIDR, len(inUse))
}

// Allocator hands out the lowest free addresses of a pool, one after the
// other, scanning the pool once for a whole batch instead of once per
// address.
type Allocator struct {
	pool  Pool
	next  netip.Addr
	taken func(netip.Addr) bool
}

// NewAllocator starts a batch; taken says which addresses are in use (it
// must also report the ones this allocator handed out, if they are to stay
// unique).
func (p Pool) NewAllocator(taken func(netip.Addr) bool) *Allocator {
	return &Allocator{pool: p, next: p.NodeIP().Next(), taken: taken}
}

// Next returns the lowest free address above the previous one.
func (a *Allocator) Next() (netip.Addr, error) {
	for ip := a.next; a.pool.Contains(ip); ip = ip.Next() {
		if !a.taken(ip) {
			a.next = ip.Next()
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%s is full: remove some or use a larger CIDR", a.pool.CIDR)
}
