package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/shuntnet/shunt/internal/manifest"
)

// Input is everything policy depends on.
type Input struct {
	Namespaces      []*corev1.Namespace
	Pods            []Pod
	NetworkPolicies []*networkingv1.NetworkPolicy
	ShuntPolicies   []*manifest.ShuntNetworkPolicy
	HostAddrs       []netip.Addr // the node's own addresses: the host identity
	// Nodes of the cluster: where pods of other nodes are reached (the
	// tunnel endpoint of their ipcache entries).
	Nodes []*corev1.Node
	// Node is this node's name: every other node's own traffic comes
	// through the overlay as the remote-node identity.
	Node string
}

// Rule names one rule of one policy; its ID travels in the policy map
// entries, conntrack and flows.
type Rule struct {
	ID        uint32 `json:"id"`
	Kind      string `json:"kind,omitempty"` // NetworkPolicy, ShuntNetworkPolicy; "" for built-in rules
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Direction string `json:"direction,omitempty"` // ingress, egress
	Index     int    `json:"index"`
	Action    string `json:"action"` // allow, deny
}

func (r Rule) String() string {
	if r.Kind == "" {
		return r.Name
	}
	return fmt.Sprintf("%s %s/%s %s[%d] (%s)", r.Kind, r.Namespace, r.Name, r.Direction, r.Index, r.Action)
}

// RuleNode is the built-in rule under which the node reaches its own pods
// even when they are isolated for ingress, as Kubernetes specifies (health
// checks come from there). A ShuntNetworkPolicy can still deny the host.
const (
	RuleNode     = 1
	firstRuleID  = 16
	ruleNodeName = "node-to-local-pod (always allowed)"
)

// EndpointPolicy is the policy summary of one local pod.
type EndpointPolicy struct {
	Pod               string     `json:"pod"`
	IP                netip.Addr `json:"ip"`
	Identity          uint32     `json:"identity"`
	IngressIsolatedBy []string   `json:"ingressIsolatedBy,omitempty"` // policies selecting it for ingress
	EgressIsolatedBy  []string   `json:"egressIsolatedBy,omitempty"`
	IngressRules      bool       `json:"ingressRules,omitempty"` // has ingress entries (a deny-only policy has no isolation)
	EgressRules       bool       `json:"egressRules,omitempty"`
}

// Problem is one thing an object asks that shunt leaves out.
type Problem struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Reason    string `json:"reason"` // CamelCase, as Events have it
	Message   string `json:"message"`
}

func (p Problem) String() string {
	if p.Namespace == "" { // cluster-scoped: a Node
		return fmt.Sprintf("%s %s: %s", p.Kind, p.Name, p.Message)
	}
	return fmt.Sprintf("%s %s/%s: %s", p.Kind, p.Namespace, p.Name, p.Message)
}

