package lab

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/lbipam"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// What the lab's API server assigns for outside traffic, beside the
// ClusterIP: the nodePorts of NodePort and LoadBalancer Services (and the
// healthCheckNodePort of a LoadBalancer with externalTrafficPolicy Local)
// from manifest.DefaultNodePortRange, as the API server's allocator does,
// and the load balancer ingress address of a LoadBalancer Service from the
// lab's pool, written into its status, as Cilium's LB-IPAM or MetalLB do.
// Both live in the objects themselves: the store is the index, scanned
// once per change.

// nodePortKey is a nodePort of one protocol; a health check port is TCP.
type nodePortKey struct {
	port  int32
	proto corev1.Protocol
}

// externalOwners says which Service holds each nodePort and each outside
// address (load balancer ingress, externalIP) in a store.
type externalOwners struct {
	nodePorts map[nodePortKey][]string
	lbAddrs   map[netip.Addr][]string // load balancer ingress IPs
	extIPs    map[netip.Addr][]string // externalIPs
}

func ownersIn(store *model.Store) externalOwners {
	o := externalOwners{nodePorts: map[nodePortKey][]string{}, lbAddrs: map[netip.Addr][]string{}, extIPs: map[netip.Addr][]string{}}
	for _, s := range store.Services() {
		key := s.Namespace + "/" + s.Name
		for _, p := range s.Spec.Ports {
			if p.NodePort != 0 {
				o.nodePorts[nodePortKey{p.NodePort, p.Protocol}] = append(o.nodePorts[nodePortKey{p.NodePort, p.Protocol}], key)
			}
		}
		if hc := s.Spec.HealthCheckNodePort; hc != 0 {
			k := nodePortKey{hc, corev1.ProtocolTCP}
			o.nodePorts[k] = append(o.nodePorts[k], key)
		}
		for _, ing := range s.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(ing.IP); err == nil {
				o.lbAddrs[a] = append(o.lbAddrs[a], key)
			}
		}
		for _, e := range s.Spec.ExternalIPs {
			if a, err := netip.ParseAddr(e); err == nil {
				o.extIPs[a] = append(o.extIPs[a], key)
			}
		}
	}
	return o
}

// other is an owner in owners that is not self ("" if none).
func other(owners []string, self string) string {
	for _, o := range owners {
		if o != self {
			return o
		}
	}
	return ""
}

// assignExternal gives each Service that changes create or update the
// nodePorts and load balancer address it lacks, and refuses one whose
// nodePort another Service holds, or whose load balancer address or
// externalIP is another Service's load balancer address. lbPool is the
// lab's load balancer pool (invalid: none; a LoadBalancer Service then
// stays pending, as in a cluster without a load balancer controller).
// The objects of next that changes name are written in place (they are
// the request's own, not published yet). Returns the problems, one per
// line, with file, object and field.
func assignExternal(next *model.Store, changes []model.Change, lbPool netip.Prefix) []string {
	var problems []string
	var owners *externalOwners
	for _, ch := range changes {
		if ch.Key.Kind != manifest.KindService || (ch.Action != model.Created && ch.Action != model.Configured) {
			continue
		}
		o, ok := next.Get(ch.Key)
		if !ok {
			continue
		}
		s := o.Obj.(*corev1.Service)
		if owners == nil {
			all := ownersIn(next)
			owners = &all
		}
		problems = append(problems, assignService(o.Source, s, owners, lbPool)...)
	}
	sort.Strings(problems)
	return problems
}

