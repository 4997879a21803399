package policy

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shuntnet/shunt/internal/manifest"
)

// peers is what a rule's peer list resolves to: every peer, or identities
// (pods, host, world) and CIDR identities.
type peers struct {
	any  bool
	ids  []uint32
	cidr []uint32
}

// portMatch is one (protocol, port prefix); proto 0 matches everything.
type portMatch struct {
	proto uint8
	port  uint16
	bits  uint8
}

// Protocol numbers of the protocols policy ports name.
var protoNumbers = map[corev1.Protocol]uint8{corev1.ProtocolTCP: 6, corev1.ProtocolUDP: 17, corev1.ProtocolSCTP: 132}

func protoOf(p *corev1.Protocol) uint8 {
	if p == nil {
		return 6
	}
	return protoNumbers[*p]
}

// rangePrefixes splits [lo, hi] into the fewest aligned port prefixes.
func rangePrefixes(lo, hi uint16) []portMatch {
	var out []portMatch
	for l := uint32(lo); l <= uint32(hi); {
		k := 0 // block of 2^k ports starting at l
		for k < 16 {
			size := uint32(1) << (k + 1)
			if l%size != 0 || l+size-1 > uint32(hi) {
				break
			}
			k++
		}
		out = append(out, portMatch{port: uint16(l), bits: uint8(16 - k)})
		l += 1 << k
	}
	return out
}

// namedPort resolves a port name on a pod: the containerPorts with that
// name and protocol.
func namedPort(pod *corev1.Pod, name string, proto uint8) []uint16 {
	var out []uint16
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name && protoOf(&cp.Protocol) == proto && !slices.Contains(out, uint16(cp.ContainerPort)) {
				out = append(out, uint16(cp.ContainerPort))
			}
		}
	}
	return out
}

// numericPorts is what one policy port matches without resolving names:
// ok is false for a named port.
func numericPorts(p networkingv1.NetworkPolicyPort) (out []portMatch, ok bool) {
	proto := protoOf(p.Protocol)
	switch {
	case p.Port == nil:
		return []portMatch{{proto: proto}}, true
	case p.Port.Type == intstr.String: // a named port
		return nil, false
	}
	lo, hi := uint16(p.Port.IntVal), uint16(p.Port.IntVal)
	if p.EndPort != nil && *p.EndPort > p.Port.IntVal {
		hi = uint16(*p.EndPort)
	}
	for _, m := range rangePrefixes(lo, hi) {
		m.proto = proto
		out = append(out, m)
	}
	return out, true
}

func exact(proto uint8, ports []uint16) []portMatch {
	out := make([]portMatch, len(ports))
	for i, p := range ports {
		out[i] = portMatch{proto: proto, port: p, bits: 16}
	}
	return out
}

// emit writes one rule's entries for one local pod. Named ports resolve on
// the pod itself for ingress and on the peer pods for egress (per peer
// identity: the union over its pods); a named port matches no CIDR peer.
func (c *computation) emit(p Pod, egress bool, ps peers, ports []networkingv1.NetworkPolicyPort, v Verdict, rule uint32) {
	ids := ps.ids
	if ps.any {
		ids = []uint32{IdentityAny}
	}
	put := func(id uint32, m portMatch) {
		c.put(Key{Endpoint: p.IP, Egress: egress, Identity: id, Proto: m.proto, Port: m.port, PortBits: m.bits}, v, rule)
	}
	putAll := func(ms []portMatch) {
		for _, m := range ms {
			for _, id := range ids {
				put(id, m)
			}
			for _, id := range ps.cidr {
				put(id, m)
			}
		}
	}
	if len(ports) == 0 {
		putAll([]portMatch{{}})
		return
	}
	for _, port := range ports {
		if ms, ok := numericPorts(port); ok {
			putAll(ms)
			continue
		}
		proto := protoOf(port.Protocol)
		if !egress {
			putAll(exact(proto, namedPort(p.Pod, port.Port.StrVal, proto)))
			continue
		}
		peerIDs := ps.ids
		if ps.any {
			peerIDs = c.podIDs
		}
		for _, id := range peerIDs {
			var nums []uint16
			for _, pod := range c.idPods[id] {
				nums = append(nums, namedPort(pod, port.Port.StrVal, proto)...)
			}
			for _, m := range exact(proto, nums) {
				put(id, m)
			}
		}
	}
}

func (c *computation) k8sPeers(ns string, list []networkingv1.NetworkPolicyPeer) peers {
	if len(list) == 0 {
		return peers{any: true}
	}
	var ps peers
	for _, pe := range list {
		if pe.IPBlock != nil {
			ps.cidr = append(ps.cidr, c.blockIdentities(pe.IPBlock.CIDR, pe.IPBlock.Except)...)
			continue
		}
		ps.ids = append(ps.ids, c.podIdentitiesMatching(ns, pe.PodSelector, pe.NamespaceSelector)...)
	}
	return ps
}

