package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shuntnet/shunt/internal/proxy/l7policy"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// table is a configuration compiled for serving: indexes by address and
// name, the routes of each service port in precedence order, regular
// expressions compiled, the weighted round robin state of each rule. A push
// builds a new table and swaps it in whole; a request keeps the table it
// started with.
type table struct {
	cfg         proxyapi.Config
	listen      netip.AddrPort
	steer       netip.AddrPort // the transparent listener; invalid: none
	dialTimeout time.Duration
	endpoints   map[netip.Addr]*proxyapi.Endpoint
	// ipText is the text of each endpoint's address, made once for the
	// flow records rather than per request.
	ipText      map[netip.Addr]string
	byVIP       map[netip.AddrPort]*service
	vips        map[netip.Addr]bool
	byName      map[serviceKey]*service
	policies    map[netip.AddrPort]*l7policy.Port
	slowFilters bool // some route rule has filters only net/http's path applies (needsFilters)
	// cidrs are the policy prefixes' identities by prefix, and cidrBits
	// the prefix lengths they have, longest first (cidrIdentityOf).
	cidrs    map[netip.Prefix]uint32
	cidrBits []int
}

// cidrIdentityOf is the identity of the longest policy prefix holding a,
// and that prefix (0 and none: no prefix holds it), as the datapath's LPM
// lookup answers: one map lookup per prefix length in use.
func (t *table) cidrIdentityOf(a netip.Addr) (uint32, netip.Prefix) {
	for _, bits := range t.cidrBits {
		p, err := a.Prefix(bits)
		if err != nil {
			break // not IPv4: no prefix of policies holds it
		}
		if id, ok := t.cidrs[p]; ok {
			return id, p
		}
	}
	return 0, netip.Prefix{}
}

type serviceKey struct {
	name string
	port uint16
}

// service is one service port: an original destination (VIP:port), a pool
// of ready backends, and the routes attached to it.
type service struct {
	name     string // namespace/name
	label    string // namespace/name:port-name (or port): flows and metrics
	vip      netip.AddrPort
	vipText  string // vip's address as text (flow records)
	backends []backend
	next     atomic.Uint64 // round robin over backends
	routes   []*matchEntry // in precedence order; empty: no route, use backends
	// consumers are the namespaces with consumer routes on this port;
	// consumerEntries counts their entries in routes.
	consumers       map[string]bool
	consumerEntries int
}

type backend struct {
	addr netip.AddrPort
	pod  string // namespace/name, when known
	text string // addr as text when made with the table (else empty: addrText)
}

// addrText is b's address as text: flow records name it.
func (b backend) addrText() string {
	if b.text != "" {
		return b.text
	}
	return b.addr.String()
}

// pick returns the next ready backend; ok is false when there is none.
func (s *service) pick() (backend, bool) {
	if len(s.backends) == 0 {
		return backend{}, false
	}
	n := s.next.Add(1) - 1
	return s.backends[n%uint64(len(s.backends))], true
}

// defaultDialTimeout bounds an upstream connect when the config says 0: a
// SYN dropped by L3/L4 policy must not hang the request.
const defaultDialTimeout = 2 * time.Second

// ConfigError is a configuration refused whole; each problem names its
// field, e.g. routes[0] (shop/reviews).rules[1].backends[0].weight.
type ConfigError struct {
	Problems []string
}

func (e *ConfigError) Error() string {
	const most = 20
	ps := e.Problems
	more := ""
	if len(ps) > most {
		ps, more = ps[:most], fmt.Sprintf("\n... and %d more", len(ps)-most)
	}
	return "invalid configuration: " + strings.Join(ps, "\n") + more
}

// problems collects what is wrong with a configuration, so one answer
// names all of it.
type problems []string

func (p *problems) add(field, format string, args ...any) {
	*p = append(*p, field+": "+fmt.Sprintf(format, args...))
}

// compile checks the whole configuration and builds its table; nothing is
// served from a configuration with any problem.
func compile(cfg proxyapi.Config) (*table, error) {
	var errs problems
	t := &table{
		cfg: cfg, dialTimeout: time.Duration(cfg.DialTimeout),
		endpoints: map[netip.Addr]*proxyapi.Endpoint{}, ipText: map[netip.Addr]string{}, byVIP: map[netip.AddrPort]*service{},
		vips: map[netip.Addr]bool{}, byName: map[serviceKey]*service{}, policies: map[netip.AddrPort]*l7policy.Port{},
	}
	var err error
	if t.listen, err = netip.ParseAddrPort(cfg.Listen); err != nil {
		errs.add("listen", "%q is not an address:port like 10.200.1.1:15001: %v", cfg.Listen, err)
	} else if !t.listen.Addr().Is4() {
		errs.add("listen", "%s: only IPv4 is served (the original destination comes back as a sockaddr_in)", cfg.Listen)
	}
	if cfg.SteerListen != "" {
		if t.steer, err = netip.ParseAddrPort(cfg.SteerListen); err != nil || !t.steer.Addr().Is4() {
			errs.add("steerListen", "%q is not an IPv4 address:port like 10.200.1.1:15006", cfg.SteerListen)
		} else if t.steer == t.listen {
			errs.add("steerListen", "%s is also the listener of redirected connections: give it a port of its own", t.steer)
		}
	}
	switch m := cfg.Mark; {
	case m.Mask == 0 || m.Magic == 0:
		errs.add("mark", "magic and mask are both required: upstream sockets must carry a mark the socket hooks skip")
	case m.Magic&^m.Mask != 0:
		errs.add("mark.magic", "%#x has bits outside mask %#x, where the client identity goes", m.Magic, m.Mask)
	}
	if t.dialTimeout < 0 {
		errs.add("dialTimeout", "%s is negative", t.dialTimeout)
	} else if t.dialTimeout == 0 {
		t.dialTimeout = defaultDialTimeout
	}
	t.compileEndpoints(&errs)
	t.compileServices(&errs)
	t.compileRoutes(&errs)
	t.compilePolicies(&errs)
	t.compileCIDRs(&errs)
	if len(errs) > 0 {
		return nil, &ConfigError{Problems: errs}
	}
	return t, nil
}