func (c *computation) problem(kind, ns, name, reason, format string, args ...any) {
	c.res.Problems = append(c.res.Problems, Problem{Kind: kind, Namespace: ns, Name: name, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// CIDRIdentity is the identity of one prefix a policy names.
type CIDRIdentity struct {
	ID     uint32       `json:"id"`
	Prefix netip.Prefix `json:"prefix"`
}

// Result is the computed policy state.
type Result struct {
	Identities []Identity                // pod identities, by id
	CIDRs      []CIDRIdentity            // by id
	Endpoints  map[string]EndpointPolicy // local pods by ns/name
	State      State                     // exactly what the maps must hold
	Rules      map[uint32]Rule
	// Problems are what objects ask that the datapath cannot do (an API
	// server accepts more than shunt programs): the rest of the object,
	// and every other object, is programmed.
	Problems []Problem
	Warnings []string // Problems as text
	Alloc    Allocations
	L7       []L7Port // ingress ports HTTP rules name, for the node proxy
	// NodeRoutes: every other node's pod CIDR and underlay address, for
	// routing this node's own traffic to their pods through the overlay.
	NodeRoutes []NodeRoute
	// OtherNodes: every other node's underlay address (NodeTunnel),
	// sorted, those shared by two nodes included: the outer sources
	// this node takes DSR packets from.
	OtherNodes []netip.Addr

	podIdentity map[string]uint32 // every pod by ns/name
	hostAddrs   map[netip.Addr]bool
	remoteNodes map[netip.Addr]bool // other nodes' pod-network addresses
	podByIP     map[netip.Addr]string
}

type entryValue struct {
	verdict Verdict
	rule    uint32
}

type computation struct {
	in          Input
	res         *Result
	nsLabels    func(string) map[string]string
	identities  map[uint32]*Identity
	idPods      map[uint32][]*corev1.Pod
	cidrByID    map[uint32]netip.Prefix
	cidrSorted  []CIDRIdentity // by address, then prefix length
	rules       *allocator
	entries     map[Key]entryValue
	podIDs      []uint32 // every pod identity, sorted
	localByKey  map[string]Pod
	selectorErr map[string]bool
	l7          []l7Candidate // ingress rules per target pod, for finishL7
}

// Compute turns the input into the policy maps' content. prev are the
// numbers handed out by the previous computation.
func Compute(in Input, prev Allocations) *Result {
	c := &computation{
		in: in,
		res: &Result{
			Endpoints: map[string]EndpointPolicy{}, Rules: map[uint32]Rule{},
			podIdentity: map[string]uint32{}, hostAddrs: map[netip.Addr]bool{}, remoteNodes: map[netip.Addr]bool{}, podByIP: map[netip.Addr]string{},
		},
		identities: map[uint32]*Identity{},
		idPods:     map[uint32][]*corev1.Pod{},
		cidrByID:   map[uint32]netip.Prefix{},
		entries:    map[Key]entryValue{},
		localByKey: map[string]Pod{},
	}
	c.res.Rules[RuleNode] = Rule{ID: RuleNode, Name: ruleNodeName, Action: "allow"}
	c.identify(prev)
	c.allocateCIDRs(prev)
	c.rules = newAllocator(prev.Rules, firstRuleID)
	c.applyNetworkPolicies()
	c.applyShuntPolicies()
	c.finish()
	c.finishL7()
	c.res.OtherNodes = otherNodeAddrs(in.Nodes, in.Node)
	c.res.Alloc.Rules = c.rules.next
	c.res.Problems = slices.Compact(c.res.Problems)
	for _, p := range c.res.Problems {
		c.res.Warnings = append(c.res.Warnings, p.String())
	}
	return c.res
}

// nodeTunnels maps each node's name to the underlay address its pods are
// reached at: its first IPv4 InternalIP, else its first IPv4 ExternalIP, as
// kubelet orders them. A node with neither is left out: its pods stay
// ipcache entries without a tunnel (the host stack routes them) until it
// has one. Two nodes claiming one address would steal each other's
// traffic: both are left out and reported.
func (c *computation) nodeTunnels() map[string]netip.Addr {
	out := make(map[string]netip.Addr, len(c.in.Nodes))
	owner := map[netip.Addr]string{}
	shared := map[netip.Addr]bool{}
	for _, n := range c.in.Nodes {
		ip := NodeTunnel(n)
		if !ip.IsValid() {
			continue
		}
		if first, taken := owner[ip]; taken {
			shared[ip] = true
			c.problem("Node", "", n.Name, "DuplicateNodeAddress",
				"status.addresses: %s is also node %s's address; pods of both nodes are not reached through the overlay until one changes", ip, first)
			continue
		}
		owner[ip] = n.Name
		out[n.Name] = ip
	}
	for name, ip := range out {
		if shared[ip] {
			delete(out, name)
		}
	}
	return out
}

// NodeRoute is another node's pod CIDR and the underlay address it is
// reached at.
type NodeRoute struct {
	Node    string // the Node's name, for problems
	PodCIDR netip.Prefix
	Tunnel  netip.Addr
}

// remoteNodeAddrs puts every other node's pod-network address (the first
// of its pod CIDR: shunt-cni's gateway, the source of that node's own
// traffic to pods of other nodes) in the ipcache as the remote-node
// identity behind that node's tunnel, so its traffic is let in from the
// overlay and judged by policy as a node's.
func (c *computation) remoteNodeAddrs(tunnels map[string]netip.Addr) {
	for _, n := range c.in.Nodes {
		tunnel, ok := tunnels[n.Name]
		cidr, err := netip.ParsePrefix(n.Spec.PodCIDR)
		if n.Name == c.in.Node || !ok || err != nil || !cidr.Addr().Is4() {
			continue
		}
		a := cidr.Masked().Addr().Next()
		if _, isPod := c.res.podByIP[a]; isPod || c.res.hostAddrs[a] || c.res.remoteNodes[a] {
			continue
		}
		c.res.NodeRoutes = append(c.res.NodeRoutes, NodeRoute{Node: n.Name, PodCIDR: cidr.Masked(), Tunnel: tunnel})
		c.res.remoteNodes[a] = true
		c.res.State.IPCache = append(c.res.State.IPCache, PrefixIdentity{
			Prefix: netip.PrefixFrom(a, 32), Identity: IdentityRemoteNode, Tunnel: tunnel})
	}
}

// otherNodeAddrs is the underlay address (NodeTunnel) of every node but
// self, sorted, each once.
func otherNodeAddrs(nodes []*corev1.Node, self string) []netip.Addr {
	var out []netip.Addr
	for _, n := range nodes {
		if ip := NodeTunnel(n); n.Name != self && ip.IsValid() {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// NodeTunnel is the address a node's pods are reached at through the
// overlay (see nodeTunnels); invalid when the node has none.
func NodeTunnel(n *corev1.Node) netip.Addr {
	if ip := NodeAddress(n, corev1.NodeInternalIP); ip.IsValid() {
		return ip
	}
	return NodeAddress(n, corev1.NodeExternalIP)
}

// NodeAddress is the node's first IPv4 address of type t (invalid: none).
func NodeAddress(n *corev1.Node, t corev1.NodeAddressType) netip.Addr {
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); a.Type == t && err == nil && ip.Is4() {
			return ip
		}
	}
	return netip.Addr{}
}

func (c *computation) namespaceLabels(ns string) map[string]string {
	return c.nsLabels(ns)
}

// identify gives every pod its identity and fills the ipcache.
func (c *computation) identify(prev Allocations) {
	c.nsLabels = namespaceLabelSets(c.in.Namespaces)
	alloc := newAllocator(prev.Identities, FirstPodIdentity)
	tunnels := c.nodeTunnels()
	pods := slices.Clone(c.in.Pods)
	slices.SortFunc(pods, func(a, b Pod) int { return strings.Compare(a.key(), b.key()) })
	for _, p := range pods {
		nsl := c.namespaceLabels(p.Pod.Namespace)
		id := alloc.get(identityKey(p.Pod.Namespace, p.Pod.Labels, nsl))
		ident := c.identities[id]
		if ident == nil {
			ident = &Identity{ID: id, Namespace: p.Pod.Namespace, Labels: p.Pod.Labels, NamespaceLabels: nsl}
			c.identities[id] = ident
		}
		ident.Pods = append(ident.Pods, p.key())
		c.idPods[id] = append(c.idPods[id], p.Pod)
		c.res.podIdentity[p.key()] = id
		if p.IP.IsValid() && !p.IP.Is4() {
			c.problem("Pod", p.Pod.Namespace, p.Pod.Name, "IPv6NotSupported",
				"address %s: shunt enforces policy for IPv4 only; the pod is known to policy by its IPv4 address, if any", p.IP)
			p.IP = netip.Addr{}
		}
		if p.IP.IsValid() {
			entry := PrefixIdentity{Prefix: netip.PrefixFrom(p.IP, p.IP.BitLen()), Identity: id}
			if !p.Local {
				entry.Tunnel = tunnels[p.Pod.Spec.NodeName]
			}
			c.res.State.IPCache = append(c.res.State.IPCache, entry)
			c.res.podByIP[p.IP] = p.key()
		}
		if p.Local && p.IP.IsValid() {
			c.localByKey[p.key()] = p
			c.res.Endpoints[p.key()] = EndpointPolicy{Pod: p.key(), IP: p.IP, Identity: id}
		}
	}
	for _, a := range c.in.HostAddrs {
		if _, isPod := c.res.podByIP[a]; isPod || c.res.hostAddrs[a] {
			continue
		}
		c.res.hostAddrs[a] = true
		c.res.State.IPCache = append(c.res.State.IPCache, PrefixIdentity{
			Prefix: netip.PrefixFrom(a, a.BitLen()), Identity: IdentityHost})
	}
	c.remoteNodeAddrs(tunnels)
	c.res.Alloc.Identities = alloc.next
	c.podIDs = slices.Sorted(maps.Keys(c.identities))
	for _, id := range c.podIDs {
		c.res.Identities = append(c.res.Identities, *c.identities[id])
	}
}

// allocateCIDRs gives every prefix a policy names (cidr and except) an
// identity, and indexes them so a block finds the prefixes inside it.
func (c *computation) allocateCIDRs(prev Allocations) {
	seen := map[netip.Prefix]bool{}
	// add records an IPv4 prefix; an IPv6 one is a problem of its policy,
	// and the rule naming it matches no peer through it (shunt forwards no
	// IPv6, so nothing is let through or kept out that would not be).
	add := func(kind, ns, name, s string) {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
		case !p.Addr().Is4():
			c.problem(kind, ns, name, "IPv6NotSupported", "ipBlock %s: shunt enforces IPv4 only; the rule matches no peer through this block", s)
		default:
			seen[p.Masked()] = true
		}
	}
	addBlocks := func(np *networkingv1.NetworkPolicy, peers []networkingv1.NetworkPolicyPeer) {
		for _, pe := range peers {
			if pe.IPBlock != nil {
				add("NetworkPolicy", np.Namespace, np.Name, pe.IPBlock.CIDR)
				for _, e := range pe.IPBlock.Except {
					add("NetworkPolicy", np.Namespace, np.Name, e)
				}
			}
		}
	}
	for _, np := range c.in.NetworkPolicies {
		for _, r := range np.Spec.Ingress {
			addBlocks(np, r.From)
		}
		for _, r := range np.Spec.Egress {
			addBlocks(np, r.To)
		}
	}
	for _, sp := range c.in.ShuntPolicies {
		for _, rules := range [][]manifest.ShuntRule{sp.Spec.Ingress, sp.Spec.Egress} {
			for _, r := range rules {
				for _, pe := range r.Peers {
					if pe.CIDR != "" {
						add("ShuntNetworkPolicy", sp.Namespace, sp.Name, pe.CIDR)
						for _, e := range pe.Except {
							add("ShuntNetworkPolicy", sp.Namespace, sp.Name, e)
						}
					}
				}
			}
		}
	}
	prefixes := slices.SortedFunc(maps.Keys(seen), comparePrefixes)
	alloc := newAllocator(prev.CIDRs, FirstCIDRIdentity)
	for _, p := range prefixes {
		id := alloc.get(p.String())
		c.cidrByID[id] = p
		c.cidrSorted = append(c.cidrSorted, CIDRIdentity{ID: id, Prefix: p})
		c.res.State.CIDRIdentities = append(c.res.State.CIDRIdentities, PrefixIdentity{Prefix: p, Identity: id})
	}
	c.res.Alloc.CIDRs = alloc.next
	c.res.CIDRs = slices.Clone(c.cidrSorted)
	slices.SortFunc(c.res.CIDRs, func(a, b CIDRIdentity) int { return int(a.ID) - int(b.ID) })
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// blockIdentities are the CIDR identities an address block (cidr minus
// excepts) selects: prefixes inside cidr and inside no except. The ipcache
// answers an address with its longest policy prefix, and that prefix lies
// inside the block exactly when the address does.
func (c *computation) blockIdentities(cidr string, except []string) []uint32 {
	block, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil
	}
	block = block.Masked()
	var excepts []netip.Prefix
	for _, e := range except {
		if p, err := netip.ParsePrefix(e); err == nil {
			excepts = append(excepts, p.Masked())
		}
	}
	// Prefixes inside block start at or after its address: binary search,
	// then walk while they still start inside it.
	i := sort.Search(len(c.cidrSorted), func(i int) bool {
		return comparePrefixes(c.cidrSorted[i].Prefix, block) >= 0
	})
	var out []uint32
	for ; i < len(c.cidrSorted) && block.Contains(c.cidrSorted[i].Prefix.Addr()); i++ {
		p := c.cidrSorted[i].Prefix
		if p.Bits() < block.Bits() {
			continue
		}
		if slices.ContainsFunc(excepts, func(e netip.Prefix) bool { return e.Bits() <= p.Bits() && e.Contains(p.Addr()) }) {
			continue
		}
		out = append(out, c.cidrSorted[i].ID)
	}
	return out
}

// selector turns a validated label selector into a matcher; manifests are
// validated before they reach here, so an error selects nothing.
func selector(s *metav1.LabelSelector) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return labels.Nothing()
	}
	return sel
}

// podIdentitiesMatching: identities of pods whose namespace matches nsSel
// (nil: only policyNS) and whose labels match podSel (nil: all).
func (c *computation) podIdentitiesMatching(policyNS string, podSel, nsSel *metav1.LabelSelector) []uint32 {
	var ps, nss labels.Selector
	if podSel != nil {
		ps = selector(podSel)
	}
	if nsSel != nil {
		nss = selector(nsSel)
	}
	var out []uint32
	for _, id := range c.podIDs {
		ident := c.identities[id]
		if nss == nil && ident.Namespace != policyNS {
			continue
		}
		if nss != nil && !nss.Matches(labels.Set(ident.NamespaceLabels)) {
			continue
		}
		if ps != nil && !ps.Matches(labels.Set(ident.Labels)) {
			continue
		}
		out = append(out, id)
	}
	return out
}

// selectedLocalPods are the local pods in ns whose labels match sel.
func (c *computation) selectedLocalPods(ns string, sel metav1.LabelSelector) []Pod {
	s := selector(&sel)
	var out []Pod
	for _, key := range slices.Sorted(maps.Keys(c.localByKey)) {
		p := c.localByKey[key]
		if p.Pod.Namespace == ns && s.Matches(labels.Set(p.Pod.Labels)) {
			out = append(out, p)
		}
	}
	return out
}

func (c *computation) isolate(p Pod, egress bool, by string) {
	ep := c.res.Endpoints[p.key()]
	if egress {
		if !slices.Contains(ep.EgressIsolatedBy, by) {
			ep.EgressIsolatedBy = append(ep.EgressIsolatedBy, by)
		}
	} else if !slices.Contains(ep.IngressIsolatedBy, by) {
		ep.IngressIsolatedBy = append(ep.IngressIsolatedBy, by)
	}
	c.res.Endpoints[p.key()] = ep
}

func (c *computation) rule(kind, ns, name, dir string, index int, action string) uint32 {
	id := c.rules.get(fmt.Sprintf("%s/%s/%s/%s/%d", kind, ns, name, dir, index))
	c.res.Rules[id] = Rule{ID: id, Kind: kind, Namespace: ns, Name: name, Direction: dir, Index: index, Action: action}
	return id
}

// put records one entry; a deny replaces an allow for the same key, and
// among equal verdicts the rule with the lower id stays (deterministic).
func (c *computation) put(k Key, v Verdict, rule uint32) {
	k = k.Canonical()
	old, ok := c.entries[k]
	if ok && (old.verdict == VerdictDeny && v == VerdictAllow ||
		old.verdict == v && old.rule <= rule) {
		return
	}
	c.entries[k] = entryValue{v, rule}
}

// finish adds the node's built-in ingress allow, drops allows a deny of the
// same peer covers (the LPM lookup would otherwise prefer a narrower allow
// over a broader deny), sets isolation, and lays the entries out sorted.
func (c *computation) finish() {
	for _, ep := range c.res.Endpoints {
		if len(ep.IngressIsolatedBy) > 0 {
			c.put(Key{Endpoint: ep.IP, Identity: IdentityHost}, VerdictAllow, RuleNode)
		}
	}
	type group struct {
		ep       netip.Addr
		egress   bool
		identity uint32
	}
	denies := map[group][]Key{}
	for k, v := range c.entries {
		if v.verdict == VerdictDeny {
			g := group{k.Endpoint, k.Egress, k.Identity}
			denies[g] = append(denies[g], k)
		}
	}
	for k, v := range c.entries {
		if v.verdict != VerdictAllow {
			continue
		}
		if slices.ContainsFunc(denies[group{k.Endpoint, k.Egress, k.Identity}], func(d Key) bool { return covers(d, k) }) {
			delete(c.entries, k)
		}
	}
	type directions struct{ ingress, egress bool }
	withRules := map[netip.Addr]directions{}
	for _, k := range slices.SortedFunc(maps.Keys(c.entries), Key.Compare) {
		v := c.entries[k]
		c.res.State.Entries = append(c.res.State.Entries, Entry{Key: k, Verdict: v.verdict, RuleID: v.rule})
		has := withRules[k.Endpoint]
		if k.Egress {
			has.egress = true
		} else {
			has.ingress = true
		}
		withRules[k.Endpoint] = has
	}
	for key, ep := range c.res.Endpoints {
		ep.IngressRules, ep.EgressRules = withRules[ep.IP].ingress, withRules[ep.IP].egress
		slices.Sort(ep.IngressIsolatedBy)
		slices.Sort(ep.EgressIsolatedBy)
		c.res.Endpoints[key] = ep
	}
}

// covers says whether every packet key a matches also matches d.
func covers(d, a Key) bool {
	if d.Proto == 0 {
		return true
	}
	return d.Proto == a.Proto && d.PortBits <= a.PortBits && portInPrefix(a.Port, d.Port, d.PortBits)
}

func portInPrefix(port, prefix uint16, bits uint8) bool {
	if bits == 0 {
		return true
	}
	mask := ^uint16(0) << (16 - bits)
	return port&mask == prefix&mask
}

// Endpoint is the policy summary of a local pod for its datapath endpoint:
// its identity, and what isolates it (a pod no policy selects has only its
// identity).
func (r *Result) Endpoint(podKey string) EndpointPolicy {
	ep, ok := r.Endpoints[podKey]
	if !ok {
		return EndpointPolicy{Pod: podKey, Identity: r.podIdentity[podKey]}
	}
	return ep
}
