package lab

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
)

func labNode(name, cidr, addr string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: cidr}}
	if addr != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
	}
	return n
}

func labPod(name, node string) manifest.Object {
	p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("u-" + name)},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Command: []string{"sleep"}}}}}
	return manifest.Object{Source: "test", Obj: p}
}

// putObjects puts objects into the control plane's store as a commit
// (without the kubelet, which needs root).
func putObjects(t *testing.T, cp *ControlPlane, objs ...manifest.Object) {
	t.Helper()
	cp.mu.Lock()
	defer cp.mu.Unlock()
	next, changes := cp.store.Put(objs)
	if err := cp.commit(next, changes); err != nil {
		t.Fatal(err)
	}
}

func watchKeys(res WatchResult) string {
	var s []string
	for _, o := range res.Objects {
		objs, _ := decodeObjects([]StoredObject{o})
		for _, ob := range objs {
			s = append(s, ob.Key().String())
		}
	}
	for _, k := range res.Deleted {
		s = append(s, "-"+k.String())
	}
	return strings.Join(s, " ")
}

// TestWatch: a node with nothing gets every object; one that has a
// revision gets what changed since (changed objects, deleted keys); a
// poll with nothing new waits for the next commit, or returns empty when
// its context ends; another epoch (the control plane restarted) gets
// everything again.
func TestWatch(t *testing.T) {
	cp, _ := newControlPlane(t)
	ctx := context.Background()
	// The polls name no node: a node's poll is its heartbeat, and apply
	// would wait for it to program each change.
	if err := cp.RegisterNode(ctx, labNode("node-1", "10.244.0.0/24", "192.168.1.1")); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Apply(ctx, docs(svc("a", "")+svc("b", ""))); err != nil {
		t.Fatal(err)
	}
	full, err := cp.Watch(ctx, WatchRequest{Node: ""})
	if err != nil {
		t.Fatal(err)
	}
	if !full.Full || watchKeys(full) != "Node//node-1 Service/default/a Service/default/b" {
		t.Fatalf("first watch: full=%v %q", full.Full, watchKeys(full))
	}
	objs, err := full.Decode()
	if err != nil || len(objs) != 3 {
		t.Fatalf("decoding the objects: %v, %d", err, len(objs))
	}
	// Nothing new: the poll waits until its context ends.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	res, err := cp.Watch(short, WatchRequest{Node: "", Epoch: full.Epoch, After: full.Rev})
	cancel()
	if err != nil || res.Rev != full.Rev || len(res.Objects)+len(res.Deleted) != 0 {
		t.Fatalf("idle poll: %+v, %v", res, err)
	}
	// A commit wakes a waiting poll with just what changed.
	got := make(chan WatchResult, 1)
	go func() {
		res, _ := cp.Watch(ctx, WatchRequest{Node: "", Epoch: full.Epoch, After: full.Rev})
		got <- res
	}()
	time.Sleep(20 * time.Millisecond)
	if _, err := cp.Apply(ctx, docs(svc("c", ""))); err != nil {
		t.Fatal(err)
	}
	select {
	case res = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting poll did not wake at the commit")
	}
	if res.Full || watchKeys(res) != "Service/default/c" || res.Rev != full.Rev+1 {
		t.Fatalf("after creating c: full=%v rev %d %q", res.Full, res.Rev, watchKeys(res))
	}
	if _, err := cp.Delete(ctx, docs("apiVersion: v1\nkind: Service\nmetadata: {name: a}\n")); err != nil {
		t.Fatal(err)
	}
	res, _ = cp.Watch(ctx, WatchRequest{Node: "", Epoch: full.Epoch, After: full.Rev})
	if res.Full || watchKeys(res) != "Service/default/c -Service/default/a" {
		t.Errorf("since the first watch: full=%v %q", res.Full, watchKeys(res))
	}
	res, _ = cp.Watch(ctx, WatchRequest{Node: "", Epoch: "another", After: res.Rev})
	if !res.Full || watchKeys(res) != "Node//node-1 Service/default/b Service/default/c" {
		t.Errorf("another epoch: full=%v %q", res.Full, watchKeys(res))
	}
	// A node further behind than the log reaches gets everything.
	cp.mu.Lock()
	cp.watch.history = cp.watch.history[len(cp.watch.history)-1:]
	cp.mu.Unlock()
	res, _ = cp.Watch(ctx, WatchRequest{Node: "", Epoch: full.Epoch, After: full.Rev})
	if !res.Full {
		t.Errorf("a revision the log no longer holds got an incremental answer %q", watchKeys(res))
	}
}