func policyName(kind, ns, name string) string { return kind + " " + ns + "/" + name }

// applyNetworkPolicies: a pod selected by a policy of a type is isolated
// for that direction; each rule allows its peers on its ports; policies add up.
func (c *computation) applyNetworkPolicies() {
	nps := slices.Clone(c.in.NetworkPolicies)
	slices.SortFunc(nps, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, np := range nps {
		const kind = "NetworkPolicy"
		name := policyName(kind, np.Namespace, np.Name)
		targets := c.selectedLocalPods(np.Namespace, np.Spec.PodSelector)
		for _, t := range np.Spec.PolicyTypes {
			egress := t == networkingv1.PolicyTypeEgress
			for _, p := range targets {
				c.isolate(p, egress, name)
			}
			if egress {
				for i, r := range np.Spec.Egress {
					rule := c.rule(kind, np.Namespace, np.Name, "egress", i, manifest.ActionAllow)
					ps := c.k8sPeers(np.Namespace, r.To)
					for _, p := range targets {
						c.emit(p, true, ps, r.Ports, VerdictAllow, rule)
					}
				}
				continue
			}
			for i, r := range np.Spec.Ingress {
				rule := c.rule(kind, np.Namespace, np.Name, "ingress", i, manifest.ActionAllow)
				ps := c.k8sPeers(np.Namespace, r.From)
				for _, p := range targets {
					c.emit(p, false, ps, r.Ports, VerdictAllow, rule)
					c.noteIngress(p, ps, r.Ports, manifest.ActionAllow, rule, nil)
				}
			}
		}
	}
}

func (c *computation) shuntPeers(ns string, list []manifest.ShuntPeer) peers {
	if len(list) == 0 {
		return peers{any: true}
	}
	var ps peers
	for _, pe := range list {
		switch {
		case pe.Entity == manifest.EntityAll:
			return peers{any: true}
		case pe.Entity == manifest.EntityHost:
			ps.ids = append(ps.ids, IdentityHost)
		case pe.Entity == manifest.EntityWorld:
			ps.ids = append(ps.ids, IdentityWorld)
		case pe.Entity == manifest.EntityCluster:
			ps.ids = append(append(ps.ids, IdentityHost), c.podIDs...)
		case pe.CIDR != "":
			ps.cidr = append(ps.cidr, c.blockIdentities(pe.CIDR, pe.Except)...)
		default:
			ps.ids = append(ps.ids, c.podIdentitiesMatching(ns, pe.PodSelector, pe.NamespaceSelector)...)
		}
	}
	return ps
}

// applyShuntPolicies: like NetworkPolicy, plus deny rules (a deny wins over
// any allow) and entities. A direction with at least one allow rule
// isolates the selected pods; deny-only policies only take away.
func (c *computation) applyShuntPolicies() {
	sps := slices.Clone(c.in.ShuntPolicies)
	slices.SortFunc(sps, func(a, b *manifest.ShuntNetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, sp := range sps {
		const kind = "ShuntNetworkPolicy"
		name := policyName(kind, sp.Namespace, sp.Name)
		targets := c.selectedLocalPods(sp.Namespace, sp.Spec.PodSelector)
		for _, d := range []struct {
			dir    string
			egress bool
			rules  []manifest.ShuntRule
		}{{"ingress", false, sp.Spec.Ingress}, {"egress", true, sp.Spec.Egress}} {
			if slices.ContainsFunc(d.rules, func(r manifest.ShuntRule) bool { return r.Action != manifest.ActionDeny }) {
				for _, p := range targets {
					c.isolate(p, d.egress, name)
				}
			}
			for i, r := range d.rules {
				v := VerdictAllow
				if r.Action == manifest.ActionDeny {
					v = VerdictDeny
				}
				rule := c.rule(kind, sp.Namespace, sp.Name, d.dir, i, r.Action)
				ps := c.shuntPeers(sp.Namespace, r.Peers)
				// An HTTP deny takes requests away in the proxy, not
				// whole connections at L4.
				l4 := !(len(r.HTTP) > 0 && !d.egress && v == VerdictDeny)
				for _, p := range targets {
					if l4 {
						c.emit(p, d.egress, ps, r.Ports, v, rule)
					}
					if !d.egress {
						c.noteIngress(p, ps, r.Ports, v.action(), rule, r.HTTP)
					}
				}
			}
		}
	}
}
