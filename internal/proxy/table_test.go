package proxy

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

func TestRoutePrecedence(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prefix := func(v string) *proxyapi.PathMatch {
		return &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: v}
	}
	rule := func(m proxyapi.Match) proxyapi.RouteRule {
		return proxyapi.RouteRule{Matches: []proxyapi.Match{m}, Backends: []proxyapi.RouteBackend{{Service: "default/web", Port: 80, Weight: 1}}}
	}
	parent := []proxyapi.ParentRef{{Service: "default/web"}}
	cfg := proxyapi.Config{Listen: "127.0.0.1:0", Mark: testMark,
		Services: []proxyapi.Service{{Name: "default/web", VIP: "10.96.0.1", Port: 80}},
		Routes: []proxyapi.Route{
			{Name: "default/b", Created: t0.Add(time.Hour), Parents: parent, Rules: []proxyapi.RouteRule{
				rule(proxyapi.Match{Path: prefix("/api"), Method: "POST"}),
				rule(proxyapi.Match{Path: prefix("/api"), Headers: []proxyapi.HeaderMatch{{Name: "x-a", Value: "1"}}}),
				rule(proxyapi.Match{Path: prefix("/api/users/")}),
				rule(proxyapi.Match{Path: prefix("/api"), Query: []proxyapi.HeaderMatch{{Name: "q", Type: proxyapi.MatchRegularExpr, Value: "[0-9]+"}}}),
				rule(proxyapi.Match{Path: prefix("/host"), Headers: []proxyapi.HeaderMatch{{Name: "Host", Value: "web.example"}}}),
			}},
			{Name: "default/c", Created: t0, Parents: parent, Rules: []proxyapi.RouteRule{rule(proxyapi.Match{Path: prefix("/api")})}},
			{Name: "default/a", Created: t0, Parents: parent, Rules: []proxyapi.RouteRule{
				rule(proxyapi.Match{Path: prefix("/api")}),
				rule(proxyapi.Match{Path: &proxyapi.PathMatch{Type: proxyapi.MatchExact, Value: "/api/login"}}),
				rule(proxyapi.Match{Path: &proxyapi.PathMatch{Type: proxyapi.MatchRegularExpr, Value: "/api/v[0-9]+/.*"}}),
			}},
			{Name: "default/other", Created: t0.Add(-time.Hour), Parents: []proxyapi.ParentRef{{Service: "default/web", Port: 8080}},
				Rules: []proxyapi.RouteRule{rule(proxyapi.Match{})}}, // another port: not attached
			// A rule the agent dropped (no matches: were it compiled, it
			// would take every request) keeps its index.
			{Name: "default/d", Created: t0.Add(2 * time.Hour), Parents: parent, Rules: []proxyapi.RouteRule{
				{Dropped: `matches[0].path.value: "(" is not an RE2 regular expression`},
				rule(proxyapi.Match{Path: prefix("/after-dropped")}),
			}},
		},
	}
	tb, err := compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	web := tb.byName[serviceKey{"default/web", 80}]
	for _, c := range []struct {
		method, url string
		header      []string
		want        string // route rule, "" for none
	}{
		{"GET", "/api/login", nil, "default/a[1]"},                          // exact
		{"GET", "/api/v2/x", nil, "default/a[2]"},                           // regular expression before prefixes
		{"GET", "/api/v2", nil, "default/a[0]"},                             // ... anchored
		{"GET", "/api/users/1", nil, "default/b[2]"},                        // the longest prefix, "/api/users/" as "/api/users"
		{"GET", "/api/users", nil, "default/b[2]"},                          //
		{"POST", "/api/x", []string{"X-A", "1"}, "default/b[0]"},            // method before headers
		{"GET", "/api/x", []string{"X-A", "1"}, "default/b[1]"},             // headers
		{"GET", "/api/x?q=12", nil, "default/b[3]"},                         // query
		{"GET", "/api/x?q=1x", nil, "default/a[0]"},                         // query regex anchored; then the oldest route, first by name
		{"GET", "/api", nil, "default/a[0]"},                                //
		{"GET", "/host/x", []string{"Host", "web.example"}, "default/b[4]"}, // Host is a header to routes
		{"GET", "/host/x", []string{"Host", "other.example"}, ""},           //
		{"GET", "/apix", nil, ""},                                           // prefixes match whole path elements
		{"GET", "/", nil, ""},                                               // no catch-all: 404 (the dropped rule matches nothing)
		{"GET", "/after-dropped", nil, "default/d[1]"},                      // the rule after a dropped one keeps its index
	} {
		r := httptest.NewRequest(c.method, c.url, nil)
		for i := 0; i+1 < len(c.header); i += 2 {
			if c.header[i] == "Host" {
				r.Host = c.header[i+1]
			} else {
				r.Header.Set(c.header[i], c.header[i+1])
			}
		}
		got := ""
		if m, _ := web.route(r, ""); m != nil {
			got = fmt.Sprintf("%s[%d]", m.rule.route, m.rule.index)
		}
		if got != c.want {
			t.Errorf("%s %s %v: rule %q, want %q", c.method, c.url, c.header, got, c.want)
		}
	}
}