// TestRegisterNodeRefuses: a node without a pod CIDR or an IPv4 address,
// one whose pod CIDR overlaps another's, one with another's address are
// refused with the field; the same node again is an update.
func TestRegisterNodeRefuses(t *testing.T) {
	cp, _ := newControlPlane(t)
	ctx := context.Background()
	if err := cp.RegisterNode(ctx, labNode("node-1", "10.244.0.0/24", "192.168.1.1")); err != nil {
		t.Fatal(err)
	}
	uid := cp.Store().Nodes()[0].UID
	for _, tc := range []struct {
		node *corev1.Node
		want string
	}{
		{labNode("node-2", "", "192.168.1.2"), "spec.podCIDR"},
		{labNode("node-2", "fd00::/64", "192.168.1.2"), "IPv4 pod CIDR"},
		{labNode("node-2", "10.244.1.0/24", ""), "status.addresses"},
		{labNode("node-2", "10.244.0.128/25", "192.168.1.2"), "overlaps node node-1's 10.244.0.0/24"},
		{labNode("node-2", "10.244.1.0/24", "192.168.1.1"), "InternalIP 192.168.1.1 is node node-1's"},
	} {
		err := cp.RegisterNode(ctx, tc.node)
		if !errors.Is(err, ErrNodeRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("node %+v: %v, want refused with %q", tc.node.Spec, err, tc.want)
		}
	}
	if n := len(cp.Store().Nodes()); n != 1 {
		t.Errorf("refused nodes were stored: %d nodes", n)
	}
	// Registering again (an agent restarted) keeps the node's identity.
	if err := cp.RegisterNode(ctx, labNode("node-1", "10.244.0.0/24", "192.168.1.1")); err != nil {
		t.Fatal(err)
	}
	if n := cp.Store().Nodes(); len(n) != 1 || n[0].UID != uid {
		t.Errorf("registering again: %d nodes, uid %s (was %s)", len(n), n[0].UID, uid)
	}
}

// TestApplyWaitsForNodes: a change returns once every live joined node's
// datapath enforces it; a node silent for longer than the grace period is
// not waited for.
func TestApplyWaitsForNodes(t *testing.T) {
	cp, _ := newControlPlane(t)
	ctx := context.Background()
	cp.leases.renew("node-2", 0)
	go func() {
		time.Sleep(150 * time.Millisecond)
		cp.mu.Lock()
		rev := cp.watch.rev
		cp.mu.Unlock()
		cp.leases.renew("node-2", rev)
	}()
	start := time.Now()
	if _, err := cp.Apply(ctx, docs(svc("a", ""))); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("apply returned after %s, before node-2 enforced it", d)
	}
	cp.leases.mu.Lock()
	cp.leases.nodes["node-2"] = lease{programmed: 0, renewed: time.Now().Add(-time.Hour)}
	cp.leases.mu.Unlock()
	start = time.Now()
	if _, err := cp.Apply(ctx, docs(svc("b", ""))); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("apply waited %s for a node silent for an hour", d)
	}
}

// TestNodeLifecycle: a joined node silent past the grace period becomes
// Ready=Unknown and its pods not ready (so they leave every Service); it
// polls again, it is Ready. The control plane's own node is never judged.
func TestNodeLifecycle(t *testing.T) {
	cp, _ := newControlPlane(t)
	cp.cfg.NodeGrace = time.Second
	ctx := context.Background()
	for _, n := range []*corev1.Node{labNode("node-1", "10.244.0.0/24", "192.168.1.1"), labNode("node-2", "10.244.1.0/24", "192.168.1.2")} {
		if err := cp.RegisterNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	putObjects(t, cp, labPod("far", "node-2"))
	ready := func(name string) corev1.ConditionStatus {
		for _, n := range cp.Store().Nodes() {
			if n.Name == name {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady {
						return c.Status
					}
				}
			}
		}
		return "none"
	}
	if err := cp.checkNodes(); err != nil || ready("node-2") != corev1.ConditionTrue {
		t.Fatalf("a node just registered: Ready=%s, %v", ready("node-2"), err)
	}
	cp.leases.mu.Lock()
	cp.leases.nodes["node-2"] = lease{renewed: time.Now().Add(-2 * time.Second)}
	cp.leases.started = time.Now().Add(-time.Hour) // node-1 never polls: it is the control plane's
	cp.leases.mu.Unlock()
	if err := cp.checkNodes(); err != nil {
		t.Fatal(err)
	}
	if ready("node-2") != corev1.ConditionUnknown || ready("node-1") != corev1.ConditionTrue {
		t.Errorf("node-2 silent: node-1 Ready=%s, node-2 Ready=%s; want True and Unknown", ready("node-1"), ready("node-2"))
	}
	p, _ := cp.Store().Pod("default", "far")
	if !hasCondition(p, corev1.PodReady, corev1.ConditionFalse) {
		t.Errorf("the silent node's pod keeps conditions %+v, want Ready False", p.Status.Conditions)
	}
	cp.leases.renew("node-2", 0)
	if err := cp.checkNodes(); err != nil || ready("node-2") != corev1.ConditionTrue {
		t.Errorf("node-2 polling again: Ready=%s, %v", ready("node-2"), err)
	}
	// A poll open for longer than the grace period (nothing changed) is
	// a live node, not a silent one.
	cp.mu.Lock()
	rev := cp.watch.rev
	cp.mu.Unlock()
	poll, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		cp.Watch(poll, WatchRequest{Node: "node-2", Epoch: cp.watch.epoch, After: rev})
		close(done)
	}()
	time.Sleep(100 * time.Millisecond)
	cp.leases.mu.Lock()
	ls := cp.leases.nodes["node-2"]
	ls.renewed = time.Now().Add(-time.Hour)
	cp.leases.nodes["node-2"] = ls
	cp.leases.mu.Unlock()
	if err := cp.checkNodes(); err != nil || ready("node-2") != corev1.ConditionTrue {
		t.Errorf("node-2 with a poll open: Ready=%s, %v", ready("node-2"), err)
	}
	cancel()
	<-done
}

