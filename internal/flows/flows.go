// Package flows holds the agent's flow records: the stable JSON shape users
// and scripts read (`shunt observe -o json`), the filters of `shunt observe`
// and a bounded history that live followers subscribe to. It does no I/O;
// the agent fills it from the datapath's ring buffer.
package flows

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Endpoint is one side of a flow. Fields are stable.
type Endpoint struct {
	Pod       string   `json:"pod,omitempty"`       // namespace/name, when a pod of this node
	Namespace string   `json:"namespace,omitempty"` // the pod's namespace
	IP        string   `json:"ip,omitempty"`
	Port      uint16   `json:"port,omitempty"`
	Identity  uint32   `json:"identity,omitempty"`
	Labels    []string `json:"labels,omitempty"` // key=value of the identity; reserved:host, reserved:world, cidr:PREFIX
}

// Service is the service a flow was translated from.
type Service struct {
	Name string `json:"name,omitempty"` // namespace/name:port
	IP   string `json:"ip"`
	Port uint16 `json:"port"`
}

// Flow is one flow event, enriched with names. Fields are stable.
type Flow struct {
	Time        time.Time `json:"time"`
	Verdict     string    `json:"verdict"`              // FORWARDED, DROPPED, TRANSLATED, REDIRECTED
	DropReason  string    `json:"dropReason,omitempty"` // set when DROPPED: policy-denied, policy-not-allowed, ...
	Reason      string    `json:"reason"`               // the datapath's reason (counters use the same names)
	Event       string    `json:"event"`                // new, end, packet, drop, socket
	Point       string    `json:"point"`                // from-pod, to-pod, socket
	Source      Endpoint  `json:"source"`
	Destination Endpoint  `json:"destination"`
	Protocol    string    `json:"protocol"`           // TCP, UDP, ICMP, SCTP or the number
	TCPFlags    string    `json:"tcpFlags,omitempty"` // e.g. SYN, SYN|ACK
	Service     *Service  `json:"service,omitempty"`  // translated from this service address
	Interface   string    `json:"interface,omitempty"`
	Policy      string    `json:"policy,omitempty"` // the rule that decided, e.g. NetworkPolicy ns/name ingress[0] (allow)
	RuleID      uint32    `json:"ruleID,omitempty"`
	Length      uint32    `json:"length,omitempty"`
}

// Filter selects flows; empty fields select everything. Pods are
// namespace/name.
type Filter struct {
	Pod       string // either side
	Namespace string // either side
	FromPod   string
	ToPod     string
	Verdict   string // FORWARDED, DROPPED, TRANSLATED, REDIRECTED
	Protocol  string // TCP, UDP, ICMP, SCTP
	Port      uint16 // either side
	Service   string // namespace/name (any port)
	Since     time.Time
}

// Verdicts a filter may name.
var Verdicts = []string{"FORWARDED", "DROPPED", "TRANSLATED", "REDIRECTED"}

// Match says whether f selects fl.
func (f Filter) Match(fl *Flow) bool {
	switch {
	case f.Pod != "" && fl.Source.Pod != f.Pod && fl.Destination.Pod != f.Pod:
		return false
	case f.Namespace != "" && fl.Source.Namespace != f.Namespace && fl.Destination.Namespace != f.Namespace:
		return false
	case f.FromPod != "" && fl.Source.Pod != f.FromPod:
		return false
	case f.ToPod != "" && fl.Destination.Pod != f.ToPod:
		return false
	case f.Verdict != "" && fl.Verdict != f.Verdict:
		return false
	case f.Protocol != "" && fl.Protocol != f.Protocol:
		return false
	case f.Port != 0 && fl.Source.Port != f.Port && fl.Destination.Port != f.Port &&
		(fl.Service == nil || fl.Service.Port != f.Port):
		return false
	case f.Service != "" && (fl.Service == nil || !strings.HasPrefix(fl.Service.Name, f.Service+":")):
		return false
	case !f.Since.IsZero() && fl.Time.Before(f.Since):
		return false
	}
	return true
}

