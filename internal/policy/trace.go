package policy

import (
	"fmt"
	"net/netip"
)

// Peer is one end of a traced connection: a pod (ns/name) or an address.
type Peer struct {
	Pod string     `json:"pod,omitempty"`
	IP  netip.Addr `json:"ip"`
}

// Step is one policy decision on the way: the sender's egress or the
// receiver's ingress.
type Step struct {
	Direction    string   `json:"direction"` // egress, ingress
	Pod          string   `json:"pod"`
	IsolatedBy   []string `json:"isolatedBy,omitempty"`
	PeerIdentity uint32   `json:"peerIdentity"`
	PeerCIDR     uint32   `json:"peerCIDRIdentity,omitempty"`
	Verdict      string   `json:"verdict"` // allow, deny
	Rule         *Rule    `json:"rule,omitempty"`
	Explanation  string   `json:"explanation"`
}

// Trace is the verdict for a new connection and why.
type Trace struct {
	From    Peer   `json:"from"`
	To      Peer   `json:"to"`
	Proto   uint8  `json:"proto"`
	Port    uint16 `json:"port"`
	Verdict string `json:"verdict"`          // allowed, denied
	Reason  string `json:"reason,omitempty"` // the drop reason the datapath counts
	Steps   []Step `json:"steps"`
}

// Resolve completes a peer given by pod or by address.
func (r *Result) Resolve(p Peer) (Peer, error) {
	if p.Pod != "" {
		ep, ok := r.Endpoints[p.Pod]
		if ok {
			return Peer{Pod: p.Pod, IP: ep.IP}, nil
		}
		for ip, key := range r.podByIP {
			if key == p.Pod {
				return Peer{Pod: p.Pod, IP: ip}, nil
			}
		}
		return p, fmt.Errorf("pod %s has no address (is it applied?)", p.Pod)
	}
	if key, ok := r.podByIP[p.IP]; ok {
		return Peer{Pod: key, IP: p.IP}, nil
	}
	return p, nil
}

// IdentityOf is the identity the datapath gives a peer.
func (r *Result) IdentityOf(p Peer) uint32 { return r.identityOf(p) }

// identityOf is what the datapath's ipcache answers for an address.
func (r *Result) identityOf(p Peer) uint32 {
	if p.Pod != "" {
		return r.podIdentity[p.Pod]
	}
	if r.hostAddrs[p.IP] {
		return IdentityHost
	}
	if r.remoteNodes[p.IP] {
		return IdentityRemoteNode
	}
	return IdentityWorld
}

// cidrIdentityOf is the identity of the longest policy prefix holding ip.
func (r *Result) cidrIdentityOf(ip netip.Addr) uint32 {
	best, id := -1, uint32(0)
	for _, c := range r.State.CIDRIdentities {
		if c.Prefix.Contains(ip) && c.Prefix.Bits() > best {
			best, id = c.Prefix.Bits(), c.Identity
		}
	}
	return id
}

// lookup does what one BPF LPM lookup in shunt_policy does: the matching
// entry with the longest prefix.
func (r *Result) lookup(ep netip.Addr, egress bool, identity uint32, proto uint8, port uint16) (Verdict, uint32) {
	best, verdict, rule := -1, VerdictNone, uint32(0)
	for _, e := range r.State.Entries {
		if e.Endpoint != ep || e.Egress != egress || e.Identity != identity {
			continue
		}
		plen := PrefixFixed
		if e.Proto != 0 {
			if e.Proto != proto || !portInPrefix(port, e.Port, e.PortBits) {
				continue
			}
			plen = PrefixProto + int(e.PortBits)
		}
		if plen > best {
			best, verdict, rule = plen, e.Verdict, e.RuleID
		}
	}
	return verdict, rule
}

// verdict combines the three lookups as the datapath does: by identity, by
// CIDR identity, as any peer; a deny from any wins, then an allow.
func (r *Result) verdict(ep netip.Addr, egress bool, peer, cidr uint32, proto uint8, port uint16) (Verdict, uint32) {
	type hit struct {
		v    Verdict
		rule uint32
	}
	ids := []uint32{peer, cidr, IdentityAny}
	if cidr == 0 { // no policy prefix holds the address: the datapath skips that lookup
		ids = []uint32{peer, IdentityAny}
	}
	var hits []hit
	for _, id := range ids {
		v, rule := r.lookup(ep, egress, id, proto, port)
		hits = append(hits, hit{v, rule})
	}
	for _, want := range []Verdict{VerdictDeny, VerdictAllow} {
		for _, h := range hits {
			if h.v == want {
				return h.v, h.rule
			}
		}
	}
	return VerdictNone, 0
}

// Trace explains whether a new connection from one peer to another on
// proto/port is admitted, from the computed entries the datapath holds.
func (r *Result) Trace(from, to Peer, proto uint8, port uint16) Trace {
	t := Trace{From: from, To: to, Proto: proto, Port: port, Verdict: "allowed"}
	if !hasPorts(proto) {
		port = 0
	}
	step := func(dir string, local Peer, peer Peer) bool {
		ep, ok := r.Endpoints[local.Pod]
		if local.Pod == "" || !ok {
			return true
		}
		egress := dir == "egress"
		s := Step{Direction: dir, Pod: local.Pod, PeerIdentity: r.identityOf(peer), PeerCIDR: r.cidrIdentityOf(peer.IP)}
		var hasRules bool
		s.IsolatedBy, hasRules = ep.IngressIsolatedBy, ep.IngressRules
		if egress {
			s.IsolatedBy, hasRules = ep.EgressIsolatedBy, ep.EgressRules
		}
		if len(s.IsolatedBy) == 0 && !hasRules {
			s.Verdict, s.Explanation = "allow", fmt.Sprintf("no policy selects %s for %s: not isolated", local.Pod, dir)
			t.Steps = append(t.Steps, s)
			return true
		}
		v, ruleID := r.verdict(ep.IP, egress, s.PeerIdentity, s.PeerCIDR, proto, port)
		if v == VerdictNone && len(s.IsolatedBy) == 0 {
			s.Verdict = "allow"
			s.Explanation = fmt.Sprintf("no deny rule matches, and no policy isolates %s for %s", local.Pod, dir)
			t.Steps = append(t.Steps, s)
			return true
		}
		if rule, ok := r.Rules[ruleID]; ok && v != VerdictNone {
			s.Rule = &rule
		}
		switch v {
		case VerdictAllow:
			s.Verdict, s.Explanation = "allow", "allowed by "+s.Rule.String()
		case VerdictDeny:
			s.Verdict, s.Explanation = "deny", "denied by "+s.Rule.String()
			t.Verdict, t.Reason = "denied", "policy-denied"
		default:
			s.Verdict = "deny"
			s.Explanation = fmt.Sprintf("no rule allows it; %s is isolated for %s by %v", local.Pod, dir, s.IsolatedBy)
			t.Verdict, t.Reason = "denied", "policy-not-allowed"
		}
		t.Steps = append(t.Steps, s)
		return v == VerdictAllow
	}
	if step("egress", from, to) {
		step("ingress", to, from)
	}
	return t
}

func hasPorts(proto uint8) bool { return proto == 6 || proto == 17 || proto == 132 }