func hasCondition(p *corev1.Pod, typ corev1.PodConditionType, st corev1.ConditionStatus) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status == st
		}
	}
	return false
}

// TestDeleteNodeRemovesItsPods: the pod garbage collector's part of a
// Node delete.
func TestDeleteNodeRemovesItsPods(t *testing.T) {
	cp, _ := newControlPlane(t)
	if err := cp.RegisterNode(context.Background(), labNode("node-2", "10.244.1.0/24", "192.168.1.2")); err != nil {
		t.Fatal(err)
	}
	putObjects(t, cp, labPod("far", "node-2"), labPod("near", "node-1"))
	objs, err := manifest.DecodeReferences(docs("apiVersion: v1\nkind: Node\nmetadata: {name: node-2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	next, changes, _, err := cp.admitDelete(cp.Store(), objs)
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(changes); got != "Node//node-2=deleted Pod/default/far=deleted" {
		t.Errorf("deleting node-2: %s", got)
	}
	if _, ok := next.Pod("default", "near"); !ok {
		t.Error("the other node's pod went too")
	}
}

// TestSchedule: pods naming no node go to the ready node with the fewest
// pods (counting those placed by their authors in the same request), the
// first by name among equals; a pod naming a node that does not exist is
// Pending with the reason; a lab without Nodes has one, its own.
func TestSchedule(t *testing.T) {
	cp, _ := newControlPlane(t)
	ctx := context.Background()
	pod := func(name, node string) string {
		spec := "  containers: [{name: c, command: [sleep, infinity]}]\n"
		if node != "" {
			spec = "  nodeName: " + node + "\n" + spec
		}
		return "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name + "}\nspec:\n" + spec + "---\n"
	}
	admit := func(doc string) *model.Store {
		t.Helper()
		objs, err := manifest.Decode(docs(doc))
		if err != nil {
			t.Fatal(err)
		}
		next, _, _, err := cp.admitApply(cp.Store(), objs)
		if err != nil {
			t.Fatal(err)
		}
		return next
	}
	nodeOf := func(s *model.Store, name string) string {
		p, _ := s.Pod("default", name)
		return p.Spec.NodeName
	}
	if s := admit(pod("alone", "")); nodeOf(s, "alone") != "node-1" {
		t.Errorf("a lab without Nodes placed a pod on %q", nodeOf(s, "alone"))
	}
	for _, n := range []*corev1.Node{labNode("node-1", "10.244.0.0/24", "192.168.1.1"), labNode("node-2", "10.244.1.0/24", "192.168.1.2"),
		labNode("node-3", "10.244.2.0/24", "192.168.1.3")} {
		if err := cp.RegisterNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	s := admit(pod("a", "node-1") + pod("b", "node-1") + pod("c", "node-2") + pod("px", "") + pod("py", "") + pod("pz", "") + pod("lost", "node-9"))
	if got := nodeOf(s, "px") + " " + nodeOf(s, "py") + " " + nodeOf(s, "pz"); got != "node-3 node-2 node-3" {
		t.Errorf("px, py, pz placed on %s; want node-3 node-2 node-3", got)
	}
	lost, _ := s.Pod("default", "lost")
	if lost.Status.Phase != corev1.PodPending || lost.Status.Reason != "NodeNotFound" ||
		!strings.Contains(lost.Status.Message, `"node-9" does not exist (nodes: node-1, node-2, node-3)`) {
		t.Errorf("pod for node-9: %+v", lost.Status)
	}
}

// TestClusterIdentities: a key keeps its number, new keys get the lowest
// free one, numbers survive a restart, and a new lab starts from the first
// node's own numbers.
func TestClusterIdentities(t *testing.T) {
	dir := t.TempDir()
	ids, err := NewClusterIdentities(dir, map[string]uint32{"old": policy.FirstPodIdentity + 1})
	if err != nil {
		t.Fatal(err)
	}
	keys := func(k ...string) []policy.IdentityKey {
		var out []policy.IdentityKey
		for _, s := range k {
			out = append(out, policy.IdentityKey{Key: s})
		}
		return out
	}
	got, err := ids.Resolve(context.Background(), keys("a", "old", "b"))
	if err != nil {
		t.Fatal(err)
	}
	f := policy.FirstPodIdentity
	if got["a"] != f || got["old"] != f+1 || got["b"] != f+2 {
		t.Errorf("numbers %v, want a=%d old=%d b=%d", got, f, f+1, f+2)
	}
	again, err := NewClusterIdentities(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = again.Resolve(context.Background(), keys("b", "c", "a"))
	if got["a"] != f || got["b"] != f+2 || got["c"] != f+3 {
		t.Errorf("after a restart %v, want a=%d b=%d c=%d", got, f, f+2, f+3)
	}
}
