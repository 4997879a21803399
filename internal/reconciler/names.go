package reconciler

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// Names is what turns a flow event's or a map row's numbers into names;
// rebuilt after every sync and swapped in whole, so the flow reader never
// locks.
type Names struct {
	PodSides   map[netip.Addr]PodSide // pod IP (any node) -> what a flow endpoint says about it
	Ifaces     map[uint32]string      // host veth ifindex -> name
	Cgroups    map[uint64]string      // local pod cgroup id -> ns/name
	Identities map[uint32][]string    // identity -> labels
	Rules      map[uint32]string      // rule id -> rule
	services   *serviceNames
}

// PodSide is a pod's name, namespace and address text, formatted once per
// sync rather than once per event.
type PodSide struct{ Pod, Namespace, IP string }

// serviceNames names service frontends; updated with each service change
// (not rebuilt), read by the flow reader.
type serviceNames struct {
	mu sync.RWMutex
	m  map[services.Frontend]frontendName
}

// frontendName is a frontend's service port name and its kind.
type frontendName struct {
	name string
	kind services.Kind
}

func (s *serviceNames) name(f services.Frontend) string {
	n, _ := s.lookup(f)
	return n
}

// lookup gives a frontend's service port name and kind ("" when unknown).
func (s *serviceNames) lookup(f services.Frontend) (string, services.Kind) {
	if s == nil {
		return "", services.KindClusterIP
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := s.m[f]
	return n.name, n.kind
}

func (s *serviceNames) update(d services.Delta) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || d.Full {
		s.m = map[services.Frontend]frontendName{}
	}
	for _, f := range d.Remove {
		delete(s.m, f)
	}
	for _, p := range d.Upsert {
		s.m[p.Frontend] = frontendName{p.Name, p.Kind}
	}
}

// publishNames rebuilds the names from what a sync wrote.
func (r *Reconciler) publishNames(w work) {
	n := &Names{PodSides: map[netip.Addr]PodSide{}, Ifaces: map[uint32]string{}, Cgroups: map[uint64]string{},
		Identities: map[uint32][]string{}, Rules: map[uint32]string{}, services: &r.svcNames}
	for _, p := range w.store.Pods() {
		if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil && !p.Spec.HostNetwork { // hostNetwork: the node's address
			n.PodSides[ip] = PodSide{Pod: p.Namespace + "/" + p.Name, Namespace: p.Namespace, IP: p.Status.PodIP}
		}
	}
	for _, ep := range w.endpoints {
		n.Ifaces[uint32(ep.Ifindex)] = ep.Ifname
		if ep.CgroupID != 0 {
			n.Cgroups[ep.CgroupID] = ep.Pod
		}
	}
	for _, res := range policy.ReservedIdentities {
		n.Identities[res.ID] = []string{"reserved:" + res.Reserved}
	}
	if pol := r.policy.Load(); pol != nil {
		for _, id := range pol.Identities {
			for _, k := range slices.Sorted(maps.Keys(id.Labels)) {
				n.Identities[id.ID] = append(n.Identities[id.ID], k+"="+id.Labels[k])
			}
		}
		for _, c := range pol.CIDRs {
			n.Identities[c.ID] = []string{"cidr:" + c.Prefix.String()}
		}
		for id, rule := range pol.Rules {
			n.Rules[id] = rule.String()
		}
	}
	r.names.Store(n)
}

func tcpFlagsText(f uint8) string {
	var out []string
	for i, name := range []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"} {
		if f&(1<<i) != 0 {
			out = append(out, name)
		}
	}
	return strings.Join(out, "|")
}

// Enrich names what a datapath event says.
func (n *Names) Enrich(e datapath.FlowEvent) flows.Flow {
	fl := flows.Flow{
		Time: e.Time, Verdict: e.Verdict, Reason: e.Reason, Event: e.Event, Point: e.Point,
		Protocol: dpinfo.ProtoName(e.Proto), Interface: n.Ifaces[e.Ifindex], RuleID: e.RuleID,
		Policy: n.Rules[e.RuleID], Length: e.Length, Bytes: e.Bytes, Messages: e.Messages,
	}
	if e.Verdict == "DROPPED" {
		fl.DropReason = e.Reason
	}
	if e.Proto == 6 && e.Point != "socket" {
		fl.TCPFlags = tcpFlagsText(e.TCPFlags)
	}
	fl.ICMPError = e.ICMPError
	side := func(ip netip.Addr, port uint16, identity uint32) flows.Endpoint {
		ep := flows.Endpoint{Port: port, Identity: identity, Labels: n.Identities[identity]}
		if ps, ok := n.PodSides[ip]; ok {
			ep.Pod, ep.Namespace, ep.IP = ps.Pod, ps.Namespace, ps.IP
		} else if ip.IsValid() && !ip.IsUnspecified() {
			ep.IP = ip.String()
		}
		return ep
	}
	fl.Source = side(e.Src, e.SrcPort, e.SrcIdentity)
	fl.Destination = side(e.Dst, e.DstPort, e.DstIdentity)
	if e.Point == "socket" && e.CgroupID != 0 {
		// No packet yet: the caller is known by its cgroup (events that
		// run for no task, as sockops in softirq, name none: their
		// addresses name the pods).
		if pod, ok := n.Cgroups[e.CgroupID]; ok {
			fl.Source.Pod = pod
			fl.Source.Namespace, _, _ = strings.Cut(pod, "/")
		} else {
			fl.Source.Labels = []string{"reserved:host"}
		}
	}
	if e.OrigDst.IsValid() {
		name, kind := n.services.lookup(services.Frontend{VIP: e.OrigDst, Port: e.OrigDstPort, Proto: e.Proto})
		fl.Service = &flows.Service{IP: e.OrigDst.String(), Port: e.OrigDstPort, Name: name}
		if name != "" {
			fl.Service.Kind = kind.String()
		}
	}
	return fl
}

// Annotate adds names next to the numbers of a decoded map row.
func (n *Names) Annotate(row dpinfo.Row) {
	for col, v := range row {
		switch col {
		case "ip", "endpoint", "source", "destination", "backend", "prefix", "local", "remote", "netns":
			s, _ := v.(string)
			s, _, _ = strings.Cut(s, "/")
			if i := strings.LastIndex(s, ":"); i > 0 && strings.Count(s, ".") == 3 {
				s = s[:i]
			}
			if ip, err := netip.ParseAddr(s); err == nil {
				if ps, ok := n.PodSides[ip]; ok {
					row[col+"Pod"] = ps.Pod
				}
			}
		case "identity":
			if id, ok := v.(uint32); ok && n.Identities[id] != nil {
				row["identityLabels"] = strings.Join(n.Identities[id], ",")
			}
		case "ruleID":
			if id, ok := v.(uint32); ok && n.Rules[id] != "" {
				row["rule"] = n.Rules[id]
			}
		}
	}
}
