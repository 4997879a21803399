package e2e

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The oracle: Kubernetes NetworkPolicy semantics written straight from the
// API reference, pod by pod and rule by rule, sharing no code with shunt's
// compute (no identities, no port prefixes, no maps). The e2e matrix
// compares what the kernel does with what this says.

type oraclePod struct {
	Namespace string
	Name      string
	Labels    map[string]string
	IP        netip.Addr
	Ports     []corev1.ContainerPort
}

type oracle struct {
	nsLabels map[string]map[string]string // with kubernetes.io/metadata.name
	policies []*networkingv1.NetworkPolicy
}

func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(l))
}

// peerMatches: does one NetworkPolicyPeer of a policy in ns match pod?
func (o oracle) peerMatches(ns string, peer networkingv1.NetworkPolicyPeer, p oraclePod) bool {
	if peer.IPBlock != nil {
		cidr := netip.MustParsePrefix(peer.IPBlock.CIDR)
		if !cidr.Contains(p.IP) {
			return false
		}
		for _, e := range peer.IPBlock.Except {
			if netip.MustParsePrefix(e).Contains(p.IP) {
				return false
			}
		}
		return true
	}
	if peer.NamespaceSelector != nil {
		if !selects(peer.NamespaceSelector, o.nsLabels[p.Namespace]) {
			return false
		}
	} else if p.Namespace != ns {
		return false // podSelector alone: the policy's own namespace
	}
	return peer.PodSelector == nil || selects(peer.PodSelector, p.Labels)
}

// portMatches: does a rule's port list allow proto/port on dst? A named
// port is the port of that name on the destination pod.
func portMatches(ports []networkingv1.NetworkPolicyPort, dst oraclePod, proto corev1.Protocol, port int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		pproto := corev1.ProtocolTCP
		if pp.Protocol != nil {
			pproto = *pp.Protocol
		}
		if pproto != proto {
			continue
		}
		switch {
		case pp.Port == nil:
			return true
		case pp.Port.Type == intstr.String:
			for _, cp := range dst.Ports {
				cpProto := cp.Protocol
				if cpProto == "" {
					cpProto = corev1.ProtocolTCP
				}
				if cp.Name == pp.Port.StrVal && cpProto == proto && cp.ContainerPort == port {
					return true
				}
			}
		case pp.EndPort != nil:
			if port >= pp.Port.IntVal && port <= *pp.EndPort {
				return true
			}
		case pp.Port.IntVal == port:
			return true
		}
	}
	return false
}

func hasType(np *networkingv1.NetworkPolicy, t networkingv1.PolicyType) bool {
	for _, pt := range np.Spec.PolicyTypes {
		if pt == t {
			return true
		}
	}
	return false
}

// allowed says whether src may open a connection to dst on proto/port:
// the source's egress and the destination's ingress must both allow it.
func (o oracle) allowed(src, dst oraclePod, proto corev1.Protocol, port int32) bool {
	return o.direction(src, dst, src, dst, true, proto, port) && o.direction(dst, src, src, dst, false, proto, port)
}

// direction checks the policies selecting subject for one direction; peer
// is the other end; dst is always the connection's destination (for
// named ports).
func (o oracle) direction(subject, peer, src, dst oraclePod, egress bool, proto corev1.Protocol, port int32) bool {
	t := networkingv1.PolicyTypeIngress
	if egress {
		t = networkingv1.PolicyTypeEgress
	}
	isolated := false
	for _, np := range o.policies {
		if np.Namespace != subject.Namespace || !hasType(np, t) || !selects(&np.Spec.PodSelector, subject.Labels) {
			continue
		}
		isolated = true
		if egress {
			for _, r := range np.Spec.Egress {
				if o.anyPeer(np.Namespace, r.To, peer) && portMatches(r.Ports, dst, proto, port) {
					return true
				}
			}
		} else {
			for _, r := range np.Spec.Ingress {
				if o.anyPeer(np.Namespace, r.From, peer) && portMatches(r.Ports, dst, proto, port) {
					return true
				}
			}
		}
	}
	return !isolated
}

func (o oracle) anyPeer(ns string, peers []networkingv1.NetworkPolicyPeer, p oraclePod) bool {
	if len(peers) == 0 {
		return true
	}
	for _, pe := range peers {
		if o.peerMatches(ns, pe, p) {
			return true
		}
	}
	return false
}
