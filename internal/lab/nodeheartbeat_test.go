package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/shuntnet/shunt/internal/kubeclient"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// TestNodeHeartbeat, against a real API server, on a clock the test moves:
// the first beat creates the node's Lease as kubelet does (held by the
// node, its duration, renewed now, owned by the Node) and makes the Node
// Ready; later beats renew the Lease and leave an unchanged status alone
// until kubelet's report frequency passes; a Ready condition the
// node-lifecycle controller set to Unknown is set True again at once; a
// Lease someone else wrote is read again and renewed; a deleted Node gets
// no heartbeat, and its Lease, collected with it, is not made again.
func TestNodeHeartbeat(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	api, err := kubeclient.New(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	nodes, leases := c.Client.CoreV1().Nodes(), c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	node, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	h := newNodeHeartbeat(api, "n1", 8*time.Second, slog.New(slog.DiscardHandler))
	h.now = func() time.Time { return now }
	if h.renewInterval() != 2*time.Second {
		t.Errorf("an 8 s Lease renewed every %v, want 2s (a quarter, as kubelet)", h.renewInterval())
	}
	ready := func() corev1.NodeCondition {
		t.Helper()
		n, err := nodes.Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c
			}
		}
		t.Fatalf("node n1 has no Ready condition: %+v", n.Status.Conditions)
		return corev1.NodeCondition{}
	}
	beat := func() {
		t.Helper()
		if err := h.beat(ctx); err != nil {
			t.Fatalf("beat at %v: %v", now, err)
		}
	}
	renewedAt := func(want time.Time) {
		t.Helper()
		l, err := leases.Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.Time.Equal(want) {
			t.Errorf("Lease renewed at %v, want %v", l.Spec.RenewTime, want)
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "n1" || l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds != 8 ||
			len(l.OwnerReferences) != 1 || l.OwnerReferences[0].Kind != "Node" || l.OwnerReferences[0].UID != node.UID {
			t.Errorf("Lease %+v, owners %+v: want held by n1 for 8 s, owned by Node n1 (%s)", l.Spec, l.OwnerReferences, node.UID)
		}
	}

	beat()
	renewedAt(now)
	first := ready()
	if first.Status != corev1.ConditionTrue || first.Reason != nodeReadyReason || !first.LastHeartbeatTime.Time.Equal(now) {
		t.Errorf("Ready after the first beat: %+v", first)
	}

	now = now.Add(2 * time.Second)
	beat()
	renewedAt(now)
	if got := ready(); !got.LastHeartbeatTime.Equal(&first.LastHeartbeatTime) {
		t.Errorf("an unchanged Ready condition was written again 2 s later (heartbeat %v), not only every %v", got.LastHeartbeatTime, nodeStatusReportFrequency)
	}

	// The node-lifecycle controller's verdict while the agent was away.
	n, err := nodes.Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status, n.Status.Conditions[i].Reason = corev1.ConditionUnknown, "NodeStatusUnknown"
		}
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionUnknown})
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Second)
	beat()
	if got := ready(); got.Status != corev1.ConditionTrue || !got.LastHeartbeatTime.Time.Equal(now) || !got.LastTransitionTime.Time.Equal(now) {
		t.Errorf("Ready after the controller marked it Unknown: %+v, want True since %v", got, now)
	}
	n, _ = nodes.Get(ctx, "n1", metav1.GetOptions{})
	if len(n.Status.Conditions) != 2 {
		t.Errorf("conditions after the Ready patch: %+v, want the controller's MemoryPressure kept", n.Status.Conditions)
	}

	since := now
	now = now.Add(nodeStatusReportFrequency)
	beat()
	if got := ready(); !got.LastHeartbeatTime.Time.Equal(now) || !got.LastTransitionTime.Time.Equal(since) {
		t.Errorf("Ready after %v: %+v, want a heartbeat at %v, True since %v", nodeStatusReportFrequency, got, now, since)
	}

	// Someone else wrote the Lease: the renewal conflicts, the next one
	// reads it again.
	l, err := leases.Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Labels = map[string]string{"touched": "yes"}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Second)
	if err := h.beat(ctx); err == nil || !apierrors.IsConflict(err) {
		t.Errorf("renewing a Lease written meanwhile: %v, want a conflict", err)
	}
	beat()
	renewedAt(now)

	if err := nodes.Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.beat(ctx); !errors.Is(err, errNoNode) || !strings.Contains(err.Error(), "create the Node") {
		t.Errorf("beat for a deleted Node: %v, want it to say the Node does not exist", err)
	} else if next := h.after(err); next != h.renewInterval() {
		t.Errorf("a missing Node is asked for again after %v, want the renewal interval (it is not an outage)", next)
	}
	if err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := leases.Get(ctx, "n1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("the deleted Node's Lease was never collected: %v", err)
	}
	h.beat(ctx)
	if _, err := leases.Get(ctx, "n1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a beat after the Node was deleted made a Lease again: %v", err)
	}
}

// TestNodeHeartbeatKubeletEndpoint: the heartbeat publishes where the
// node's kubelet API listens: its port in daemonEndpoints, its address as
// the InternalIP of a Node that has none; an InternalIP the Node has (its
// underlay address) stays.
func TestNodeHeartbeatKubeletEndpoint(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api, err := kubeclient.New(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	nodes := c.Client.CoreV1().Nodes()
	for _, tc := range []struct {
		name, has, want string
	}{
		{"bare", "", "10.9.0.1"},
		{"underlay", "192.0.2.7", "192.0.2.7"},
	} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: tc.name}}
		if _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if tc.has != "" {
			// A patch: node IPAM may have written the Node since.
			patch := fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":%q}]}}`, tc.has)
			if _, err := nodes.Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
				t.Fatal(err)
			}
		}
		h := newNodeHeartbeat(api, tc.name, 8*time.Second, slog.New(slog.DiscardHandler))
		h.kubeletEndpoint("10.9.0.1", 10250)
		if err := h.beat(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := nodes.Get(ctx, tc.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: tc.want}}
		if got.Status.DaemonEndpoints.KubeletEndpoint.Port != 10250 || !slices.Equal(got.Status.Addresses, want) {
			t.Errorf("node %s: kubelet port %d, addresses %v: want 10250 and %v", tc.name, got.Status.DaemonEndpoints.KubeletEndpoint.Port, got.Status.Addresses, want)
		}
	}
}