// Query encodes the filter as URL parameters.
func (f Filter) Query() url.Values {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("pod", f.Pod)
	set("namespace", f.Namespace)
	set("from-pod", f.FromPod)
	set("to-pod", f.ToPod)
	set("verdict", f.Verdict)
	set("protocol", f.Protocol)
	set("service", f.Service)
	if f.Port != 0 {
		q.Set("port", strconv.Itoa(int(f.Port)))
	}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.Format(time.RFC3339Nano))
	}
	return q
}

// ParseFilter reads a filter from URL parameters, checking every value.
func ParseFilter(q url.Values) (Filter, error) {
	f := Filter{
		Pod: q.Get("pod"), Namespace: q.Get("namespace"), FromPod: q.Get("from-pod"), ToPod: q.Get("to-pod"),
		Verdict: strings.ToUpper(q.Get("verdict")), Protocol: strings.ToUpper(q.Get("protocol")), Service: q.Get("service"),
	}
	if f.Verdict != "" && !contains(Verdicts, f.Verdict) {
		return f, fmt.Errorf("unknown verdict %q: use one of %s", q.Get("verdict"), strings.Join(Verdicts, ", "))
	}
	if f.Protocol != "" && !contains([]string{"TCP", "UDP", "ICMP", "SCTP"}, f.Protocol) {
		return f, fmt.Errorf("unknown protocol %q: use TCP, UDP, ICMP or SCTP", q.Get("protocol"))
	}
	if p := q.Get("port"); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return f, fmt.Errorf("bad port %q: want 1-65535", p)
		}
		f.Port = uint16(n)
	}
	if s := q.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return f, fmt.Errorf("bad since %q: want RFC 3339 time", s)
		}
		f.Since = t
	}
	return f, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// History keeps the last flows in a ring and hands new ones to followers.
// A follower that does not keep up loses flows (counted), never blocks the
// reader of the datapath's ring buffer.
type History struct {
	mu      sync.Mutex
	ring    []Flow
	next    int // where the next flow goes
	subs    map[*subscriber]struct{}
	dropped uint64 // flows a slow follower missed
}

type subscriber struct {
	filter Filter
	ch     chan Flow
}

// NewHistory keeps up to size flows (at least 1).
func NewHistory(size int) *History {
	if size < 1 {
		size = 1
	}
	return &History{ring: make([]Flow, 0, size), subs: map[*subscriber]struct{}{}}
}

// Add records a flow and passes it to matching followers.
func (h *History) Add(fl Flow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ring) < cap(h.ring) {
		h.ring = append(h.ring, fl)
	} else {
		h.ring[h.next] = fl
	}
	h.next = (h.next + 1) % cap(h.ring)
	for s := range h.subs {
		if !s.filter.Match(&fl) {
			continue
		}
		select {
		case s.ch <- fl:
		default:
			h.dropped++
		}
	}
}

// Query returns the matching flows, oldest first; last > 0 keeps only the
// newest last of them.
func (h *History) Query(f Filter, last int) []Flow {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.query(f, last)
}

func (h *History) query(f Filter, last int) []Flow {
	var out []Flow
	n := len(h.ring)
	start := 0
	if n == cap(h.ring) {
		start = h.next
	}
	for i := 0; i < n; i++ {
		fl := &h.ring[(start+i)%n]
		if f.Match(fl) {
			out = append(out, *fl)
		}
	}
	if last > 0 && len(out) > last {
		out = out[len(out)-last:]
	}
	return out
}

// Follow returns the matching flows held now (as Query) and delivers every
// later matching flow on live, with no gap and no repeat between the two,
// until cancel is called. buffer is how many flows may wait for the reader
// before it starts missing some.
func (h *History) Follow(f Filter, last, buffer int) (past []Flow, live <-chan Flow, cancel func()) {
	s := &subscriber{filter: f, ch: make(chan Flow, buffer)}
	h.mu.Lock()
	past = h.query(f, last)
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return past, s.ch, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs, s)
			h.mu.Unlock()
		})
	}
}

// Len is how many flows the history holds; Dropped how many flows slow
// followers missed.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ring)
}

// Dropped is how many flows followers missed because they did not keep up.
func (h *History) Dropped() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dropped
}
