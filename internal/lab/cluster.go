package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
)

// A lab of several nodes (`shunt lab up --nodes N`): the first node's
// control plane serves the other nodes' agents as an API server serves
// kubelets and node agents. Each joining agent
//   - registers its Node (RegisterNode: pod CIDR, underlay address);
//   - follows the objects (Watch: what changed after the revision it has,
//     or all of them, long-polled). Each poll also says which revision
//     its datapath has programmed: that is its heartbeat (a node Lease),
//     and what Apply waits for, so a change is in force on every live node
//     when `shunt apply` returns;
//   - writes its pods' status (UpdatePodStatus), as a kubelet;
//   - numbers identities with the control plane's (ClusterIdentities).
// The node lifecycle controller (RunNodeLifecycle) marks a node whose
// agent stopped polling NotReady after a grace period, and its pods not
// ready, so they leave every Service; deleting a Node removes its pods.

// WatchRequest is a joining node's poll.
type WatchRequest struct {
	Node string `json:"node"`
	// Epoch and After name the objects the node holds: the control plane
	// run that served them and its revision. Another epoch (the control
	// plane restarted) or After 0 gets every object.
	Epoch string `json:"epoch,omitempty"`
	After uint64 `json:"after,omitempty"`
	// Programmed is the revision the node's datapath enforces.
	Programmed uint64 `json:"programmed,omitempty"`
}

// WatchResult is what changed after a WatchRequest's revision.
type WatchResult struct {
	Epoch string `json:"epoch"`
	Rev   uint64 `json:"rev"`
	// Full: Objects are every object (the node replaces what it holds);
	// else they are the objects created or changed, and Deleted the keys
	// removed, since the request's revision.
	Full    bool           `json:"full,omitempty"`
	Objects []StoredObject `json:"objects,omitempty"`
	Deleted []manifest.Key `json:"deleted,omitempty"`
}

// Decode returns the result's objects.
func (r WatchResult) Decode() ([]manifest.Object, error) { return decodeObjects(r.Objects) }

// historyLimit bounds the revisions kept for incremental watches; a node
// further behind gets every object.
const historyLimit = 4096

// revision is one commit: which objects it changed.
type revision struct {
	rev  uint64
	keys []manifest.Key
}

// watchState is the control plane's revision log. Guarded by
// ControlPlane.mu.
type watchState struct {
	epoch   string
	rev     uint64
	history []revision
	moved   chan struct{} // closed at every commit
}

func newWatchState() watchState {
	b := make([]byte, 8)
	rand.Read(b)
	return watchState{epoch: hex.EncodeToString(b), moved: make(chan struct{})}
}

// committed records a commit's changed keys and wakes the watches.
func (w *watchState) committed(keys []manifest.Key) {
	w.rev++
	w.history = append(w.history, revision{rev: w.rev, keys: keys})
	if len(w.history) > historyLimit {
		w.history = slices.Clone(w.history[len(w.history)-historyLimit/2:])
	}
	close(w.moved)
	w.moved = make(chan struct{})
}