func assignService(source string, s *corev1.Service, owners *externalOwners, lbPool netip.Prefix) []string {
	self := s.Namespace + "/" + s.Name
	label := fmt.Sprintf("%s: Service %s: ", source, self)
	var problems []string
	take := func(k nodePortKey) {
		owners.nodePorts[k] = append(owners.nodePorts[k], self)
	}
	free := func(proto corev1.Protocol) (int32, bool) {
		for p := manifest.DefaultNodePortRange.Min; p <= manifest.DefaultNodePortRange.Max; p++ {
			if len(owners.nodePorts[nodePortKey{p, proto}]) == 0 {
				return p, true
			}
		}
		return 0, false
	}
	exposes := s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer
	// allocateLoadBalancerNodePorts: false: a LoadBalancer gets no
	// nodePort it did not ask for, as the API server does.
	allocate := !(s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.AllocateLoadBalancerNodePorts != nil && !*s.Spec.AllocateLoadBalancerNodePorts)
	for i := range s.Spec.Ports {
		p := &s.Spec.Ports[i]
		field := fmt.Sprintf("spec.ports[%d].nodePort", i)
		switch {
		case !exposes:
		case p.NodePort == 0 && !allocate:
		case p.NodePort != 0:
			if by := other(owners.nodePorts[nodePortKey{p.NodePort, p.Protocol}], self); by != "" {
				problems = append(problems, fmt.Sprintf("%s%s: %d/%s is already allocated to Service %s", label, field, p.NodePort, p.Protocol, by))
			}
		default:
			port, ok := free(p.Protocol)
			if !ok {
				problems = append(problems, fmt.Sprintf("%s%s: no free nodePort of %s left in %d-%d", label, field, p.Protocol,
					manifest.DefaultNodePortRange.Min, manifest.DefaultNodePortRange.Max))
				continue
			}
			p.NodePort = port
			take(nodePortKey{port, p.Protocol})
		}
	}
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		if hc := s.Spec.HealthCheckNodePort; hc != 0 {
			if by := other(owners.nodePorts[nodePortKey{hc, corev1.ProtocolTCP}], self); by != "" {
				problems = append(problems, fmt.Sprintf("%sspec.healthCheckNodePort: %d is already allocated to Service %s", label, hc, by))
			}
		} else if port, ok := free(corev1.ProtocolTCP); ok {
			s.Spec.HealthCheckNodePort = port
			take(nodePortKey{port, corev1.ProtocolTCP})
		} else {
			problems = append(problems, fmt.Sprintf("%sspec.healthCheckNodePort: no free nodePort left", label))
		}
	}
	for i, e := range s.Spec.ExternalIPs {
		if a, err := netip.ParseAddr(e); err == nil {
			if by := other(owners.lbAddrs[a], self); by != "" {
				problems = append(problems, fmt.Sprintf("%sspec.externalIPs[%d]: %s is the load balancer address of Service %s", label, i, a, by))
			}
		}
	}
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return problems
	}
	inUse := func(a netip.Addr) string {
		if by := other(owners.lbAddrs[a], self); by != "" {
			return "the load balancer address of Service " + by
		}
		if by := other(owners.extIPs[a], self); by != "" {
			return "an externalIP of Service " + by
		}
		return ""
	}
	for i, ing := range s.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			if use := inUse(a); use != "" {
				problems = append(problems, fmt.Sprintf("%sstatus.loadBalancer.ingress[%d].ip: %s is already %s", label, i, a, use))
			}
		}
	}
	if len(s.Status.LoadBalancer.Ingress) > 0 {
		return problems
	}
	if want := s.Spec.LoadBalancerIP; want != "" {
		a, _ := netip.ParseAddr(want) // validated by the manifest reader
		switch {
		case !lbPool.IsValid():
			problems = append(problems, fmt.Sprintf("%sspec.loadBalancerIP: the lab has no load balancer pool: start it with --lb-pool CIDR", label))
		case !lbPool.Contains(a):
			problems = append(problems, fmt.Sprintf("%sspec.loadBalancerIP: %s is not in the load balancer pool %s", label, a, lbPool))
		case inUse(a) != "":
			problems = append(problems, fmt.Sprintf("%sspec.loadBalancerIP: %s is already %s", label, a, inUse(a)))
		default:
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: a.String()}}
			owners.lbAddrs[a] = append(owners.lbAddrs[a], self)
		}
		return problems
	}
	if !lbPool.IsValid() {
		return problems // pending: no controller assigns an address
	}
	first, last := lbipam.HostRange(lbPool)
	for a := first; lbPool.Contains(a) && a.Compare(last) <= 0; a = a.Next() {
		if inUse(a) == "" {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: a.String()}}
			owners.lbAddrs[a] = append(owners.lbAddrs[a], self)
			return problems
		}
	}
	return append(problems, fmt.Sprintf("%sstatus.loadBalancer: the load balancer pool %s has no free address left", label, lbPool))
}

// keepExternal carries over to an update what the allocator assigned and
// the user does not write: each port's nodePort (by port and protocol),
// the health check port, the load balancer status, as long as the type
// still has them.
func keepExternal(o, n *corev1.Service) {
	exposes := n.Spec.Type == corev1.ServiceTypeNodePort || n.Spec.Type == corev1.ServiceTypeLoadBalancer
	for i := range n.Spec.Ports {
		np := &n.Spec.Ports[i]
		if np.NodePort != 0 || !exposes {
			continue
		}
		if j := slices.IndexFunc(o.Spec.Ports, func(op corev1.ServicePort) bool {
			return op.Port == np.Port && op.Protocol == np.Protocol
		}); j >= 0 {
			np.NodePort = o.Spec.Ports[j].NodePort
		}
	}
	lb := n.Spec.Type == corev1.ServiceTypeLoadBalancer
	if lb && n.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && n.Spec.HealthCheckNodePort == 0 {
		n.Spec.HealthCheckNodePort = o.Spec.HealthCheckNodePort
	}
	if lb && len(n.Status.LoadBalancer.Ingress) == 0 && (n.Spec.LoadBalancerIP == "" || n.Spec.LoadBalancerIP == o.Spec.LoadBalancerIP) {
		n.Status.LoadBalancer = o.Status.LoadBalancer
	}
}
