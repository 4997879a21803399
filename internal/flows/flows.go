// Package flows holds the agent's flow records: the stable JSON shape users
// and scripts read (`shunt observe -o json`), the filters of `shunt observe`
// and a bounded history that live followers subscribe to. It does no I/O;
// the agent fills it from the datapath's ring buffer.
package flows

import (
	"fmt"
	"net/url"
	"reflect"
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
	// Kind is the frontend's: clusterip, nodeport, externalip or lb (the
	// last three reached from outside, the flow's node being the ingress
	// node).
	Kind string `json:"kind,omitempty"`
}

// ReasonMirrored is the reason of a node proxy's flow for a copy of a
// request (a route's RequestMirror): from the client to the mirror's
// backend, the copy's answer (thrown away) in its HTTP status.
const ReasonMirrored = "mirrored"

// Flow is one flow event, enriched with names. Fields are stable.
type Flow struct {
	Time        time.Time `json:"time"`
	Node        string    `json:"node,omitempty"`       // the node whose datapath (or proxy) reported it
	Verdict     string    `json:"verdict"`              // FORWARDED, DROPPED, TRANSLATED, REDIRECTED
	DropReason  string    `json:"dropReason,omitempty"` // set when DROPPED: policy-denied, policy-not-allowed, ...
	Reason      string    `json:"reason"`               // the datapath's reason (counters use the same names)
	Event       string    `json:"event"`                // new, answer, end, packet, drop, socket, icmp-error
	Point       string    `json:"point"`                // from-pod, to-pod, from-overlay, socket
	Source      Endpoint  `json:"source"`
	Destination Endpoint  `json:"destination"`
	Protocol    string    `json:"protocol"`            // TCP, UDP, ICMP, SCTP or the number
	TCPFlags    string    `json:"tcpFlags,omitempty"`  // e.g. SYN, SYN|ACK
	ICMPError   string    `json:"icmpError,omitempty"` // event icmp-error: e.g. port-unreachable, fragmentation-needed
	Service     *Service  `json:"service,omitempty"`   // translated from this service address
	Interface   string    `json:"interface,omitempty"`
	Policy      string    `json:"policy,omitempty"` // the rule that decided, e.g. NetworkPolicy ns/name ingress[0] (allow)
	RuleID      uint32    `json:"ruleID,omitempty"`
	Length      uint32    `json:"length,omitempty"`
	// An accelerated socket's end: bytes and sends it moved through the
	// redirect (one record per direction, from each end as it closes).
	Bytes    uint64 `json:"bytes,omitempty"`
	Messages uint64 `json:"messages,omitempty"`
	HTTP     *HTTP  `json:"http,omitempty"` // set on the node proxy's records (Protocol HTTP)
}

// HTTP is one request the node proxy handled: what was asked, where it went
// and how it ended. A request that got no response (timeout, upstream
// unreachable, client gone) has Status 0 and says why in Error.
type HTTP struct {
	Method        string `json:"method"`
	Path          string `json:"path"`
	Host          string `json:"host,omitempty"`
	Protocol      string `json:"protocol"`          // HTTP/1.1, HTTP/2
	Status        int    `json:"status"`            // 0: no response
	LatencyMicros int64  `json:"latencyMicros"`     // from the request to the end of the response (or the failure)
	Route         string `json:"route,omitempty"`   // the HTTPRoute (namespace/name) that chose the backend
	Backend       string `json:"backend,omitempty"` // ip:port the request went to
	// BackendPod is the backend's namespace/name when known.
	BackendPod string `json:"backendPod,omitempty"`
	Error      string `json:"error,omitempty"`
}

// JSONFields names the fields of a flow's JSON (`shunt observe -o json`),
// read from Flow's tags so that the help listing them cannot drift from what
// is emitted: "time, node, ..., source{pod,...}, destination{...}, ...,
// http{method,...}". An object of a type already spelt out is "{...}".
func JSONFields() string {
	seen := map[reflect.Type]bool{}
	var fields func(t reflect.Type, sep string) string
	fields = func(t reflect.Type, sep string) string {
		var names []string
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Time]() {
				if seen[ft] {
					name += "{...}"
				} else {
					seen[ft] = true
					name += "{" + fields(ft, ",") + "}"
				}
			}
			names = append(names, name)
		}
		return strings.Join(names, sep)
	}
	return fields(reflect.TypeFor[Flow](), ", ")
}

