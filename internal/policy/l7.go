package policy

import (
	"cmp"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

// L7: the ingress ports of local pods that HTTP rules name, with every rule
// that applies to them, for the node proxy to decide each request as the
// policies read. The tc programs still admit connections at L3/L4 (an HTTP
// allow rule allows its peers at L4, an HTTP deny rule denies nothing there);
// such ports are redirected to the proxy, which judges the requests.

// L7Port is one local pod's ingress port with HTTP rules.
type L7Port struct {
	Endpoint netip.Addr
	Pod      string // namespace/name
	Port     uint16
	Isolated bool // the pod is isolated for ingress: what no rule allows is denied
	Rules    []L7Rule
}

// L7Rule is one policy rule as it applies to an L7 port.
type L7Rule struct {
	RuleID     uint32
	Action     string // manifest.ActionAllow or ActionDeny
	AnyPeer    bool
	Identities []uint32 // pod, reserved and CIDR identities
	HTTP       []manifest.HTTPRule
}

// l7Candidate is an ingress rule as it applies to one target pod, kept
// until finishL7 knows which ports HTTP rules name.
type l7Candidate struct {
	pod    Pod
	ports  []portMatch
	peers  peers
	action string
	rule   uint32
	http   []manifest.HTTPRule
}

// noteIngress records an ingress rule for the L7 view.
func (c *computation) noteIngress(p Pod, ps peers, ports []networkingv1.NetworkPolicyPort, action string, rule uint32, http []manifest.HTTPRule) {
	var ms []portMatch
	if len(ports) == 0 {
		ms = []portMatch{{}}
	}
	for _, port := range ports {
		if m, ok := numericPorts(port); ok {
			ms = append(ms, m...)
			continue
		}
		proto := protoOf(port.Protocol)
		ms = append(ms, exact(proto, namedPort(p.Pod, port.Port.StrVal, proto))...)
	}
	c.l7 = append(c.l7, l7Candidate{pod: p, ports: ms, peers: ps, action: action, rule: rule, http: http})
}

func (m portMatch) covers(proto uint8, port uint16) bool {
	if m.proto == 0 {
		return true
	}
	if m.proto != proto {
		return false
	}
	mask := ^uint16(0) << (16 - m.bits)
	if m.bits == 0 {
		mask = 0
	}
	return port&mask == m.port&mask
}

// finishL7 lays out the L7 ports: the exact TCP ports of rules with HTTP
// rules, each with every ingress rule of its pod that covers it.
func (c *computation) finishL7() {
	const tcp = 6
	type portKey struct {
		pod  string
		port uint16
	}
	ports := map[portKey]*L7Port{}
	for _, cand := range c.l7 {
		if len(cand.http) == 0 {
			continue
		}
		for _, m := range cand.ports {
			if m.proto != tcp || m.bits != 16 {
				continue // validation asks HTTP rules for exact TCP ports
			}
			k := portKey{cand.pod.key(), m.port}
			if ports[k] == nil {
				ep := c.res.Endpoints[k.pod]
				ports[k] = &L7Port{Endpoint: cand.pod.IP, Pod: k.pod, Port: m.port, Isolated: len(ep.IngressIsolatedBy) > 0}
			}
		}
	}
	for _, cand := range c.l7 {
		for k, lp := range ports {
			if k.pod != cand.pod.key() || !slices.ContainsFunc(cand.ports, func(m portMatch) bool { return m.covers(tcp, k.port) }) {
				continue
			}
			ids := append(slices.Clone(cand.peers.ids), cand.peers.cidr...)
			slices.Sort(ids)
			lp.Rules = append(lp.Rules, L7Rule{
				RuleID: cand.rule, Action: cand.action, AnyPeer: cand.peers.any, Identities: slices.Compact(ids), HTTP: cand.http,
			})
		}
	}
	for _, lp := range ports {
		if lp.Isolated {
			// The node reaches its own pods at L4 whatever isolates them
			// (finish's RuleNode entry): its kubelet's HTTP probes must
			// pass the proxy too. A deny rule naming the host still wins,
			// as at L4, since deny rules are decided first.
			lp.Rules = append(lp.Rules, L7Rule{RuleID: RuleNode, Action: manifest.ActionAllow, Identities: []uint32{IdentityHost}})
		}
		slices.SortFunc(lp.Rules, func(a, b L7Rule) int { return cmp.Compare(a.RuleID, b.RuleID) })
		c.res.L7 = append(c.res.L7, *lp)
	}
	slices.SortFunc(c.res.L7, func(a, b L7Port) int {
		return cmp.Or(a.Endpoint.Compare(b.Endpoint), cmp.Compare(a.Port, b.Port))
	})
	c.l7 = nil
}

// CIDRIdentityOf is the identity of the longest policy prefix holding addr,
// 0 when none does: what the tc programs' CIDR lookup answers.
func (r *Result) CIDRIdentityOf(addr netip.Addr) uint32 { return r.cidrIdentityOf(addr) }

// action is the manifest's word for a verdict.
func (v Verdict) action() string {
	if v == VerdictDeny {
		return manifest.ActionDeny
	}
	return manifest.ActionAllow
}

// ClusterL7 computes the L7 ports of every pod of the cluster, not only of
// this node's (nil when no policy has HTTP rules, or every pod is local). A
// client's node sends connections to another node's pod port with HTTP
// rules to its own node proxy, as for a local one: the socket hooks see
// the connection only there. Its proxy decides each request as the
// server's policies read, and its connection to the server carries the
// client's identity to the server's node, whose tc admits it at L4.
// Without this, a pod of another node would reach such a port with no
// HTTP rule applied. alloc gives the same numbers as the node's own
// computation; the result is for the L7 view only.
func ClusterL7(in Input, alloc Allocations) *Result {
	remote := slices.ContainsFunc(in.Pods, func(p Pod) bool { return !p.Local })
	if !remote || !HasHTTPRules(in.ShuntPolicies) {
		return nil
	}
	all := in
	all.Pods = make([]Pod, len(in.Pods))
	for i, p := range in.Pods {
		p.Local = true
		all.Pods[i] = p
	}
	return Compute(all, alloc)
}

// HasHTTPRules says whether a policy has HTTP rules: without any, no pod
// has L7 ports.
func HasHTTPRules(policies []*manifest.ShuntNetworkPolicy) bool {
	return slices.ContainsFunc(policies, func(sp *manifest.ShuntNetworkPolicy) bool {
		return slices.ContainsFunc(sp.Spec.Ingress, func(r manifest.ShuntRule) bool { return len(r.HTTP) > 0 })
	})
}