func TestSmoothWeightedRoundRobin(t *testing.T) {
	for _, c := range []struct {
		weights []int32
		picks   int
		want    []int
	}{
		{[]int32{90, 10}, 10, []int{9, 1}},
		{[]int32{90, 10}, 2000, []int{1800, 200}},
		{[]int32{3, 2, 1}, 6, []int{3, 2, 1}},
		{[]int32{1, 0, 1}, 100, []int{50, 0, 50}},
	} {
		w := newWRR(c.weights)
		got := make([]int, len(c.weights))
		for i := 0; i < c.picks; i++ {
			got[w.pick()]++
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("weights %v, %d picks: %v, want %v", c.weights, c.picks, got, c.want)
		}
	}
	if i := newWRR([]int32{0, 0}).pick(); i != -1 {
		t.Errorf("all-zero weights picked %d", i)
	}
}

// invalidConfig has one problem of each kind; invalidFields names them.
func invalidConfig() proxyapi.Config {
	return proxyapi.Config{Version: 6, Listen: "nowhere", Mark: proxyapi.Mark{Magic: 0x5e000001, Mask: 0xff000000},
		DialTimeout: proxyapi.Duration(-time.Second),
		Endpoints:   []proxyapi.Endpoint{{IP: "10.0.0.1", Pod: "a/a"}, {IP: "10.0.0.1", Pod: "a/b"}},
		Services: []proxyapi.Service{
			{Name: "default/a", VIP: "10.96.1.1", Port: 80, Backends: []proxyapi.Backend{{IP: "x", Port: 80}}},
			{Name: "default/b", VIP: "10.96.1.2", Port: 80},
		},
		Routes: []proxyapi.Route{{Name: "default/r", Parents: []proxyapi.ParentRef{{Service: "default/b"}}, Rules: []proxyapi.RouteRule{{
			Matches: []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchRegularExpr, Value: "/a("},
				Headers: []proxyapi.HeaderMatch{{Name: "x", Type: "Prefix"}}}},
			Backends: []proxyapi.RouteBackend{{Service: "default/b", Port: 80, Weight: -1}, {Service: "default/gone", Port: 80, Weight: 1}},
			Retry:    &proxyapi.Retry{Codes: []int{200}},
		}}}, {Name: "default/g", Kind: "TLSRoute", Parents: []proxyapi.ParentRef{{Service: "default/b"}}}},
		Policies: []proxyapi.PortPolicy{{Endpoint: "10.0.0.1", Port: 80, Rules: []proxyapi.L7Rule{
			{Name: "p", Action: "allow", HTTP: []proxyapi.HTTPRule{{Path: "("}}}}}},
	}
}

var invalidFields = []string{
	"listen", "mark.magic", "dialTimeout", "endpoints[1].ip", "services[0] (default/a).backends[0]",
	"routes[0] (default/r).rules[0].matches[0].path.value", "routes[0] (default/r).rules[0].matches[0].headers[0].type",
	"routes[0] (default/r).rules[0].backends[0].weight", "routes[0] (default/r).rules[0].backends[1]",
	"routes[0] (default/r).rules[0].retry.codes[0]", "routes[1] (default/g).kind", "policies[0] (10.0.0.1:80).rules[0].http[0].path",
}

