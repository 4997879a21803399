package l7policy

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

const (
	frontend   = 1001
	monitoring = 1002
	intruder   = 1003
	cidrID     = 1<<24 + 5
)

// backendPolicy reads like testdata/l7.yaml's backend-http: monitoring may
// do anything, frontend only GET /metrics with the right header or GET
// /public/..., nobody may DELETE, and an address block may GET /health.
func backendPolicy(t *testing.T, isolated bool) *Port {
	t.Helper()
	p, err := Compile(proxyapi.PortPolicy{Endpoint: "10.0.0.5", Port: 8080, Isolated: isolated, Rules: []proxyapi.L7Rule{
		{Name: "ShuntNetworkPolicy default/backend-http ingress[0] (allow)", Action: "allow", Identities: []uint32{frontend},
			HTTP: []proxyapi.HTTPRule{
				{Method: "GET", Path: "/metrics", Headers: map[string]string{"X-Scraper": "yes"}},
				{Method: "GET", Path: "/public/.*"},
			}},
		{Name: "ShuntNetworkPolicy default/backend-http ingress[1] (allow)", Action: "allow", Identities: []uint32{monitoring}},
		{Name: "ShuntNetworkPolicy default/backend-http ingress[2] (allow)", Action: "allow",
			CIDRs: []string{"192.168.0.0/16"}, Except: []string{"192.168.9.0/24"},
			HTTP: []proxyapi.HTTPRule{{Method: "GET", Path: "/health"}}},
		{Name: "ShuntNetworkPolicy default/no-delete ingress[0] (deny)", Action: "deny", AnyPeer: true,
			HTTP: []proxyapi.HTTPRule{{Method: "DELETE"}}},
		{Name: "NetworkPolicy default/blocks ingress[0] (allow)", Action: "allow", Identities: []uint32{cidrID},
			HTTP: []proxyapi.HTTPRule{{Path: "/blocks"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecideMethodPathHeadersAndPeers(t *testing.T) {
	p := backendPolicy(t, true)
	scraper := http.Header{"X-Scraper": {"no", "yes"}}
	cases := []struct {
		name   string
		peer   Peer
		method string
		path   string
		header http.Header
		allow  bool
		rule   string // substring of the deciding rule, "" for none
	}{
		{"method, path and header match", Peer{Identity: frontend}, "GET", "/metrics", scraper, true, "ingress[0]"},
		{"header missing", Peer{Identity: frontend}, "GET", "/metrics", nil, false, ""},
		{"header value differs", Peer{Identity: frontend}, "GET", "/metrics", http.Header{"X-Scraper": {"Yes"}}, false, ""},
		{"method differs", Peer{Identity: frontend}, "POST", "/metrics", scraper, false, ""},
		{"method case", Peer{Identity: frontend}, "get", "/public/a", nil, true, "ingress[0]"},
		{"path regex is anchored at the end", Peer{Identity: frontend}, "GET", "/metrics/x", scraper, false, ""},
		{"path regex is anchored at the start", Peer{Identity: frontend}, "GET", "/x/public/a", nil, false, ""},
		{"second HTTP rule", Peer{Identity: frontend}, "GET", "/public/a/b", nil, true, "ingress[0]"},
		{"rule without HTTP allows all", Peer{Identity: monitoring}, "POST", "/admin", nil, true, "ingress[1]"},
		{"deny beats allow", Peer{Identity: monitoring}, "DELETE", "/admin", nil, false, "no-delete"},
		{"unknown peer", Peer{Identity: intruder}, "GET", "/public/a", nil, false, ""},
		{"CIDR", Peer{Identity: 2, IP: netip.MustParseAddr("192.168.1.1")}, "GET", "/health", nil, true, "ingress[2]"},
		{"CIDR except", Peer{Identity: 2, IP: netip.MustParseAddr("192.168.9.1")}, "GET", "/health", nil, false, ""},
		{"CIDR, other path", Peer{Identity: 2, IP: netip.MustParseAddr("192.168.1.1")}, "GET", "/admin", nil, false, ""},
		{"CIDR identity of the peer", Peer{Identity: intruder, CIDRIdentity: cidrID}, "PUT", "/blocks", nil, true, "blocks"},
	}
	for _, c := range cases {
		d := p.Decide(c.peer, Request{Method: c.method, Path: c.path, Header: c.header})
		if d.Allowed != c.allow || !strings.Contains(d.Rule, c.rule) || (c.rule == "" && d.Rule != "") {
			t.Errorf("%s: %+v, want allowed=%v by %q", c.name, d, c.allow, c.rule)
		}
		if !d.Allowed && d.DropReason == "" {
			t.Errorf("%s: denied without a drop reason", c.name)
		}
	}
}

func TestDenialsSayWhy(t *testing.T) {
	p := backendPolicy(t, true)
	d := p.Decide(Peer{Identity: intruder}, Request{Method: "GET", Path: "/x"})
	want := "no rule of ShuntNetworkPolicy default/backend-http, NetworkPolicy default/blocks allows GET /x"
	if d.Explanation != want || d.DropReason != ReasonNotAllowed {
		t.Errorf("got %q (%s), want %q", d.Explanation, d.DropReason, want)
	}
	d = p.Decide(Peer{Identity: monitoring}, Request{Method: "DELETE", Path: "/x"})
	if d.Explanation != "DELETE /x denied by ShuntNetworkPolicy default/no-delete ingress[0] (deny)" || d.DropReason != ReasonDenied {
		t.Errorf("deny: %+v", d)
	}
}

func TestNotIsolatedOnlyDenyRulesTakeAway(t *testing.T) {
	p := backendPolicy(t, false)
	if d := p.Decide(Peer{Identity: intruder}, Request{Method: "GET", Path: "/x"}); !d.Allowed || d.Rule != "" {
		t.Errorf("a port no policy isolates: %+v, want allowed", d)
	}
	if d := p.Decide(Peer{Identity: intruder}, Request{Method: "DELETE", Path: "/x"}); d.Allowed {
		t.Errorf("a deny rule on a port no policy isolates: %+v, want denied", d)
	}
}

func TestCompileNamesTheBadField(t *testing.T) {
	for _, c := range []struct {
		rule proxyapi.L7Rule
		want string
	}{
		{proxyapi.L7Rule{Name: "r", Action: "allow", HTTP: []proxyapi.HTTPRule{{}, {Path: "/a("}}}, "rules[0].http[1].path"},
		{proxyapi.L7Rule{Name: "r", Action: "maybe"}, "rules[0].action"},
		{proxyapi.L7Rule{Action: "allow"}, "rules[0].name"},
		{proxyapi.L7Rule{Name: "r", Action: "allow", CIDRs: []string{"10.0.0.0"}}, "rules[0].cidrs[0]"},
		{proxyapi.L7Rule{Name: "r", Action: "allow", Except: []string{"x"}}, "rules[0].except[0]"},
	} {
		_, err := Compile(proxyapi.PortPolicy{Rules: []proxyapi.L7Rule{c.rule}})
		if err == nil || !strings.HasPrefix(err.Error(), c.want+":") {
			t.Errorf("%+v: error %v, want one naming %s", c.rule, err, c.want)
		}
	}
}
