package agent

import (
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/l7"
	"github.com/shuntnet/shunt/internal/meshroute"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/proxy/l7policy"
	"github.com/shuntnet/shunt/internal/services"
)

// Warnings are what the last policy computation wants the user to know.
func (a *Agent) Warnings() []string {
	var out []string
	for _, p := range a.problems() {
		out = append(out, p.String())
	}
	return out
}

// problems are what the objects ask that shunt leaves out, and a policy
// the node could not program at all (a problem of the Node: the previous
// policy stays in force).
func (a *Agent) problems() []policy.Problem {
	var out []policy.Problem
	if pol := a.rec.Policy(); pol != nil {
		out = append(out, pol.Problems...)
	}
	out = append(out, a.serviceProblems.of(a.objects(), a.serviceProblemNode())...)
	out = append(out, a.hostPortProblems.of(a.objects(), a.nodeName, a.overlayEndpoint())...)
	out = append(out, a.routeProblems.of(a.objects())...)
	out = append(out, a.maglevProblems()...)
	if err := a.rec.PolicyError(); err != nil {
		out = append(out, policy.Problem{Kind: "Node", Name: a.nodeName, Reason: "PolicyNotProgrammed",
			Message: err.Error() + "; the previous policy stays in force"})
	}
	for _, nr := range a.rec.UnreachableNodes() {
		out = append(out, policy.Problem{Kind: "Node", Name: nr.Node, Reason: "NodeNotRoutable",
			Message: fmt.Sprintf("native routing: node %s cannot route to its pods %s via %s, which is not on its underlay's network "+
				"(a next hop it reaches directly); put the nodes on one network or use the overlay (--tunnel vxlan)", a.nodeName, nr.PodCIDR, nr.Tunnel)})
	}
	return out
}

// serviceProblemsCache holds the problems of one generation of Services:
// the event reporter and the policy status ask every second, and listing
// 10 000 Services each time was most of an idle agent's allocations.
type serviceProblemsCache struct {
	mu  sync.Mutex
	gen uint64 // model.Store.ServicesGeneration of out; 0: none yet
	out []policy.Problem
}

// serviceProblemNode is what of the node, fixed for its life, makes a
// Service's problems here: noDSR (dsrUnavailable) says why a Service
// asking for DSR is SNATed here; tunnel (overlayEndpoint) and
// nodePortAddrs (where the node serves NodePorts) which frontends the
// overlay's endpoint hides.
type serviceProblemNode struct {
	noDSR         string
	tunnel        netip.AddrPort
	nodePortAddrs []netip.Addr
}

func (a *Agent) serviceProblemNode() serviceProblemNode {
	node := services.Node{NodePortAddrs: a.nodePortAddrs(), NodePortAddresses: a.cfg.NodePortAddresses}
	return serviceProblemNode{noDSR: a.dsrUnavailable(), tunnel: a.overlayEndpoint(), nodePortAddrs: node.NodePortFrontendAddrs()}
}

// of lists them as they are on node.
func (c *serviceProblemsCache) of(store *model.Store, node serviceProblemNode) []policy.Problem {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen := store.ServicesGeneration(); gen != c.gen {
		c.gen, c.out = gen, nil
		for _, svc := range store.Services() {
			issues := services.Unsupported(svc)
			if node.noDSR != "" {
				issues = append(issues, services.ForwardingIssues(svc, node.noDSR)...)
			}
			issues = append(issues, services.TunnelPortIssues(svc, node.tunnel, node.nodePortAddrs)...)
			for _, is := range issues {
				c.out = append(c.out, policy.Problem{Kind: "Service", Namespace: svc.Namespace, Name: svc.Name, Reason: is.Reason, Message: is.Message})
			}
		}
	}
	return c.out
}

// hostPortProblemsCache holds the hostPort problems of the pods of this
// node in one store (the pods' node reports them: hostPort is the node's
// business).
type hostPortProblemsCache struct {
	mu    sync.Mutex
	store *model.Store
	out   []policy.Problem
}

// of lists them for node, whose overlay endpoint is tunnel (zero: none).
func (c *hostPortProblemsCache) of(store *model.Store, node string, tunnel netip.AddrPort) []policy.Problem {
	c.mu.Lock()
	defer c.mu.Unlock()
	if store != c.store {
		c.store, c.out = store, nil
		for _, p := range store.Pods() {
			if p.Spec.NodeName != node {
				continue
			}
			for _, is := range append(services.HostPortIssues(p), services.TunnelHostPortIssues(p, node, tunnel)...) {
				c.out = append(c.out, policy.Problem{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, Reason: is.Reason, Message: is.Message})
			}
		}
	}
	return c.out
}

