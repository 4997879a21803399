package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/kubecluster"
)

// nodeGrace is the node-monitor grace period of TestNodeRemoval's
// controller-manager, and its agents' Lease duration (renewed every
// quarter of it): kubelet's proportions (a 40 s Lease renewed every 10 s,
// a 50 s grace period), five times faster.
const nodeGrace = 8 * time.Second

// TestNodeRemoval: a node that goes away leaves every Service on every
// node (issue 18, item 4). Two nodes of a cluster whose controller-manager
// runs the node-lifecycle controller, taint eviction and the pod GC, with
// an 8 s grace period; each agent heartbeats for its node (Lease, Ready
// condition). Services "server" and "server-alt" have a backend pod on
// each node; the client runs on node A.
//
// (a) Node B's agent is SIGKILLed, its pods' processes run on: the
// controller marks B Ready=Unknown and its pod not ready, which leaves both
// EndpointSlices' ready endpoints and node A's service map; 50 connections
// from the client through the ClusterIP are all answered by A's backend,
// while B's pod, still running on B's pinned datapath, answers at its own
// address. B's agent restarted: B is Ready again, so is its pod, and A
// sends to it again.
//
// (b) Node B is deleted (its agent runs on and recreates nothing): the pod
// GC deletes B's pods, they leave both Services on A, and B's Lease goes
// with its Node.
//
// The times from the kill (the deletion) to each step are logged.
func TestNodeRemoval(t *testing.T) {
	c := newKubeClusterWith(t, kubecluster.Options{NodeMonitorGracePeriod: nodeGrace})
	netns, addrs, _ := newUnderlay(t, 2)
	lease := []string{"--node-lease-duration-seconds", fmt.Sprint(int(nodeGrace / time.Second))}
	a := newCrossNode(t, c, netns[0], addrs[0], overlayRouting, lease...)
	b := newCrossNode(t, c, netns[1], addrs[1], overlayRouting, lease...)

	serve := []string{"shunt", "lab", "serve", "--tcp", "7000"}
	ipA := a.runPod("default", "server-a", map[string]string{"app": "server"}, serve...)
	ipB := b.runPod("default", "server-b", map[string]string{"app": "server"}, serve...)
	a.runPod("default", "client", map[string]string{"app": "client"}, "sleep", "infinity")
	vip := a.createServerService().Spec.ClusterIP
	alt, err := c.Client.CoreV1().Services("default").Create(a.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server-alt"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{{Port: 8080, TargetPort: intstr.FromInt32(7000), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	frontends := []string{vip + ":80/TCP", alt.Spec.ClusterIP + ":8080/TCP"}
	both := map[string]bool{ipA: true, ipB: true}
	onlyA := map[string]bool{ipA: true}
	// What the cluster publishes (both Services' ready endpoints) and what
	// node A programs (its service map) name each backend they should.
	endpointsAre := func(want map[string]bool) milestone {
		return milestone{fmt.Sprintf("ready endpoints of both Services %v", slices.Sorted(maps.Keys(want))), func() (bool, string) {
			ok, got := true, ""
			for _, svc := range []string{"server", "server-alt"} {
				ready := map[string]bool{}
				for addr, r := range sliceEndpoints(a, svc) {
					if r {
						ready[addr] = true
					}
				}
				ok = ok && equalSets(ready, want)
				got += fmt.Sprintf("%s: %v ", svc, slices.Sorted(maps.Keys(ready)))
			}
			return ok, got
		}}
	}
	mapIs := func(want map[string]bool) milestone {
		return milestone{fmt.Sprintf("node A's service map backends %v", slices.Sorted(maps.Keys(want))), func() (bool, string) {
			ok, got := true, ""
			for _, fe := range frontends {
				backends := serviceBackends(a, fe)
				ok = ok && equalSets(backends, want)
				got += fmt.Sprintf("%s: %v ", fe, slices.Sorted(maps.Keys(backends)))
			}
			return ok, got
		}}
	}
	nodeBReady := func(want bool) milestone {
		return milestone{fmt.Sprintf("node B Ready=%v", want), func() (bool, string) {
			st := nodeReady(a, b.node)
			return (st == corev1.ConditionTrue) == want, "Ready=" + string(st)
		}}
	}
	waitMilestones(t, "services created", time.Now(), time.Minute, endpointsAre(both), mapIs(both))
	a.probeFrom("default", "client", "connected", "--tcp", vip+":80")

	// (a) B's agent dies; its node goes silent.
	pid := b.status().PID
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	waitMilestones(t, fmt.Sprintf("node B's agent killed (grace period %v)", nodeGrace), killed, nodeGrace+time.Minute,
		nodeBReady(false), endpointsAre(onlyA), mapIs(onlyA))
	for _, svc := range []string{"server", "server-alt"} {
		if ready, listed := sliceEndpoints(a, svc)[ipB]; !listed || ready {
			t.Errorf("B's pod %s in the EndpointSlices of %s with its node silent: listed %v, ready %v; want listed, not ready", ipB, svc, listed, ready)
		}
	}
	if got := peers(a.probeJSON("client", "--count", "50", "--tcp", vip+":80")); got["server-a"] != 50 {
		t.Errorf("50 connections through %s:80 with node B silent: answered by %v, want all by server-a", vip, got)
	}
	// The pod itself runs on, on its node's pinned datapath: it left the
	// Services because its node is unknown, not because it broke.
	a.probeFrom("default", "client", "connected", "--tcp", ipB+":7000")
	if p, err := c.Client.CoreV1().Pods("default").Get(a.ctx, "server-b", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("server-b while its node is silent (well within the 300 s toleration of the taint): %v, deletion %v", err, p.DeletionTimestamp)
	}

	restarted := time.Now()
	b.mustShunt("lab", "up")
	waitMilestones(t, "node B's agent restarted", restarted, time.Minute, nodeBReady(true), endpointsAre(both), mapIs(both))
	if got := peers(a.probeJSON("client", "--count", "50", "--tcp", vip+":80")); got["server-a"] == 0 || got["server-b"] == 0 || got["server-a"]+got["server-b"] != 50 {
		t.Errorf("50 connections through %s:80 with both nodes up: answered by %v, want both backends", vip, got)
	}

	// (b) Node B is deleted. The pod GC waits 40 s for a missing node to
	// come back, checking every 20 s.
	deleted := time.Now()
	if err := c.Client.CoreV1().Nodes().Delete(a.ctx, b.node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	podsGone := milestone{"node B's pods deleted", func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("").List(a.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + b.node})
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		return len(names) == 0, fmt.Sprintf("pods on %s: %v", b.node, names)
	}}
	// Its Lease goes with it (owned by the Node).
	leaseGone := milestone{"node B's Lease deleted", func() (bool, string) {
		_, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(a.ctx, b.node, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("get lease: %v", err)
	}}
	waitMilestones(t, "node B deleted", deleted, 3*time.Minute, leaseGone, podsGone, endpointsAre(onlyA), mapIs(onlyA))
	if got := peers(a.probeJSON("client", "--count", "50", "--tcp", vip+":80")); got["server-a"] != 50 {
		t.Errorf("50 connections through %s:80 with node B deleted: answered by %v, want all by server-a", vip, got)
	}
	// B's agent, still running, made no Lease again.
	time.Sleep(2 * nodeGrace / 4)
	if _, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(a.ctx, b.node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node B's Lease after its Node was deleted: %v, want none (its agent must not heartbeat for a deleted Node)", err)
	}
}

// milestone is a condition a test waits for.
type milestone struct {
	what string
	cond func() (bool, string) // whether it holds, and what was seen
}

// waitMilestones polls the milestones every 200 ms until each has held
// once, failing the test with the last report of those that never did
// after timeout, and logs how long after since (when event happened) each
// first held.
func waitMilestones(t *testing.T, event string, since time.Time, timeout time.Duration, ms ...milestone) {
	t.Helper()
	at := make([]time.Duration, len(ms))
	deadline := since.Add(timeout)
	for {
		var pending []string
		for i, m := range ms {
			if at[i] != 0 {
				continue
			}
			if ok, seen := m.cond(); ok {
				at[i] = time.Since(since)
			} else {
				pending = append(pending, fmt.Sprintf("%s (seen: %s)", m.what, seen))
			}
		}
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", event, timeout, strings.Join(pending, "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
	var report []string
	for i, m := range ms {
		report = append(report, fmt.Sprintf("%s after %v", m.what, at[i].Round(100*time.Millisecond)))
	}
	t.Logf("%s: %s", event, strings.Join(report, "; "))
}

// nodeReady is the status of a Node's Ready condition in the API ("" when
// it has none).
func nodeReady(k *kubeNode, node string) corev1.ConditionStatus {
	k.t.Helper()
	n, err := k.cs.CoreV1().Nodes().Get(k.ctx, node, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// sliceEndpoints are the addresses in a Service's EndpointSlices, as the
// EndpointSlice controller published them, each with whether it is ready.
func sliceEndpoints(k *kubeNode, svc string) map[string]bool {
	k.t.Helper()
	list, err := k.cs.DiscoveryV1().EndpointSlices("default").List(k.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		k.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				out[a] = e.Conditions.Ready != nil && *e.Conditions.Ready
			}
		}
	}
	return out
}

// serviceBackends are the backend addresses node k's service map holds for
// frontend (VIP:PORT/PROTO), from `shunt map dump services`.
func serviceBackends(k *kubeNode, frontend string) map[string]bool {
	k.t.Helper()
	var entries []api.ServiceEntry
	if err := json.Unmarshal([]byte(k.mustShunt("map", "dump", "services", "-o", "json")), &entries); err != nil {
		k.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		if fmt.Sprintf("%s:%d/%s", e.VIP, e.Port, e.Protocol) != frontend {
			continue
		}
		for _, b := range e.Backends { // ip:port (backend id)
			ip, _, _ := strings.Cut(b, ":")
			out[ip] = true
		}
	}
	return out
}