// since lists the keys changed after rev, or false when the log no
// longer reaches back that far.
func (w *watchState) since(rev uint64) ([]manifest.Key, bool) {
	if rev == 0 || (len(w.history) > 0 && w.history[0].rev > rev+1) || (len(w.history) == 0 && rev != w.rev) {
		return nil, false
	}
	i := sort.Search(len(w.history), func(i int) bool { return w.history[i].rev > rev })
	seen := map[manifest.Key]bool{}
	var keys []manifest.Key
	for _, r := range w.history[i:] {
		for _, k := range r.keys {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	return keys, true
}

// Watch answers a joining node's poll: at once when objects changed after
// its revision, else when they do or ctx ends (then with no objects and
// the same revision).
func (cp *ControlPlane) Watch(ctx context.Context, req WatchRequest) (WatchResult, error) {
	cp.mu.Lock()
	programmed := req.Programmed
	if req.Epoch != cp.watch.epoch {
		programmed = 0 // of another run's revisions
	}
	// The node is alive while its poll is open (its agent holds the
	// connection), and when it ends.
	cp.leases.renew(req.Node, programmed)
	cp.leases.polling(req.Node, 1)
	defer cp.leases.polling(req.Node, -1)
	for req.Epoch == cp.watch.epoch && cp.watch.rev <= req.After {
		moved := cp.watch.moved
		cp.mu.Unlock()
		select {
		case <-moved:
		case <-ctx.Done():
			return WatchResult{Epoch: req.Epoch, Rev: req.After}, nil
		}
		cp.mu.Lock()
	}
	defer cp.mu.Unlock()
	res := WatchResult{Epoch: cp.watch.epoch, Rev: cp.watch.rev}
	var keys []manifest.Key
	ok := false
	if req.Epoch == cp.watch.epoch {
		keys, ok = cp.watch.since(req.After)
	}
	if !ok {
		res.Full = true
		for _, o := range cp.store.Objects() {
			keys = append(keys, o.Key())
		}
	}
	for _, k := range keys {
		o, exists := cp.store.Get(k)
		if !exists {
			res.Deleted = append(res.Deleted, k)
			continue
		}
		raw, err := json.Marshal(o.Obj)
		if err != nil {
			return WatchResult{}, fmt.Errorf("encoding %s: %w", k, err)
		}
		res.Objects = append(res.Objects, StoredObject{Source: o.Source, Object: raw})
	}
	return res, nil
}

// leases are the joining nodes' heartbeats: when each last polled, and
// the revision its datapath enforced then.
type leases struct {
	mu      sync.Mutex
	started time.Time // a node never seen since counts from here
	nodes   map[string]lease
	renewed chan struct{} // closed at every renewal
}

type lease struct {
	programmed uint64
	renewed    time.Time
	polls      int // open polls: the node is alive now
}

func newLeases() *leases {
	return &leases{started: time.Now(), nodes: map[string]lease{}, renewed: make(chan struct{})}
}

func (l *leases) renew(node string, programmed uint64) {
	if node == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.nodes[node]
	ls.programmed, ls.renewed = programmed, time.Now()
	l.nodes[node] = ls
	close(l.renewed)
	l.renewed = make(chan struct{})
}

// polling counts a node's open polls up or down; a poll that ends renews
// its lease.
func (l *leases) polling(node string, delta int) {
	if node == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.nodes[node]
	ls.polls += delta
	if delta < 0 {
		ls.renewed = time.Now()
	}
	l.nodes[node] = ls
}

// lastSeen is when the node last polled: now while a poll is open (the
// control plane's start for a node not seen since).
func (l *leases) lastSeen(node string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls, ok := l.nodes[node]
	switch {
	case !ok:
		return l.started
	case ls.polls > 0:
		return time.Now()
	}
	return ls.renewed
}

// behind lists the nodes seen within grace whose datapath does not
// enforce rev yet, and a channel closed at the next renewal.
func (l *leases) behind(rev uint64, grace time.Duration) ([]string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var late []string
	for node, ls := range l.nodes {
		if ls.programmed < rev && (ls.polls > 0 || time.Since(ls.renewed) < grace) {
			late = append(late, node)
		}
	}
	sort.Strings(late)
	return late, l.renewed
}

// waitNodes returns once every live joining node enforces rev, or says
// which do not within the bound (the change is committed either way:
// they follow it when they can).
func (cp *ControlPlane) waitNodes(ctx context.Context, rev uint64) error {
	bound := time.NewTimer(cp.cfg.nodeWaitBound())
	defer bound.Stop()
	for {
		late, renewed := cp.leases.behind(rev, cp.cfg.nodeGrace())
		if len(late) == 0 {
			return nil
		}
		select {
		case <-renewed:
		case <-ctx.Done():
			return ctx.Err()
		case <-bound.C:
			return fmt.Errorf("applied, but node(s) %s did not confirm within %s that their datapath enforces it (see `shunt status` on them)",
				strings.Join(late, ", "), cp.cfg.nodeWaitBound())
		}
	}
}

func (c Config) nodeGrace() time.Duration {
	if c.NodeGrace > 0 {
		return c.NodeGrace
	}
	return DefaultNodeGrace
}

func (c Config) nodeWaitBound() time.Duration { return 15 * time.Second }

// DefaultNodeGrace is how long a joining node may stay silent before it is
// NotReady: Kubernetes' node-monitor-grace-period.
const DefaultNodeGrace = 40 * time.Second

// ErrNodeRefused wraps a Node the control plane will not take.
var ErrNodeRefused = errors.New("node refused")

// RegisterNode takes a joining node's Node: created, or updated when its
// agent starts again. Refused with the field: a Node without a pod CIDR or
// an IPv4 InternalIP, a pod CIDR that overlaps another node's, or an
// address another node has.
func (cp *ControlPlane) RegisterNode(ctx context.Context, n *corev1.Node) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if err := checkNode(cp.store, n); err != nil {
		return fmt.Errorf("%w: %w", ErrNodeRefused, err)
	}
	node := n.DeepCopy()
	node.APIVersion, node.Kind = "v1", "Node"
	labelNode(node)
	now := metav1.Now()
	if old, ok := cp.store.Get(manifest.Key{Kind: manifest.KindNode, Name: n.Name}); ok {
		on := old.Obj.(*corev1.Node)
		node.UID, node.CreationTimestamp = on.UID, on.CreationTimestamp
	} else {
		node.UID, node.CreationTimestamp = newUID(), now
	}
	node.Status.Conditions = setNodeCondition(node.Status.Conditions, corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "AgentReady", Message: "shuntd programs this node",
	})
	if n.Name != cp.cfg.NodeName { // this node's own datapath is waited for apart
		cp.leases.renew(n.Name, 0)
	}
	next, changes := cp.store.Put([]manifest.Object{{Source: "node " + n.Name, Obj: node}})
	if !slices.ContainsFunc(changes, model.Change.Changed) {
		return nil
	}
	if err := cp.commit(next, changes); err != nil {
		return err
	}
	// Pods placed on it before it registered get their status from its
	// kubelet now; nothing else to do.
	return nil
}