// routeProblemsCache holds the problems of the HTTPRoutes and GRPCRoutes
// of one store: rules with a match the proxy cannot compile (dropped) or
// a filter it will not apply (answered 500): l7.InvalidRules.
type routeProblemsCache struct {
	mu    sync.Mutex
	store *model.Store
	out   []policy.Problem
}

func (c *routeProblemsCache) of(store *model.Store) []policy.Problem {
	c.mu.Lock()
	defer c.mu.Unlock()
	if store != c.store {
		c.store, c.out = store, nil
		for _, mr := range meshroute.Routes(store.HTTPRoutes(), store.GRPCRoutes()) {
			if rules, problems := l7.InvalidRules(mr.HTTPRoute); len(rules) > 0 {
				c.out = append(c.out, policy.Problem{Kind: mr.Kind, Namespace: mr.HTTPRoute.Namespace, Name: mr.HTTPRoute.Name, Reason: "InvalidRouteRule",
					Message: "a match the proxy cannot compile (the rule matches nothing) or a filter it will not apply (the rule answers 500): " + strings.Join(problems, "; ")})
			}
		}
	}
	return c.out
}

func (a *Agent) handleIdentities(w http.ResponseWriter, r *http.Request) {
	out := slices.Clone(policy.ReservedIdentities)
	if pol := a.rec.Policy(); pol != nil {
		out = append(out, pol.Identities...)
		for _, c := range pol.CIDRs {
			out = append(out, policy.Identity{ID: c.ID, Reserved: "cidr:" + c.Prefix.String()})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// parsePeer reads a trace end: ns/name, a pod name in the default
// namespace, or an IP address.
func parsePeer(s string) policy.Peer {
	if ip, err := netip.ParseAddr(s); err == nil {
		return policy.Peer{IP: ip}
	}
	if !strings.Contains(s, "/") {
		s = model.DefaultNamespace + "/" + s
	}
	return policy.Peer{Pod: s}
}

// ParsePortProto reads "80", "80/tcp", "53/udp", "icmp".
func ParsePortProto(s string) (proto uint8, port uint16, err error) {
	num, name, _ := strings.Cut(strings.ToLower(s), "/")
	if num == "icmp" {
		return 1, 0, nil
	}
	protos := map[string]uint8{"": 6, "tcp": 6, "udp": 17, "sctp": 132}
	proto, ok := protos[name]
	if !ok {
		return 0, 0, fmt.Errorf("unknown protocol %q in %q: use tcp, udp or sctp (e.g. 53/udp)", name, s)
	}
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return 0, 0, fmt.Errorf("bad port %q in %q: want 1-65535, e.g. 80/tcp", num, s)
	}
	return proto, uint16(n), nil
}

func (a *Agent) handleTrace(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	proto, port, err := ParsePortProto(q.Get("port"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	// The ends are checked before the policy: an unknown pod is named as
	// such whether or not a policy was computed yet.
	store := a.objects()
	var peers [2]policy.Peer
	for i, s := range []string{q.Get("from"), q.Get("to")} {
		if s == "" {
			writeError(w, http.StatusBadRequest, fmt.Errorf("trace needs --from and --to"))
			return
		}
		peers[i] = parsePeer(s)
		if p := peers[i]; p.Pod != "" {
			if _, ok := store.Pod(model.SplitName(p.Pod)); !ok {
				writeError(w, http.StatusNotFound, fmt.Errorf("pod %s not found (give ns/name, a pod of the default namespace, or an IP)", p.Pod))
				return
			}
		}
	}
	pol := a.rec.Policy()
	if pol == nil {
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("no policy computed yet"))
		return
	}
	var ends [2]policy.Peer
	for i, p := range peers {
		if ends[i], err = pol.Resolve(p); err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
	}
	t := pol.Trace(ends[0], ends[1], proto, port)
	if method, path := q.Get("http-method"), q.Get("http-path"); (method != "" || path != "") && t.Verdict == "allowed" {
		if err := traceHTTP(&t, pol, method, path); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, t)
}

// traceHTTP adds the node proxy's decision on one request to a connection
// trace, when HTTP rules name the destination port: the same compiled
// rules the proxy runs.
func traceHTTP(t *policy.Trace, pol *policy.Result, method, path string) error {
	if method == "" {
		method = "GET"
	}
	if path == "" {
		path = "/"
	}
	i := slices.IndexFunc(pol.L7, func(lp policy.L7Port) bool { return lp.Endpoint == t.To.IP && lp.Port == t.Port })
	if i < 0 || t.Proto != 6 {
		t.Steps = append(t.Steps, policy.Step{Direction: "http", Pod: t.To.Pod, Verdict: "allow",
			Explanation: "no HTTP rule names this port: the connection is not sent to the proxy"})
		return nil
	}
	port, err := l7policy.Compile(l7.PortPolicy(pol.L7[i], pol))
	if err != nil {
		return err
	}
	peer := l7policy.Peer{Identity: pol.IdentityOf(t.From), CIDRIdentity: pol.CIDRIdentityOf(t.From.IP), IP: t.From.IP}
	d := port.Decide(peer, l7policy.Request{Method: strings.ToUpper(method), Path: path, Header: http.Header{}})
	step := policy.Step{Direction: "http", Pod: t.To.Pod, PeerIdentity: peer.Identity, Verdict: "allow", Explanation: d.Explanation}
	if !d.Allowed {
		step.Verdict = "deny"
		t.Verdict, t.Reason = "denied", d.DropReason
	}
	t.Steps = append(t.Steps, step)
	return nil
}

// handlePolicyMap decodes what the kernel's policy map holds for one pod,
// named with the agent's identities and rules.
func (a *Agent) handlePolicyMap(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("pod")
	if name == "" {
		writeError(w, http.StatusBadRequest, fmt.Errorf("a policy map dump needs a pod (ns/name, or a pod of the default namespace)"))
		return
	}
	p := parsePeer(name)
	if p.Pod == "" {
		writeError(w, http.StatusBadRequest, fmt.Errorf("%s is an address: give the pod (ns/name, or a pod of the default namespace)", name))
		return
	}
	pod, ok := a.objects().Pod(model.SplitName(p.Pod))
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Errorf("pod %s not found", p.Pod))
		return
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("pod %s has no address yet", p.Pod))
		return
	}
	pol := a.rec.Policy()
	if pol == nil {
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("no policy computed yet"))
		return
	}
	entries, err := a.dp.PolicyEntries()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	ep := pol.Endpoint(p.Pod)
	out := api.PolicyMap{Pod: p.Pod, IP: ip.String(), Identity: ep.Identity,
		IngressIsolatedBy: ep.IngressIsolatedBy, EgressIsolatedBy: ep.EgressIsolatedBy, Entries: []api.PolicyMapEntry{}}
	names := identityNames(pol)
	for _, e := range entries {
		if e.Endpoint != ip {
			continue
		}
		me := api.PolicyMapEntry{Direction: "ingress", Identity: e.Identity, Peer: names[e.Identity],
			Ports: datapath.PortsText(e.Key), Verdict: e.Verdict.String(), RuleID: e.RuleID}
		if e.Egress {
			me.Direction = "egress"
		}
		if rule, ok := pol.Rules[e.RuleID]; ok {
			me.Rule = rule.String()
		}
		out.Entries = append(out.Entries, me)
	}
	writeJSON(w, http.StatusOK, out)
}