func TestInvalidConfigIsRefusedWhole(t *testing.T) {
	_, err := compile(invalidConfig())
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("compile: %v, want a ConfigError", err)
	}
	for _, field := range invalidFields {
		if !strings.Contains(err.Error(), field+":") {
			t.Errorf("no problem names %s:\n%s", field, err)
		}
	}
	if len(ce.Problems) != len(invalidFields) {
		t.Errorf("%d problems, want %d:\n%s", len(ce.Problems), len(invalidFields), err)
	}
	// A refused push leaves the configuration in force.
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark})
	if err := h.p.Apply(invalidConfig()); err == nil {
		t.Fatal("applied")
	}
	if cfg, _ := h.p.Config(); cfg.Version != 1 || h.p.Addr().String() != h.addr {
		t.Errorf("after a refused push: version %d on %s", cfg.Version, h.p.Addr())
	}
}

// A Service's external frontends (its NodePort on each node address) share
// a name and port: each is an original destination of its own, none takes
// the ClusterIP port's place as a route backend; a steering listener on
// the listener's own address is refused.
func TestExternalFrontendsAndSteerListen(t *testing.T) {
	cfg := proxyapi.Config{Listen: "127.0.0.1:15001", SteerListen: "127.0.0.1:15006", Mark: testMark,
		Services: []proxyapi.Service{
			{Name: "default/web", VIP: "10.96.0.1", Port: 80},
			{Name: "default/web", VIP: "192.168.123.1", Port: 30080, External: true},
			{Name: "default/web", VIP: "10.244.0.1", Port: 30080, External: true},
		}}
	tb, err := compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(tb.byName) != 1 || tb.byName[serviceKey{"default/web", 80}] == nil || len(tb.byVIP) != 3 {
		t.Errorf("by name %v, by address %v: want the ClusterIP port by name, all three by address", tb.byName, tb.byVIP)
	}
	if tb.steer.String() != "127.0.0.1:15006" {
		t.Errorf("steering listener %s, want 127.0.0.1:15006", tb.steer)
	}
	cfg.SteerListen = cfg.Listen
	var ce *ConfigError
	if _, err := compile(cfg); !errors.As(err, &ce) || !strings.Contains(err.Error(), "steerListen") {
		t.Errorf("steering listener on the listener's address: %v, want a steerListen problem", err)
	}
}

// A client no endpoint names (outside the cluster) gets the identity of
// the longest policy prefix holding its address, as the datapath's LPM
// lookup answers (an except block inside a wider one is its own, longer
// prefix), and its flows name that prefix; a prefix that does not parse
// is refused by field.
func TestCIDRIdentityOfOutsideClients(t *testing.T) {
	cfg := proxyapi.Config{Listen: "127.0.0.1:15001", Mark: testMark, CIDRIdentities: []proxyapi.CIDRIdentity{
		{Prefix: "203.0.113.0/24", Identity: 1<<24 + 1}, {Prefix: "203.0.113.128/25", Identity: 1<<24 + 2},
	}}
	tb, err := compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]uint32{"203.0.113.7": 1<<24 + 1, "203.0.113.200": 1<<24 + 2, "198.51.100.1": 0} {
		if id, _ := tb.cidrIdentityOf(netip.MustParseAddr(addr)); id != want {
			t.Errorf("CIDR identity of %s: %d, want %d", addr, id, want)
		}
	}
	c := &clientConn{remote: netip.MustParseAddrPort("203.0.113.200:40000"), orig: netip.MustParseAddrPort("10.0.0.5:8080")}
	x := tb.newExchange(httptest.NewRequest("GET", "/", nil), c)
	if x.peer.Identity != identityWorld || x.peer.CIDRIdentity != 1<<24+2 {
		t.Errorf("peer %+v, want world with CIDR identity %d", x.peer, 1<<24+2)
	}
	if src := x.flow(0).Source; !slices.Contains(src.Labels, "cidr:203.0.113.128/25") || !slices.Contains(src.Labels, "reserved:world") {
		t.Errorf("flow source labels %v, want reserved:world and cidr:203.0.113.128/25", src.Labels)
	}
	cfg.CIDRIdentities = append(cfg.CIDRIdentities, proxyapi.CIDRIdentity{Prefix: "203.0.113.0", Identity: 9})
	if _, err := compile(cfg); err == nil || !strings.Contains(err.Error(), "cidrIdentities[2].prefix:") {
		t.Errorf("a prefix without its length: %v, want a cidrIdentities[2].prefix problem", err)
	}
}
