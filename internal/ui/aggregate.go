// Package ui serves `shunt ui`: a live service map in the browser. Flows
// come from a Source (the agents of a lab today, a relay later), are
// aggregated here into nodes and edges with counts per verdict and a short
// ring of recent flows per edge, and the browser receives snapshots of that
// aggregate a few times a second, never the flows themselves: what it gets
// is bounded by the number of edges, not by the flow rate.
package ui

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

// Node kinds.
const (
	KindWorkload = "workload" // pods grouped by app (+ version) label, else by the pod name without its generated suffix
	KindService  = "service"
	KindHost     = "host"    // the node itself (reserved:host) or other nodes (reserved:remote-node)
	KindWorld    = "world"   // outside the cluster (reserved:world, CIDR identities, unknown addresses)
	KindUnknown  = "unknown" // a side the flow does not name
)

// Edge states, the colour of an edge: the worst class of flow it carried in
// the RecentWindow before its last flow.
const (
	StateForwarded  = "forwarded"
	StateDropped    = "dropped"     // the datapath dropped it (policy, no route, ...)
	StateHTTPDenied = "http-denied" // the node proxy refused the request (HTTP policy, no route, no endpoints)
)

// RecentWindow is how long a drop or a denial keeps colouring its edge
// after it happened, measured back from the edge's last flow.
const RecentWindow = 10 * time.Second

// Node is a box on the map.
type Node struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"` // "": outside every namespace (node, world)
	Name      string `json:"name"`
	// Pods are the pods seen in the flows of a workload, at most maxPodsPerNode.
	Pods []string `json:"pods,omitempty"`
}

// Edge is an arrow between two nodes with what went over it.
type Edge struct {
	ID         string    `json:"id"`
	From       string    `json:"from"`
	To         string    `json:"to"`
	Forwarded  uint64    `json:"forwarded"`
	Dropped    uint64    `json:"dropped"`
	HTTPDenied uint64    `json:"httpDenied"`
	Requests   uint64    `json:"requests"` // HTTP requests (the node proxy's records)
	Status     [6]uint64 `json:"status"`   // requests by status class: [0] no response, [1] 1xx ... [5] 5xx
	// Share is this edge's part (percent) of the HTTP requests leaving the
	// same service over every edge: a traffic split read off the map. 0
	// when the service sends requests over one edge only.
	Share     float64   `json:"share,omitempty"`
	State     string    `json:"state"`
	Last      time.Time `json:"last"`
	Protocols []string  `json:"protocols"`
	lastDrop  time.Time
	lastDeny  time.Time
	ring      []flows.Flow // the newest RingSize flows, oldest overwritten first
	next      int
}

// Snapshot is what the browser receives: the whole aggregate without the
// flows, at most MaxEdges edges and MaxNodes nodes.
type Snapshot struct {
	Time     time.Time `json:"time"`
	Flows    uint64    `json:"flows"`    // flows aggregated into this view
	Overflow uint64    `json:"overflow"` // flows not shown: their edge or node would pass the limits
	Nodes    []Node    `json:"nodes"`
	Edges    []Edge    `json:"edges"`
}

// Limits bound an aggregate's memory and the size of its snapshots.
type Limits struct {
	MaxNodes int // default 500
	MaxEdges int // default 2000
	RingSize int // recent flows kept per edge, default 30
}

const maxPodsPerNode = 20

func (l Limits) withDefaults() Limits {
	if l.MaxNodes <= 0 {
		l.MaxNodes = 500
	}
	if l.MaxEdges <= 0 {
		l.MaxEdges = 2000
	}
	if l.RingSize <= 0 {
		l.RingSize = 30
	}
	return l
}

// Aggregate folds flows into nodes and edges. Safe for concurrent use.
type Aggregate struct {
	mu      sync.Mutex
	limits  Limits
	nodes   map[string]*Node
	edges   map[string]*Edge
	podNode map[string]string // pod -> its workload's node, once its labels were seen
	// identity -> the workload a pod of that identity was last seen in
	identityNode map[uint32]Node
	flows        uint64
	overflow     uint64
	version      uint64 // changes with every flow added
}

// NewAggregate returns an empty aggregate bounded by limits (zero fields:
// the defaults).
func NewAggregate(limits Limits) *Aggregate {
	return &Aggregate{limits: limits.withDefaults(), nodes: map[string]*Node{}, edges: map[string]*Edge{},
		podNode: map[string]string{}, identityNode: map[uint32]Node{}}
}