// identityNames describes every identity: labels of a pod identity, the
// prefix of a CIDR identity, the reserved names.
func identityNames(pol *policy.Result) map[uint32]string {
	names := map[uint32]string{policy.IdentityAny: "any"}
	for _, r := range policy.ReservedIdentities {
		names[r.ID] = r.Reserved
	}
	for _, id := range pol.Identities {
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(id.Labels)) {
			labels = append(labels, k+"="+id.Labels[k])
		}
		names[id.ID] = fmt.Sprintf("ns=%s %s", id.Namespace, strings.Join(labels, ","))
	}
	for _, c := range pol.CIDRs {
		names[c.ID] = "cidr " + c.Prefix.String()
	}
	return names
}

// maglevProblems are the Services whose Maglev table has fewer than 100
// slots per backend on this node (shuntd --maglev-table-size).
func (a *Agent) maglevProblems() []policy.Problem {
	if a.dp == nil {
		return nil
	}
	var out []policy.Problem
	for _, w := range a.dp.MaglevWarnings() {
		// The port's name is "namespace/name:port".
		ns, rest, _ := strings.Cut(w.Port, "/")
		name, port, _ := strings.Cut(rest, ":")
		out = append(out, policy.Problem{Kind: "Service", Namespace: ns, Name: name, Reason: "MaglevTableSmall",
			Message: fmt.Sprintf("port %s: %s", port, w.Message)})
	}
	return out
}
