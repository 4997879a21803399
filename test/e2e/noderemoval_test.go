package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
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
	// Ready endpoints of both Services, and A's service map, name each
	// backend it should.
	settled := func(want map[string]bool) func() (bool, string) {
		return func() (bool, string) {
			var got []string
			ok := true
			for _, svc := range []string{"server", "server-alt"} {
				ready := readyEndpoints(a, svc)
				ok = ok && equalSets(ready, want)
				got = append(got, fmt.Sprintf("%s ready endpoints %v", svc, slices.Sorted(maps.Keys(ready))))
			}
			for _, fe := range frontends {
				backends := serviceBackends(a, fe)
				ok = ok && equalSets(backends, want)
				got = append(got, fmt.Sprintf("node A's map %s → %v", fe, slices.Sorted(maps.Keys(backends))))
			}
			return ok, strings.Join(got, "; ")
		}
	}
	waitFor(t, "both backends in both Services on node A", time.Minute, settled(both))
	a.probeFrom("default", "client", "connected", "--tcp", vip+":80")

	// (a) B's agent dies; its node goes silent.
	pid := b.status().PID
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	notReady := waitFor(t, "node B Ready=Unknown", nodeGrace+time.Minute, func() (bool, string) {
		st := nodeReady(a, b.node)
		return st != corev1.ConditionTrue, "Ready=" + string(st)
	})
	gone := waitFor(t, "B's pod out of both Services on node A", time.Minute, settled(onlyA))
	t.Logf("node B's agent killed: node Ready=Unknown after %v, B's pod out of the ready endpoints and of node A's service map after %v (grace period %v)",
		notReady.Sub(killed).Round(100*time.Millisecond), gone.Sub(killed).Round(100*time.Millisecond), nodeGrace)
	if got := probePeers(a, "client", 50, "--tcp", vip+":80"); got["server-a"] != 50 {
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
	back := waitFor(t, "B's pod back in both Services on node A", time.Minute, settled(both))
	if st := nodeReady(a, b.node); st != corev1.ConditionTrue {
		t.Errorf("node B after its agent restarted: Ready=%s", st)
	}
	t.Logf("node B's agent restarted: B's pod back in both Services on node A after %v", back.Sub(restarted).Round(100*time.Millisecond))
	if got := probePeers(a, "client", 50, "--tcp", vip+":80"); got["server-a"] == 0 || got["server-b"] == 0 || got["server-a"]+got["server-b"] != 50 {
		t.Errorf("50 connections through %s:80 with both nodes up: answered by %v, want both backends", vip, got)
	}

	// (b) Node B is deleted.
	deleted := time.Now()
	if err := c.Client.CoreV1().Nodes().Delete(a.ctx, b.node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The pod GC waits 40 s for a missing node to come back, checking
	// every 20 s.
	collected := waitFor(t, "node B's pods deleted", 3*time.Minute, func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("").List(a.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + b.node})
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		return len(names) == 0, fmt.Sprintf("pods on %s: %v", b.node, names)
	})
	gone = waitFor(t, "B's pod out of both Services on node A", time.Minute, settled(onlyA))
	t.Logf("node B deleted: its pods garbage-collected after %v, out of both Services on node A after %v",
		collected.Sub(deleted).Round(100*time.Millisecond), gone.Sub(deleted).Round(100*time.Millisecond))
	if got := probePeers(a, "client", 50, "--tcp", vip+":80"); got["server-a"] != 50 {
		t.Errorf("50 connections through %s:80 with node B deleted: answered by %v, want all by server-a", vip, got)
	}
	// Its Lease went with it (owned by the Node), and B's agent, still
	// running, did not make another.
	waitFor(t, "node B's Lease gone", time.Minute, func() (bool, string) {
		_, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(a.ctx, b.node, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("get lease: %v", err)
	})
	time.Sleep(2 * nodeGrace / 4)
	if _, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(a.ctx, b.node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node B's Lease after its Node was deleted: %v, want none (its agent must not heartbeat for a deleted Node)", err)
	}
}

// waitFor polls cond every 200 ms until it holds, failing the test with
// its last report after timeout; it returns when it first held.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last: %s", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
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

// readyEndpoints are the addresses of a Service's EndpointSlices whose
// endpoints are ready, as the EndpointSlice controller published them.
func readyEndpoints(k *kubeNode, svc string) map[string]bool {
	k.t.Helper()
	list, err := k.cs.DiscoveryV1().EndpointSlices("default").List(k.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		k.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				for _, a := range e.Addresses {
					out[a] = true
				}
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

// probePeers makes n TCP or UDP attempts from a pod of node k and counts
// who answered (the lab server's name), or how it failed.
func probePeers(k *kubeNode, pod string, n int, target ...string) map[string]int {
	k.t.Helper()
	args := append([]string{"netns", "exec", k.instance + "-default-" + pod, filepath.Join(binDir, "shunt"),
		"lab", "probe", "-o", "json", "--expect", "any", "--timeout", "2s", "--count", fmt.Sprint(n)}, target...)
	out, err := exec.Command("ip", args...).Output()
	if err != nil {
		k.t.Fatalf("probe from %s: %v\n%s", pod, err, out)
	}
	var rs []probeResult
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r probeResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			k.t.Fatalf("probe output %q: %v", line, err)
		}
		rs = append(rs, r)
	}
	return peers(rs)
}