// checkNode refuses a Node a lab node cannot be: what kube-controller-
// manager's node IPAM and the node's kubelet guarantee in a cluster.
func checkNode(store *model.Store, n *corev1.Node) error {
	if n.Name == "" {
		return errors.New("metadata.name: a node needs a name")
	}
	cidr, err := netip.ParsePrefix(n.Spec.PodCIDR)
	if err != nil || !cidr.Addr().Is4() {
		return fmt.Errorf("node %s: spec.podCIDR %q: a lab node needs an IPv4 pod CIDR", n.Name, n.Spec.PodCIDR)
	}
	addr := policy.NodeAddress(n, corev1.NodeInternalIP)
	if !addr.IsValid() {
		return fmt.Errorf("node %s: status.addresses: a lab node needs an IPv4 InternalIP (its underlay address)", n.Name)
	}
	for _, o := range store.Nodes() {
		if o.Name == n.Name {
			continue
		}
		if oc, err := netip.ParsePrefix(o.Spec.PodCIDR); err == nil && oc.Overlaps(cidr) {
			return fmt.Errorf("node %s: spec.podCIDR %s overlaps node %s's %s: give every node its own range", n.Name, cidr, o.Name, oc)
		}
		if policy.NodeAddress(o, corev1.NodeInternalIP) == addr {
			return fmt.Errorf("node %s: status.addresses: InternalIP %s is node %s's already: every node needs its own underlay address", n.Name, addr, o.Name)
		}
	}
	return nil
}

// setNodeCondition replaces the condition of c's type, keeping its
// transition time when its status did not change.
func setNodeCondition(conds []corev1.NodeCondition, c corev1.NodeCondition) []corev1.NodeCondition {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	c.LastHeartbeatTime, c.LastTransitionTime = now, now
	for i, old := range conds {
		if old.Type != c.Type {
			continue
		}
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		conds[i] = c
		return conds
	}
	return append(conds, c)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return true // no condition yet: as registered
}

// Errors of UpdatePodStatus, as an API server's 404 and 409.
var (
	ErrPodNotFound = errors.New("pod not found")
	ErrPodConflict = errors.New("pod changed")
)

// UpdatePodStatus writes the status a node's kubelet reports for one of
// its pods. The pod must still be the one the kubelet ran (same uid) and
// on that node.
func (cp *ControlPlane) UpdatePodStatus(ctx context.Context, node string, p *corev1.Pod) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cur, ok := cp.store.Pod(p.Namespace, p.Name)
	if !ok {
		return fmt.Errorf("%w: %s/%s", ErrPodNotFound, p.Namespace, p.Name)
	}
	if cur.UID != p.UID || cur.Spec.NodeName != node {
		return fmt.Errorf("%w: pod %s/%s is uid %s on node %s, not uid %s on %s", ErrPodConflict, p.Namespace, p.Name, cur.UID, cur.Spec.NodeName, p.UID, node)
	}
	np := cur.DeepCopy()
	np.Status = p.Status
	next, changes := cp.store.Put([]manifest.Object{{Source: "kubelet " + node, Obj: np}})
	if !slices.ContainsFunc(changes, model.Change.Changed) {
		return nil
	}
	return cp.commit(next, changes)
}