// Add folds one flow in: the edge from its source to its destination, or,
// translated from a Service, from the source to the Service and from the
// Service to the destination (when the flow names one).
func (a *Aggregate) Add(fl *flows.Flow) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.flows++
	a.version++
	src, dst := a.endpointNode(fl.Source), a.endpointNode(fl.Destination)
	if fl.Service != nil {
		svc := serviceNode(fl.Service)
		a.addEdge(src, svc, fl)
		// A destination named by neither pod nor identity is where the
		// socket layer sent the connection (the node proxy's port), not
		// the Service's backend.
		if dst.Kind != KindUnknown && (fl.Destination.Pod != "" || len(fl.Destination.Labels) > 0) {
			a.addEdge(svc, dst, fl)
		}
		return
	}
	if dst.Kind == KindUnknown {
		dst = Node{ID: "world", Kind: KindWorld, Name: "world"}
	}
	// A connection's end is reported for the packet that ended it, often
	// the server's FIN: it belongs to the edge of the connection's start.
	// So does an ICMP error about a connection, sent back to its sender. A
	// connection recorded again from its answer (its entry lost) was
	// opened by the answer's destination: always that edge.
	backwards := (fl.Event == "end" || fl.Event == "icmp-error") && a.edges[edgeID(src, dst)] == nil && a.edges[edgeID(dst, src)] != nil
	if fl.Event == "answer" || backwards {
		src, dst = dst, src
	}
	a.addEdge(src, dst, fl)
}

// Version changes whenever a flow is added: a view with the version of its
// last snapshot has nothing new to send.
func (a *Aggregate) Version() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.version
}

func (a *Aggregate) addEdge(from, to Node, fl *flows.Flow) {
	id := edgeID(from, to)
	e := a.edges[id]
	if e == nil {
		newNodes := 0
		for _, n := range []Node{from, to} {
			if a.nodes[n.ID] == nil {
				newNodes++
			}
		}
		if len(a.edges) >= a.limits.MaxEdges || len(a.nodes)+newNodes > a.limits.MaxNodes {
			a.overflow++
			return
		}
		for _, n := range []Node{from, to} {
			if a.nodes[n.ID] == nil {
				n := n
				a.nodes[n.ID] = &n
			}
		}
		e = &Edge{ID: id, From: from.ID, To: to.ID, ring: make([]flows.Flow, 0, a.limits.RingSize)}
		a.edges[id] = e
	}
	for _, n := range []Node{from, to} {
		if pod := n.Pods; len(pod) == 1 {
			a.nodes[n.ID].addPod(pod[0])
		}
	}
	switch {
	case fl.Verdict == "DROPPED" && fl.HTTP != nil:
		e.HTTPDenied++
		e.lastDeny = later(e.lastDeny, fl.Time)
	case fl.Verdict == "DROPPED":
		e.Dropped++
		e.lastDrop = later(e.lastDrop, fl.Time)
	default:
		e.Forwarded++
	}
	if h := fl.HTTP; h != nil {
		e.Requests++
		if c := h.Status / 100; c >= 1 && c <= 5 {
			e.Status[c]++
		} else {
			e.Status[0]++
		}
	}
	e.Last = later(e.Last, fl.Time)
	if !slices.Contains(e.Protocols, fl.Protocol) && len(e.Protocols) < 8 {
		e.Protocols = append(e.Protocols, fl.Protocol)
		slices.Sort(e.Protocols)
	}
	if len(e.ring) < cap(e.ring) {
		e.ring = append(e.ring, *fl)
	} else {
		e.ring[e.next] = *fl
	}
	e.next = (e.next + 1) % cap(e.ring)
}

func edgeID(from, to Node) string { return from.ID + " > " + to.ID }

