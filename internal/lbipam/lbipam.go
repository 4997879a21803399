// Package lbipam gives LoadBalancer Services their address from a pool
// and writes it into status.loadBalancer.ingress, as Cilium's LB-IPAM and
// MetalLB do: the load balancer controller of `shunt dev cluster up
// --lb-pool` (a cluster has none of its own; shunt's agents serve whatever
// address a controller wrote). The lab's API server assigns the same way
// in its own store (internal/lab/external.go).
//
// Plan is the pure part: from every Service, what each one gets. Run
// watches the API server's Services and applies it.
package lbipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Decision is what Plan decides for one Service.
type Decision struct {
	Namespace, Name string
	// Assign, when valid: the Service's status.loadBalancer.ingress
	// becomes this one address.
	Assign netip.Addr
	// Release: the Service holds addresses of the pool it no longer
	// should (no longer a LoadBalancer, or another controller's class):
	// its status.loadBalancer is emptied.
	Release bool
	// Problem, when set: why the Service gets no address (a Warning
	// Event on it), with the field.
	Problem string
}

// Plan decides, over every Service of the cluster, which pending
// LoadBalancer Services get which address of pool, and which Services
// give theirs back. Only Services of no loadBalancerClass are this
// controller's (a class names another controller). An address is taken
// when a Service's status holds it or a Service lists it in externalIPs.
// spec.loadBalancerIP, when set, is the address asked for: given if in the
// pool and free, else a Problem. Older Services are served first, so a
// full pool refuses the newest. Addresses are the pool's all but its
// network and broadcast addresses (all of a /31 or /32).
func Plan(services []*corev1.Service, pool netip.Prefix) []Decision {
	taken := map[netip.Addr]string{}
	for _, s := range services {
		for _, a := range addressesOf(s) {
			if _, ok := taken[a]; !ok {
				taken[a] = key(s)
			}
		}
	}
	ordered := slices.Clone(services)
	slices.SortFunc(ordered, func(a, b *corev1.Service) int {
		if c := a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(key(a), key(b))
	})
	first, last := HostRange(pool)
	next := first // every address before it is taken
	free := func() (netip.Addr, bool) {
		for ; pool.Contains(next) && next.Compare(last) <= 0; next = next.Next() {
			if taken[next] == "" {
				return next, true
			}
		}
		return netip.Addr{}, false
	}
	var out []Decision
	for _, s := range ordered {
		d := Decision{Namespace: s.Namespace, Name: s.Name}
		if !ours(s) {
			if holdsFrom(s, pool) {
				d.Release = true
				out = append(out, d)
			}
			continue
		}
		if len(s.Status.LoadBalancer.Ingress) > 0 {
			continue // assigned, by this controller or another writer
		}
		if want := s.Spec.LoadBalancerIP; want != "" {
			a, err := netip.ParseAddr(want)
			switch {
			case err != nil || !a.Is4():
				d.Problem = fmt.Sprintf("spec.loadBalancerIP: %q is not an IPv4 address", want)
			case !pool.Contains(a):
				d.Problem = fmt.Sprintf("spec.loadBalancerIP: %s is not in the load balancer pool %s", a, pool)
			case taken[a] != "":
				d.Problem = fmt.Sprintf("spec.loadBalancerIP: %s is already taken by Service %s", a, taken[a])
			default:
				d.Assign = a
				taken[a] = key(s)
			}
			out = append(out, d)
			continue
		}
		if a, ok := free(); ok {
			d.Assign = a
			taken[a] = key(s)
		} else {
			d.Problem = fmt.Sprintf("status.loadBalancer: the load balancer pool %s has no free address left", pool)
		}
		out = append(out, d)
	}
	return out
}

// ours says whether s is a LoadBalancer Service this controller serves.
func ours(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.LoadBalancerClass == nil
}

// addressesOf is what s holds: its load balancer ingress addresses and
// its externalIPs.
func addressesOf(s *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			out = append(out, a)
		}
	}
	for _, e := range s.Spec.ExternalIPs {
		if a, err := netip.ParseAddr(e); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// holdsFrom says whether s's load balancer status holds an address of pool.
func holdsFrom(s *corev1.Service, pool netip.Prefix) bool {
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil && pool.Contains(a) {
			return true
		}
	}
	return false
}

func key(s *corev1.Service) string { return s.Namespace + "/" + s.Name }

// HostRange bounds the addresses a pool hands out: all but its network and
// broadcast addresses, unless the prefix is too small to have them (/31,
// /32).
func HostRange(p netip.Prefix) (first, last netip.Addr) {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	first, last = p.Masked().Addr(), netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	if p.Bits() >= 31 {
		return first, last
	}
	return first.Next(), last.Prev()
}

// poolAdvice says what a load balancer pool must be.
const poolAdvice = "give an IPv4 CIDR, e.g. 192.168.124.0/28"

// CheckPool refuses a pool that is not an IPv4 CIDR, saying what to give.
func CheckPool(p netip.Prefix) error {
	if !p.IsValid() || !p.Addr().Is4() {
		return fmt.Errorf("load balancer pool %s: %s", p, poolAdvice)
	}
	return nil
}

// ParsePool reads the pool given to flag (the flag's name, for the
// error), refusing what is not an IPv4 CIDR.
func ParsePool(flag, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || CheckPool(p) != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q: %s", flag, s, poolAdvice)
	}
	return p, nil
}