// RunNodeLifecycle is the node lifecycle controller: every second, a
// joining node whose agent has not polled within the grace period becomes
// NotReady (Ready Unknown, as Kubernetes marks a node whose kubelet stopped
// posting status) and its pods not ready, so the EndpointSlice controller
// takes them out of every Service; a node that polls again is Ready, and
// its kubelet writes its pods' readiness back.
func (cp *ControlPlane) RunNodeLifecycle(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := cp.checkNodes(); err != nil {
			cp.cfg.Log.Warn("node lifecycle", "err", err)
		}
	}
}

func (cp *ControlPlane) checkNodes() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	grace := cp.cfg.nodeGrace()
	var put []manifest.Object
	for _, n := range cp.store.Nodes() {
		if n.Name == cp.cfg.NodeName {
			continue // this node: its agent is the control plane
		}
		silent := time.Since(cp.leases.lastSeen(n.Name))
		alive := silent < grace
		if alive == nodeReady(n) {
			continue
		}
		nn := n.DeepCopy()
		if alive {
			nn.Status.Conditions = setNodeCondition(nn.Status.Conditions, corev1.NodeCondition{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "AgentReady", Message: "shuntd programs this node"})
			cp.cfg.Log.Info("node ready again", "node", n.Name)
		} else {
			nn.Status.Conditions = setNodeCondition(nn.Status.Conditions, corev1.NodeCondition{
				Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
				Message: fmt.Sprintf("shuntd stopped posting node status (silent for %s, grace %s)", silent.Truncate(time.Second), grace)})
			cp.cfg.Log.Warn("node not ready: its agent stopped polling", "node", n.Name, "silent", silent.Truncate(time.Second))
			put = append(put, podsNotReady(cp.store, n.Name)...)
		}
		put = append(put, manifest.Object{Source: "node-lifecycle-controller", Obj: nn})
	}
	if len(put) == 0 {
		return nil
	}
	next, changes := cp.store.Put(put)
	return cp.commit(next, changes)
}

// podsNotReady is what the node lifecycle controller writes for the pods
// of a node gone silent: their Ready condition false.
func podsNotReady(store *model.Store, node string) []manifest.Object {
	var out []manifest.Object
	for _, p := range store.Pods() {
		if p.Spec.NodeName != node {
			continue
		}
		np := p.DeepCopy()
		np.Status.Conditions = setCondition(np.Status.Conditions, corev1.PodCondition{
			Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "NodeNotReady", Message: "node " + node + " is not ready"})
		out = append(out, manifest.Object{Source: "node-lifecycle-controller", Obj: np})
	}
	return out
}

// scheduler places pods that name no node, as kube-scheduler would with
// nothing but pod counts to go by: on the ready node with the fewest pods
// (the first by name among equals) of those the pod's nodeSelector and
// required node affinity admit (scheduling.go). A lab without Node
// objects has one node, the control plane's own.
type scheduler struct {
	nodes []*corev1.Node
	known map[string]bool
	pods  map[string]int
}

func newScheduler(store *model.Store, own string) *scheduler {
	s := &scheduler{known: map[string]bool{own: true}, pods: map[string]int{}}
	for _, n := range store.Nodes() {
		s.known[n.Name] = true
		if nodeReady(n) {
			s.nodes = append(s.nodes, n)
		}
	}
	if len(s.nodes) == 0 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: own}}
		labelNode(n)
		s.nodes = []*corev1.Node{n}
	}
	slices.SortFunc(s.nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range store.Pods() {
		s.pods[p.Spec.NodeName]++
	}
	return s
}

// place returns the pod's node, "" when none fits.
func (s *scheduler) place(pod *corev1.Pod) string {
	var best string
	for _, n := range s.nodes {
		if podFitsNode(pod, n) && (best == "" || s.pods[n.Name] < s.pods[best]) {
			best = n.Name
		}
	}
	if best != "" {
		s.pods[best]++
	}
	return best
}

// unschedulable is the status of a pod whose spec.nodeName names no node:
// Pending, with the reason, as `kubectl describe` would show it.
func unschedulable(node string, s *scheduler) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodPending, Reason: "NodeNotFound",
		Message: fmt.Sprintf("spec.nodeName: node %q does not exist (nodes: %s); the pod waits until it registers", node, strings.Join(slices.Sorted(maps.Keys(s.known)), ", ")),
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "NodeNotFound",
			LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second))}}}
}