// Filter selects flows; empty fields select everything. Pods are
// namespace/name.
type Filter struct {
	Pod       string // either side
	Namespace string // either side
	FromPod   string
	ToPod     string
	Verdict   string // FORWARDED, DROPPED, TRANSLATED, REDIRECTED
	Protocol  string // TCP, UDP, ICMP, SCTP, or HTTP: the proxy's records
	Port      uint16 // either side
	Service   string // namespace/name (any port)
	Since     time.Time
	// The proxy's HTTP records; any of these selects only them.
	HTTPStatus string // a status (403) or a class (5xx); 0 selects requests that got no response
	HTTPMethod string // GET, POST, ...
	HTTPPath   string // path prefix
}

// Verdicts a filter may name.
var Verdicts = []string{"FORWARDED", "DROPPED", "TRANSLATED", "REDIRECTED"}

// Protocols a filter may name.
var Protocols = []string{"TCP", "UDP", "ICMP", "SCTP", "HTTP"}

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
	case f.Protocol == "HTTP" && fl.HTTP == nil:
		return false
	case f.Protocol != "" && f.Protocol != "HTTP" && fl.Protocol != f.Protocol:
		return false
	case f.Port != 0 && fl.Source.Port != f.Port && fl.Destination.Port != f.Port &&
		(fl.Service == nil || fl.Service.Port != f.Port):
		return false
	case f.Service != "" && (fl.Service == nil || !strings.HasPrefix(fl.Service.Name, f.Service+":")):
		return false
	case !f.Since.IsZero() && fl.Time.Before(f.Since):
		return false
	}
	return f.matchHTTP(fl.HTTP)
}

func (f Filter) matchHTTP(h *HTTP) bool {
	if f.HTTPStatus == "" && f.HTTPMethod == "" && f.HTTPPath == "" {
		return true
	}
	switch {
	case h == nil:
		return false
	case f.HTTPMethod != "" && h.Method != f.HTTPMethod:
		return false
	case f.HTTPPath != "" && !strings.HasPrefix(h.Path, f.HTTPPath):
		return false
	case f.HTTPStatus != "" && !statusMatches(f.HTTPStatus, h.Status):
		return false
	}
	return true
}

// statusMatches reads a status filter checked by ParseFilter: "403" or "4xx".
func statusMatches(want string, status int) bool {
	if strings.HasSuffix(want, "xx") {
		return status/100 == int(want[0]-'0')
	}
	return strconv.Itoa(status) == want
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
	set("http-status", f.HTTPStatus)
	set("http-method", f.HTTPMethod)
	set("http-path", f.HTTPPath)
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
		HTTPStatus: strings.ToLower(q.Get("http-status")), HTTPMethod: strings.ToUpper(q.Get("http-method")), HTTPPath: q.Get("http-path"),
	}
	if f.Verdict != "" && !contains(Verdicts, f.Verdict) {
		return f, fmt.Errorf("unknown verdict %q: use one of %s", q.Get("verdict"), strings.Join(Verdicts, ", "))
	}
	if f.Protocol != "" && !contains(Protocols, f.Protocol) {
		return f, fmt.Errorf("unknown protocol %q: use TCP, UDP, ICMP, SCTP or HTTP", q.Get("protocol"))
	}
	if s := f.HTTPStatus; s != "" && !validStatus(s) {
		return f, fmt.Errorf("bad http-status %q: want a status (403), a class (5xx) or 0 (no response)", q.Get("http-status"))
	}
	if p := f.HTTPPath; p != "" && !strings.HasPrefix(p, "/") {
		return f, fmt.Errorf("bad http-path %q: want a path prefix starting with /", p)
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

func validStatus(s string) bool {
	if len(s) == 3 && s[0] >= '1' && s[0] <= '5' && s[1:] == "xx" {
		return true
	}
	n, err := strconv.Atoi(s)
	return err == nil && (n == 0 || n >= 100 && n <= 599) && strconv.Itoa(n) == s
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
