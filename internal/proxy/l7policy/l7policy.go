// Package l7policy decides one HTTP request against the L7 view of a pod
// port's ingress policy (proxyapi.PortPolicy): the node proxy asks it for
// every request it forwards to such a port, and `shunt policy trace` can ask
// it the same question without a proxy. It is pure: compile once per
// configuration, decide many times.
package l7policy

import (
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// Peer is the client as the policy sees it.
type Peer struct {
	Identity uint32
	// CIDRIdentity is the identity of the longest policy prefix holding IP
	// (0: none), as the datapath's CIDR lookup answers: rules naming address
	// blocks list it among their identities.
	CIDRIdentity uint32
	IP           netip.Addr
}

// Request is what HTTP rules look at.
type Request struct {
	Method string
	Path   string
	Header http.Header
}

// Drop reasons, as the datapath names the same outcomes at L3/L4.
const (
	ReasonDenied     = "policy-denied"      // a deny rule matched
	ReasonNotAllowed = "policy-not-allowed" // the port is isolated and no allow rule matched
)

// Decision is the outcome for one request.
type Decision struct {
	Allowed bool
	// Rule is the rule that decided (empty when none did: a request no rule
	// matches on a port that is not isolated, or no allow rule matched).
	Rule string
	// DropReason is ReasonDenied or ReasonNotAllowed when not allowed.
	DropReason string
	// Explanation is one line saying why, for a 403 body or a trace.
	Explanation string
}

// Port is a compiled PortPolicy.
type Port struct {
	isolated bool
	rules    []rule
}

type rule struct {
	name       string
	builtin    bool // the node's rule: not named among the policies
	deny       bool
	anyPeer    bool
	identities []uint32 // sorted
	cidrs      []netip.Prefix
	except     []netip.Prefix
	http       []httpRule // nil: every request of the peer
}

type httpRule struct {
	method  string
	path    *regexp.Regexp // nil: any path
	headers map[string]string
}

// Compile checks a port policy and prepares it; errors name the field
// (rules[1].http[0].path) so the agent's author can find it.
func Compile(pp proxyapi.PortPolicy) (*Port, error) {
	p := &Port{isolated: pp.Isolated}
	for i, r := range pp.Rules {
		field := fmt.Sprintf("rules[%d]", i)
		c := rule{name: r.Name, builtin: r.Builtin, anyPeer: r.AnyPeer, identities: slices.Sorted(slices.Values(r.Identities))}
		switch r.Action {
		case proxyapi.ActionAllow:
		case proxyapi.ActionDeny:
			c.deny = true
		default:
			return nil, fmt.Errorf("%s.action: %q is neither %q nor %q", field, r.Action, proxyapi.ActionAllow, proxyapi.ActionDeny)
		}
		if r.Name == "" {
			return nil, fmt.Errorf("%s.name: required (it names the rule in 403 answers and flows)", field)
		}
		var err error
		if c.cidrs, err = prefixes(r.CIDRs, field+".cidrs"); err != nil {
			return nil, err
		}
		if c.except, err = prefixes(r.Except, field+".except"); err != nil {
			return nil, err
		}
		for j, h := range r.HTTP {
			hr, err := compileHTTP(h, fmt.Sprintf("%s.http[%d]", field, j))
			if err != nil {
				return nil, err
			}
			c.http = append(c.http, hr)
		}
		p.rules = append(p.rules, c)
	}
	return p, nil
}

func prefixes(in []string, field string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range in {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %q is not a CIDR like 10.0.0.0/8: %v", field, i, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func compileHTTP(h proxyapi.HTTPRule, field string) (httpRule, error) {
	hr := httpRule{method: strings.ToUpper(h.Method), headers: map[string]string{}}
	if h.Path != "" {
		if _, err := regexp.Compile(h.Path); err != nil { // the error quotes the expression as written
			return hr, fmt.Errorf("%s.path: %q is not an RE2 regular expression: %v", field, h.Path, err)
		}
		// The rule's path is over the whole path: anchor it, so "/api" does
		// not also allow "/api/admin" or "/x/api".
		hr.path = regexp.MustCompile(`^(?:` + h.Path + `)$`)
	}
	for name, v := range h.Headers {
		if name == "" {
			return hr, fmt.Errorf("%s.headers: a header name is empty", field)
		}
		hr.headers[http.CanonicalHeaderKey(name)] = v
	}
	return hr, nil
}

// Decide says whether the policy lets peer make req: a matching deny rule
// denies; otherwise a matching allow rule allows; otherwise the request is
// denied if the port is isolated and allowed if not.
func (p *Port) Decide(peer Peer, req Request) Decision {
	for _, r := range p.rules {
		if r.deny && r.matches(peer, req) {
			return Decision{Rule: r.name, DropReason: ReasonDenied,
				Explanation: fmt.Sprintf("%s %s denied by %s", req.Method, req.Path, r.name)}
		}
	}
	for _, r := range p.rules {
		if !r.deny && r.matches(peer, req) {
			return Decision{Allowed: true, Rule: r.name, Explanation: fmt.Sprintf("%s %s allowed by %s", req.Method, req.Path, r.name)}
		}
	}
	if !p.isolated {
		return Decision{Allowed: true, Explanation: "no deny rule matches and no policy isolates the port"}
	}
	return Decision{DropReason: ReasonNotAllowed,
		Explanation: fmt.Sprintf("no rule of %s allows %s %s", p.policies(), req.Method, req.Path)}
}

func (r *rule) matches(peer Peer, req Request) bool {
	if !r.matchesPeer(peer) {
		return false
	}
	if r.http == nil {
		return true
	}
	return slices.ContainsFunc(r.http, func(h httpRule) bool { return h.matches(req) })
}

// matchesPeer looks the peer up as the datapath does: any peer, its
// identity, the identity of the policy prefix holding its address; and by
// address for blocks given as CIDRs.
func (r *rule) matchesPeer(peer Peer) bool {
	if r.anyPeer {
		return true
	}
	if _, ok := slices.BinarySearch(r.identities, peer.Identity); ok {
		return true
	}
	if _, ok := slices.BinarySearch(r.identities, peer.CIDRIdentity); ok && peer.CIDRIdentity != 0 {
		return true
	}
	if !peer.IP.IsValid() {
		return false
	}
	in := func(p netip.Prefix) bool { return p.Contains(peer.IP.Unmap()) }
	return slices.ContainsFunc(r.cidrs, in) && !slices.ContainsFunc(r.except, in)
}

func (h *httpRule) matches(req Request) bool {
	if h.method != "" && h.method != strings.ToUpper(req.Method) {
		return false
	}
	if h.path != nil && !h.path.MatchString(req.Path) {
		return false
	}
	for name, want := range h.headers {
		if !slices.Contains(req.Header.Values(name), want) {
			return false
		}
	}
	return true
}

// policies names the policies of the allow rules, for "no rule of ...
// allows": rule names read "Kind ns/name ingress[0] (allow)".
func (p *Port) policies() string {
	var names []string
	for _, r := range p.rules {
		if r.deny || r.builtin {
			continue
		}
		name := r.name
		if i := strings.LastIndex(name, " ingress["); i > 0 {
			name = name[:i]
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "the policies isolating the port (none allows anything here)"
	}
	return strings.Join(names, ", ")
}