func (n *Node) addPod(pod string) {
	if len(n.Pods) < maxPodsPerNode && !slices.Contains(n.Pods, pod) {
		n.Pods = append(n.Pods, pod)
		slices.Sort(n.Pods)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Snapshot copies the aggregate for the browser: nodes and edges sorted by
// ID, each edge's state and share computed.
func (a *Aggregate) Snapshot(now time.Time) Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Snapshot{Time: now, Flows: a.flows, Overflow: a.overflow,
		Nodes: make([]Node, 0, len(a.nodes)), Edges: make([]Edge, 0, len(a.edges))}
	for _, n := range a.nodes {
		c := *n
		c.Pods = slices.Clone(n.Pods)
		s.Nodes = append(s.Nodes, c)
	}
	requestsFrom := map[string]uint64{}
	splitEdges := map[string]int{}
	for _, e := range a.edges {
		if e.Requests > 0 && a.nodes[e.From].Kind == KindService {
			requestsFrom[e.From] += e.Requests
			splitEdges[e.From]++
		}
	}
	for _, e := range a.edges {
		c := *e
		c.ring = nil
		c.Protocols = slices.Clone(e.Protocols)
		c.State = e.state()
		if splitEdges[e.From] > 1 && e.Requests > 0 {
			c.Share = 100 * float64(e.Requests) / float64(requestsFrom[e.From])
		}
		s.Edges = append(s.Edges, c)
	}
	slices.SortFunc(s.Nodes, func(x, y Node) int { return cmp.Compare(x.ID, y.ID) })
	slices.SortFunc(s.Edges, func(x, y Edge) int { return cmp.Compare(x.ID, y.ID) })
	return s
}

func (e *Edge) state() string {
	since := e.Last.Add(-RecentWindow)
	switch {
	case e.Dropped > 0 && !e.lastDrop.Before(since):
		return StateDropped
	case e.HTTPDenied > 0 && !e.lastDeny.Before(since):
		return StateHTTPDenied
	case e.Forwarded > 0:
		return StateForwarded
	case e.Dropped > 0:
		return StateDropped
	default:
		return StateHTTPDenied
	}
}

// EdgeFlows returns the recent flows of an edge, newest first, and whether
// the edge exists.
func (a *Aggregate) EdgeFlows(id string) ([]flows.Flow, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.edges[id]
	if e == nil {
		return nil, false
	}
	out := make([]flows.Flow, 0, len(e.ring))
	n := len(e.ring)
	for i := 1; i <= n; i++ {
		out = append(out, e.ring[(e.next-i+n)%n])
	}
	return out, true
}

// endpointNode is the node a side of a flow belongs to.
func (a *Aggregate) endpointNode(ep flows.Endpoint) Node {
	for _, l := range ep.Labels {
		switch {
		case l == "reserved:host":
			return Node{ID: "host", Kind: KindHost, Name: "node"}
		case l == "reserved:remote-node":
			return Node{ID: "remote-node", Kind: KindHost, Name: "other nodes"}
		case l == "reserved:world" || strings.HasPrefix(l, "cidr:"):
			return Node{ID: "world", Kind: KindWorld, Name: "world"}
		}
	}
	if ep.Pod == "" {
		if ep.IP == "" && len(ep.Labels) == 0 {
			return Node{Kind: KindUnknown}
		}
		// The node proxy's upstream connections carry the client's
		// identity from the node's address: the identity names the
		// workload its pods were seen in.
		if n, ok := a.identityNode[ep.Identity]; ok && ep.Identity != 0 {
			return n
		}
		if name := appName(ep.Labels); name != "" && ep.Namespace != "" {
			return workloadNode(ep.Namespace, name, "")
		}
		if len(ep.Labels) > 0 && ep.Identity != 0 {
			return Node{ID: fmt.Sprintf("identity:%d", ep.Identity), Kind: KindWorkload, Name: strings.Join(ep.Labels, ",")}
		}
		return Node{ID: "world", Kind: KindWorld, Name: "world"}
	}
	ns, pod, _ := strings.Cut(ep.Pod, "/")
	if ep.Namespace != "" {
		ns = ep.Namespace
	}
	var n Node
	if name := appName(ep.Labels); name != "" {
		n = workloadNode(ns, name, ep.Pod)
		if len(a.podNode) < 20*a.limits.MaxNodes {
			a.podNode[ep.Pod] = name
		}
	} else if name, ok := a.podNode[ep.Pod]; ok {
		n = workloadNode(ns, name, ep.Pod)
	} else {
		n = workloadNode(ns, ownerName(pod), ep.Pod)
	}
	if ep.Identity != 0 && len(a.identityNode) < a.limits.MaxNodes {
		id := n
		id.Pods = nil
		a.identityNode[ep.Identity] = id
	}
	return n
}

func workloadNode(ns, name, pod string) Node {
	n := Node{ID: "w:" + ns + "/" + name, Kind: KindWorkload, Namespace: ns, Name: name}
	if pod != "" {
		n.Pods = []string{pod} // addEdge adds it to the node's list
	}
	return n
}

// appName is the workload a pod's labels name: app (or
// app.kubernetes.io/name), with its version label when it has one, so the
// versions of a split show as nodes of their own.
func appName(labels []string) string {
	var app, version string
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			continue
		}
		switch k {
		case "app", "app.kubernetes.io/name":
			if app == "" || k == "app" {
				app = v
			}
		case "version", "app.kubernetes.io/version":
			version = v
		}
	}
	if app != "" && version != "" {
		return app + "-" + version
	}
	return app
}

var (
	replicaSetPod = regexp.MustCompile(`^(.+)-[a-z0-9]{6,10}-[a-z0-9]{5}$`)
	generatedPod  = regexp.MustCompile(`^(.+)-[a-z0-9]*[0-9][a-z0-9]*$`)
)

// ownerName guesses a pod's owner from its name when its labels name no
// app: a Deployment's pod without the ReplicaSet hash and its own suffix, a
// DaemonSet's or Job's without its random suffix, a StatefulSet's without
// its ordinal.
func ownerName(pod string) string {
	if m := replicaSetPod.FindStringSubmatch(pod); m != nil {
		return m[1]
	}
	if m := generatedPod.FindStringSubmatch(pod); m != nil {
		suffix := pod[len(m[1])+1:]
		if len(suffix) == 5 || strings.Trim(suffix, "0123456789") == "" {
			return m[1]
		}
	}
	return pod
}

func serviceNode(s *flows.Service) Node {
	if s.Name == "" {
		return Node{ID: "svc:" + s.IP, Kind: KindService, Name: s.IP}
	}
	name, _, _ := strings.Cut(s.Name, ":") // namespace/name:port
	ns, svc, _ := strings.Cut(name, "/")
	return Node{ID: "svc:" + name, Kind: KindService, Namespace: ns, Name: svc}
}