func (t *table) compileEndpoints(errs *problems) {
	for i := range t.cfg.Endpoints {
		ep := &t.cfg.Endpoints[i]
		field := fmt.Sprintf("endpoints[%d]", i)
		ip, err := netip.ParseAddr(ep.IP)
		if err != nil {
			errs.add(field+".ip", "%q is not an IP address", ep.IP)
			continue
		}
		if prev, dup := t.endpoints[ip]; dup {
			errs.add(field+".ip", "%s is also the address of %q: a client must have one identity", ip, prev.Pod)
			continue
		}
		t.endpoints[ip] = ep
		t.ipText[ip] = ip.String()
	}
}

func (t *table) compileCIDRs(errs *problems) {
	t.cidrs = map[netip.Prefix]uint32{}
	for i, c := range t.cfg.CIDRIdentities {
		p, err := netip.ParsePrefix(c.Prefix)
		if err != nil || !p.Addr().Is4() {
			errs.add(fmt.Sprintf("cidrIdentities[%d].prefix", i), "%q is not an IPv4 prefix like 203.0.113.0/24", c.Prefix)
			continue
		}
		t.cidrs[p.Masked()] = c.Identity
		t.cidrBits = append(t.cidrBits, p.Bits())
	}
	slices.Sort(t.cidrBits)
	t.cidrBits = slices.Compact(t.cidrBits)
	slices.Reverse(t.cidrBits)
}

func (t *table) compileServices(errs *problems) {
	for i, s := range t.cfg.Services {
		field := fmt.Sprintf("services[%d] (%s)", i, s.Name)
		svc := &service{name: s.Name, label: s.Name + ":" + portName(s)}
		ok := true
		if s.Name == "" {
			errs.add(field+".name", "required (namespace/name)")
			ok = false
		}
		if s.Port == 0 {
			errs.add(field+".port", "required (1-65535)")
			ok = false
		}
		if s.VIP != "" {
			vip, err := netip.ParseAddr(s.VIP)
			if err != nil {
				errs.add(field+".vip", "%q is not an IP address", s.VIP)
				ok = false
			} else {
				svc.vip, svc.vipText = netip.AddrPortFrom(vip, s.Port), vip.String()
			}
		}
		for j, b := range s.Backends {
			ip, err := netip.ParseAddr(b.IP)
			if err != nil || b.Port == 0 {
				errs.add(fmt.Sprintf("%s.backends[%d]", field, j), "%q port %d is not an IP address and a port", b.IP, b.Port)
				ok = false
				continue
			}
			addr := netip.AddrPortFrom(ip, b.Port)
			svc.backends = append(svc.backends, backend{addr: addr, pod: b.Pod, text: addr.String()})
		}
		if !ok {
			continue
		}
		key := serviceKey{s.Name, s.Port}
		if _, dup := t.byName[key]; dup && !s.External {
			errs.add(field, "port %d of %s is listed twice", s.Port, s.Name)
			continue
		}
		if !s.External {
			t.byName[key] = svc
		} else if !svc.vip.IsValid() {
			errs.add(field+".vip", "required for an external address of the service")
			continue
		}
		if svc.vip.IsValid() {
			if prev, dup := t.byVIP[svc.vip]; dup {
				errs.add(field+".vip", "%s is also %s", svc.vip, prev.label)
				continue
			}
			t.byVIP[svc.vip] = svc
			t.vips[svc.vip.Addr()] = true
		}
	}
}

func portName(s proxyapi.Service) string {
	if s.PortName != "" {
		return s.PortName
	}
	return strconv.Itoa(int(s.Port))
}

func (t *table) compilePolicies(errs *problems) {
	for i, pp := range t.cfg.Policies {
		field := fmt.Sprintf("policies[%d] (%s:%d)", i, pp.Endpoint, pp.Port)
		ip, err := netip.ParseAddr(pp.Endpoint)
		if err != nil || pp.Port == 0 {
			errs.add(field, "endpoint %q port %d is not a pod address and a port", pp.Endpoint, pp.Port)
			continue
		}
		key := netip.AddrPortFrom(ip, pp.Port)
		if _, dup := t.policies[key]; dup {
			errs.add(field, "%s has two port policies: merge their rules into one", key)
			continue
		}
		port, err := l7policy.Compile(pp)
		if err != nil {
			*errs = append(*errs, field+"."+err.Error()) // l7policy names the field under the policy
			continue
		}
		t.policies[key] = port
	}
}
