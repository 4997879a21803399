package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// flowNames is what turns a flow event's numbers into names; rebuilt after
// every reconcile and swapped in whole, so the flow reader never locks.
type flowNames struct {
	podSides   map[netip.Addr]podSide // pod IP -> what a flow endpoint says about it, preformatted
	ifaces     map[uint32]string      // host veth ifindex -> name
	cgroups    map[uint64]string      // pod cgroup id -> ns/name
	services   *serviceNames
	identities map[uint32][]string // identity -> labels
	rules      map[uint32]string   // rule id -> rule
}

// podSide is a pod's name, namespace and address text, formatted once per
// reconcile rather than once per event.
type podSide struct{ pod, namespace, ip string }

// serviceNames names service frontends for flows; updated with each
// service change (not rebuilt), read by the flow reader.
type serviceNames struct {
	mu sync.RWMutex
	m  map[services.Frontend]string
}

func (s *serviceNames) name(f services.Frontend) string {
	if s == nil {
		return ""
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[f]
}

func (s *serviceNames) update(upsert, remove []services.Port) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[services.Frontend]string{}
	}
	for _, p := range remove {
		delete(s.m, p.Frontend)
	}
	for _, p := range upsert {
		s.m[p.Frontend] = p.Name
	}
}

// updateFlowNames rebuilds the names from the agent's state. Called with mu held.
func (a *Agent) updateFlowNames(ifaces map[uint32]string) {
	n := &flowNames{podSides: map[netip.Addr]podSide{}, ifaces: ifaces,
		cgroups: map[uint64]string{}, services: &a.svcNames, identities: map[uint32][]string{},
		rules: map[uint32]string{}}
	for key, rec := range a.state.Pods {
		n.podSides[netip.MustParseAddr(rec.IP)] = podSide{pod: key, namespace: rec.Namespace, ip: rec.IP}
		var st syscall.Stat_t
		if err := syscall.Stat(rec.Cgroup, &st); err == nil {
			n.cgroups[st.Ino] = key // a cgroup's id is its directory's inode
		}
	}
	for _, r := range policy.ReservedIdentities {
		n.identities[r.ID] = []string{"reserved:" + r.Reserved}
	}
	if pol := a.policy; pol != nil {
		for _, id := range pol.Identities {
			for _, k := range slices.Sorted(maps.Keys(id.Labels)) {
				n.identities[id.ID] = append(n.identities[id.ID], k+"="+id.Labels[k])
			}
		}
		for _, c := range pol.CIDRs {
			n.identities[c.ID] = []string{"cidr:" + c.Prefix.String()}
		}
		for id, r := range pol.Rules {
			n.rules[id] = r.String()
		}
	}
	a.names.Store(n)
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

// enrich names what a datapath event says.
func (n *flowNames) enrich(e datapath.FlowEvent) flows.Flow {
	fl := flows.Flow{
		Time: e.Time, Verdict: e.Verdict, Reason: e.Reason, Event: e.Event, Point: e.Point,
		Protocol: datapath.ProtoName(e.Proto), Interface: n.ifaces[e.Ifindex], RuleID: e.RuleID,
		Policy: n.rules[e.RuleID], Length: e.Length,
	}
	if e.Verdict == "DROPPED" {
		fl.DropReason = e.Reason
	}
	if e.Proto == 6 && e.Point != "socket" {
		fl.TCPFlags = tcpFlagsText(e.TCPFlags)
	}
	side := func(ip netip.Addr, port uint16, identity uint32) flows.Endpoint {
		ep := flows.Endpoint{Port: port, Identity: identity, Labels: n.identities[identity]}
		if ps, ok := n.podSides[ip]; ok {
			ep.Pod, ep.Namespace, ep.IP = ps.pod, ps.namespace, ps.ip
		} else if ip.IsValid() && !ip.IsUnspecified() {
			ep.IP = ip.String()
		}
		return ep
	}
	fl.Source = side(e.Src, e.SrcPort, e.SrcIdentity)
	fl.Destination = side(e.Dst, e.DstPort, e.DstIdentity)
	if e.Point == "socket" {
		// No packet yet: the caller is known by its cgroup.
		if pod, ok := n.cgroups[e.CgroupID]; ok {
			fl.Source.Pod = pod
			fl.Source.Namespace, _, _ = strings.Cut(pod, "/")
		} else {
			fl.Source.Labels = []string{"reserved:host"}
		}
	}
	if e.OrigDst.IsValid() {
		fl.Service = &flows.Service{IP: e.OrigDst.String(), Port: e.OrigDstPort,
			Name: n.services.name(services.Frontend{VIP: e.OrigDst, Port: e.OrigDstPort, Proto: e.Proto})}
	}
	return fl
}

// readFlows moves flow events from the datapath into the history until the
// reader is closed.
func (a *Agent) readFlows(fr *datapath.FlowReader) {
	for {
		e, err := fr.Read()
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			a.log.Warn("reading flow events", "err", err)
			continue
		}
		a.flows.Add(a.names.Load().enrich(e))
	}
}

// handleFlows answers with the matching flows of the history as JSON lines
// and, with follow=true, keeps streaming new ones until the client leaves.
func (a *Agent) handleFlows(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	filter, err := flows.ParseFilter(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	last := 0
	if s := q.Get("last"); s != "" {
		if last, err = strconv.Atoi(s); err != nil || last < 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("bad last %q: want a count", s))
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	if q.Get("follow") != "true" {
		for _, fl := range a.flows.Query(filter, last) {
			enc.Encode(fl)
		}
		return
	}
	past, live, cancel := a.flows.Follow(filter, last, 4096)
	defer cancel()
	for _, fl := range past {
		enc.Encode(fl)
	}
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	for {
		select {
		case fl := <-live:
			if err := enc.Encode(fl); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		case <-r.Context().Done():
			return
		}
	}
}

// handleSampling reports (GET) or sets (POST ?mode=) the flow sampling.
func (a *Agent) handleSampling(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		m, err := datapath.ParseFlowMode(r.URL.Query().Get("mode"))
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		if err := a.dp.SetFlowMode(m); err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		a.sampling.Store(uint32(m))
		a.log.Info("flow sampling changed", "mode", m)
	}
	writeJSON(w, http.StatusOK, map[string]string{"sampling": datapath.FlowMode(a.sampling.Load()).String()})
}
