// Package relay merges the flows of every node's agent into one stream, as
// Hubble Relay does for Cilium: it finds the agents (Discover: a lab's
// nodes, or the agent pods of a Kubernetes cluster), follows each one's
// flow stream, keeps following nodes that come and go, and serves the
// merged flows with the agent's own API (GET /v1/flows, the same filters),
// so `shunt observe` reads a relay as it reads one agent.
//
// Merged by time: each agent's stream is in its own time order, but the
// streams interleave as the network delivers them. The relay holds each
// flow for a short window (Window) and releases the held flows oldest
// first, so the merged stream is in time order across nodes as long as no
// node's flow arrives later than the window.
package relay

import (
	"container/heap"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

// Peer is one agent the relay follows.
type Peer struct {
	Node string // the node the agent serves; flows that name none get it
	// Addr identifies the peer for logs and for noticing it changed (a
	// socket path or host:port).
	Addr string
	// Stream follows the agent's flows (GET path, JSON lines) until ctx
	// ends or the agent ends the stream.
	Stream func(ctx context.Context, path string, line func([]byte) error) error
}

// Discover lists the agents to follow now.
type Discover func(ctx context.Context) ([]Peer, error)

// Options tune a relay; zero values take the defaults.
type Options struct {
	History  int           // merged flows kept (default 65536)
	Window   time.Duration // how long a flow is held for ordering (default 250 ms)
	Rescan   time.Duration // how often Discover is asked again (default 5 s)
	Retry    time.Duration // how long after a peer's stream ends it is followed again (default 1 s)
	Backfill int           // flows each newly followed peer sends from its history (default 1000)
	Log      *slog.Logger
}

func (o *Options) defaults() {
	if o.History <= 0 {
		o.History = 65536
	}
	if o.Window <= 0 {
		o.Window = 250 * time.Millisecond
	}
	if o.Rescan <= 0 {
		o.Rescan = 5 * time.Second
	}
	if o.Retry <= 0 {
		o.Retry = time.Second
	}
	if o.Backfill <= 0 {
		o.Backfill = 1000
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Relay follows peers and serves their merged flows.
type Relay struct {
	discover Discover
	opt      Options
	history  *flows.History
	order    *reorder

	mu    sync.Mutex
	peers map[string]*peerState // by node
}

type peerState struct {
	peer      Peer
	cancel    context.CancelFunc
	following bool // a stream is open (or opening)
	lastErr   string
	flows     uint64
}

// New makes a relay; Run starts it.
func New(discover Discover, opt Options) *Relay {
	opt.defaults()
	r := &Relay{discover: discover, opt: opt, history: flows.NewHistory(opt.History), peers: map[string]*peerState{}}
	r.order = newReorder(opt.Window, r.history.Add)
	return r
}

// Run follows the peers Discover finds until ctx ends.
func (r *Relay) Run(ctx context.Context) {
	go r.order.run(ctx)
	t := time.NewTicker(r.opt.Rescan)
	defer t.Stop()
	for {
		r.rescan(ctx)
		select {
		case <-ctx.Done():
			r.mu.Lock()
			for _, p := range r.peers {
				p.cancel()
			}
			r.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

// rescan follows new peers and lets go of the gone (or moved) ones.
func (r *Relay) rescan(ctx context.Context) {
	peers, err := r.discover(ctx)
	if err != nil {
		r.opt.Log.Warn("discovering agents", "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	for _, p := range peers {
		seen[p.Node] = true
		if cur, ok := r.peers[p.Node]; ok && cur.peer.Addr == p.Addr {
			continue
		} else if ok {
			cur.cancel()
		}
		pctx, cancel := context.WithCancel(ctx)
		st := &peerState{peer: p, cancel: cancel}
		r.peers[p.Node] = st
		r.opt.Log.Info("following agent", "node", p.Node, "addr", p.Addr)
		go r.follow(pctx, st)
	}
	for node, st := range r.peers {
		if !seen[node] {
			st.cancel()
			delete(r.peers, node)
			r.opt.Log.Info("agent gone", "node", node, "addr", st.peer.Addr)
		}
	}
}

// follow streams one peer's flows into the merge, again after each end,
// until ctx ends. The first stream backfills the peer's recent flows; a
// stream after a break asks only for what is newer than the last flow seen
// (flows.FollowQuery).
func (r *Relay) follow(ctx context.Context, st *peerState) {
	var newest time.Time
	for ctx.Err() == nil {
		r.mu.Lock()
		st.following = true
		r.mu.Unlock()
		err := st.peer.Stream(ctx, "/v1/flows?"+flows.FollowQuery(r.opt.Backfill, newest).Encode(), func(line []byte) error {
			var fl flows.Flow
			if err := json.Unmarshal(line, &fl); err != nil {
				return fmt.Errorf("node %s sent a flow the relay cannot read: %w", st.peer.Node, err)
			}
			r.mu.Lock()
			st.lastErr = ""
			st.flows++
			r.mu.Unlock()
			newest = fl.Time
			if fl.Node == "" {
				fl.Node = st.peer.Node
			}
			r.order.add(fl)
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		st.following = false
		if err != nil {
			st.lastErr = err.Error()
		} else {
			st.lastErr = "the agent ended the stream"
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.opt.Retry):
		}
	}
}

// NodeStatus is one followed agent, as GET /v1/relay/nodes answers.
type NodeStatus struct {
	Node string `json:"node"`
	Addr string `json:"addr"`
	// Following: a stream from the agent is open or being opened; when
	// not, Error says why the last one ended (it is retried).
	Following bool   `json:"following"`
	Flows     uint64 `json:"flows"` // received since the relay found the node
	Error     string `json:"error,omitempty"`
}

// Nodes are the followed agents, by node name.
func (r *Relay) Nodes() []NodeStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []NodeStatus
	for _, st := range r.peers {
		out = append(out, NodeStatus{Node: st.peer.Node, Addr: st.peer.Addr, Following: st.following, Flows: st.flows, Error: st.lastErr})
	}
	slices.SortFunc(out, func(a, b NodeStatus) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// History is the merged flows, for a page that aggregates them.
func (r *Relay) History() *flows.History { return r.history }

// PathNodes answers the followed agents and their state.
const PathNodes = "/v1/relay/nodes"

// Handler serves GET /v1/flows (merged; the agent's query) and
// GET /v1/relay/nodes.
func (r *Relay) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /v1/flows", flows.Handler(r.history, ""))
	mux.HandleFunc("GET "+PathNodes, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(r.Nodes())
	})
	mux.HandleFunc("GET /v1/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]bool{"ok": true})
	})
	return mux
}

// reorder holds flows for a window and releases them oldest first.
type reorder struct {
	window  time.Duration
	release func(flows.Flow)

	mu   sync.Mutex
	held flowHeap
	seq  uint64 // arrival order, which breaks ties of equal times
	kick chan struct{}
}

func newReorder(window time.Duration, release func(flows.Flow)) *reorder {
	return &reorder{window: window, release: release, kick: make(chan struct{}, 1)}
}

type heldFlow struct {
	fl      flows.Flow
	arrived time.Time
	seq     uint64
}

type flowHeap []heldFlow

func (h flowHeap) Len() int { return len(h) }
func (h flowHeap) Less(i, j int) bool {
	if c := h[i].fl.Time.Compare(h[j].fl.Time); c != 0 {
		return c < 0
	}
	return h[i].seq < h[j].seq
}
func (h flowHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *flowHeap) Push(x any)   { *h = append(*h, x.(heldFlow)) }
func (h *flowHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (o *reorder) add(fl flows.Flow) {
	o.mu.Lock()
	o.seq++
	heap.Push(&o.held, heldFlow{fl: fl, arrived: time.Now(), seq: o.seq})
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// releaseDue hands on, oldest first, every held flow that has waited the
// window; it returns when the next one is due (zero: none held).
func (o *reorder) releaseDue(now time.Time) time.Time {
	o.mu.Lock()
	var due []flows.Flow
	for o.held.Len() > 0 {
		// The oldest by flow time goes once it has waited the window: a
		// flow of another node older than it would have arrived by now.
		if next := o.held[0]; now.Sub(next.arrived) < o.window {
			o.mu.Unlock()
			for _, fl := range due {
				o.release(fl)
			}
			return next.arrived.Add(o.window)
		}
		due = append(due, heap.Pop(&o.held).(heldFlow).fl)
	}
	o.mu.Unlock()
	for _, fl := range due {
		o.release(fl)
	}
	return time.Time{}
}

func (o *reorder) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := o.releaseDue(time.Now())
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-o.kick:
		case <-timer.C:
		}
	}
}
