package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shuntnet/shunt/internal/kubeclient"
)

// A kubelet tells the control plane that its node lives in two ways: the
// node's Lease in namespace kube-node-lease, renewed every quarter of its
// duration, and the Node's Ready condition, written when it changes and at
// least every nodeStatusReportFrequency (with lastHeartbeatTime). The
// node-lifecycle controller marks a Node whose Lease and status both went
// unrenewed for its --node-monitor-grace-period Ready=Unknown, its pods not
// ready (so their endpoints leave every Service) and taints it for
// eviction. The lab's API kubelet does the same for its node, so a node
// whose agent is gone leaves the cluster as a node whose kubelet is gone.
//
// Not client-go's lease controller (k8s.io/component-helpers/apimachinery/
// lease), which kubelet uses: it takes the full clientset, which the agent
// does not link (see internal/kubeclient).

// DefaultNodeLeaseDuration is kubelet's --node-lease-duration-seconds.
const DefaultNodeLeaseDuration = 40 * time.Second

const (
	// nodeLeaseRenewFraction of the lease's duration between renewals:
	// kubelet's (40 s leases, renewed every 10 s).
	nodeLeaseRenewFraction = 4
	// nodeStatusReportFrequency is kubelet's: with a Lease as heartbeat,
	// an unchanged Node status is written again only this often.
	nodeStatusReportFrequency = 5 * time.Minute
	// heartbeatRetry is how soon a failed heartbeat is tried again, well
	// inside any grace period (kubelet retries at once, with a backoff).
	heartbeatRetry = time.Second
)

// nodeReadyReason and its message are what this kubelet writes into the
// Node's Ready condition; the reason is kubelet's own.
const (
	nodeReadyReason  = "KubeletReady"
	nodeReadyMessage = "the shunt lab plays this node's kubelet and is posting ready status"
)

// nodeHeartbeat keeps one Node's Lease renewed and its Ready condition True.
type nodeHeartbeat struct {
	api           *kubeclient.Client
	node          string
	leaseDuration time.Duration
	log           *slog.Logger
	now           func() time.Time

	// lease is the Lease as last written: the base of the next renewal
	// (nil: read it again, after a conflict or when the Node went away).
	lease *coordinationv1.Lease
	// failing remembers that the last beat failed, so a long outage logs
	// once when it starts and once when it ends.
	failing bool
	// networkReady (a node whose CNI a DaemonSet installs) says why pods
	// cannot be networked yet: the Node is not Ready until it says nil,
	// as kubelet's NetworkReady runtime condition.
	networkReady func() error
	// address and kubeletPort are where the node's kubelet API listens
	// (kubeletapi.go), written into the Node's status with its Ready
	// condition (port 0: none; the address only on a Node that has no
	// InternalIP).
	address     string
	kubeletPort int32
}

// kubeletEndpoint sets where the node's kubelet API listens; call it
// before start.
func (h *nodeHeartbeat) kubeletEndpoint(address string, port int32) {
	h.address, h.kubeletPort = address, port
}

// endpointCurrent says whether the Node's status already names the
// kubelet API's port, and an InternalIP.
func (h *nodeHeartbeat) endpointCurrent(node *corev1.Node) bool {
	return h.kubeletPort == 0 || (node.Status.DaemonEndpoints.KubeletEndpoint.Port == h.kubeletPort && hasInternalIP(node))
}

func hasInternalIP(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Type == corev1.NodeInternalIP })
}

func newNodeHeartbeat(api *kubeclient.Client, node string, leaseDuration time.Duration, log *slog.Logger) *nodeHeartbeat {
	if leaseDuration <= 0 {
		leaseDuration = DefaultNodeLeaseDuration
	}
	return &nodeHeartbeat{api: api, node: node, leaseDuration: leaseDuration, log: log, now: time.Now}
}

// renewInterval is how often the Lease is renewed.
func (h *nodeHeartbeat) renewInterval() time.Duration {
	return h.leaseDuration / nodeLeaseRenewFraction
}

// start gives the first beat, then beats every renewal interval (sooner
// after a failure) in the background until ctx ends.
func (h *nodeHeartbeat) start(ctx context.Context) {
	next := h.after(h.beat(ctx))
	go h.run(ctx, next)
}

func (h *nodeHeartbeat) run(ctx context.Context, next time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
		err := h.beat(ctx)
		if err != nil && ctx.Err() != nil {
			return
		}
		next = h.after(err)
	}
}

// after notes how a beat went, logging when the heartbeat starts or stops
// failing (not at every retry of an outage), and says when to beat next:
// soon after a failure, at the renewal interval for a Node that does not
// exist (not an outage: it may never come).
func (h *nodeHeartbeat) after(err error) time.Duration {
	switch {
	case err == nil:
		if h.failing {
			h.log.Info("node heartbeat resumed", "node", h.node)
		}
		h.failing = false
		return h.renewInterval()
	case !h.failing:
		h.log.Warn("node heartbeat failed; retrying", "node", h.node, "err", err)
	}
	h.failing = true
	if errors.Is(err, errNoNode) {
		return h.renewInterval()
	}
	return heartbeatRetry
}

// errNoNode is a beat for a Node that does not exist.
var errNoNode = errors.New("no such Node")

// beat renews the node's Lease and, when needed, its Ready condition. A
// Node that does not exist gets neither: a kubelet registers its Node once,
// at start, and a Node deleted later stays deleted (its Lease, which it
// owns, goes with it).
func (h *nodeHeartbeat) beat(ctx context.Context) error {
	node, err := h.api.Nodes().Get(ctx, h.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		h.lease = nil
		return fmt.Errorf("%w %s, so nothing heartbeats for it: create the Node (it was deleted, or never registered)", errNoNode, h.node)
	}
	if err != nil {
		return fmt.Errorf("reading node %s for its heartbeat: %w", h.node, err)
	}
	if err := h.renewLease(ctx, node); err != nil {
		return err
	}
	return h.postReady(ctx, node)
}

// renewLease writes the Lease with a new renewTime, creating it the first
// time; a conflict (someone else wrote it) makes the next beat read it
// afresh.
func (h *nodeHeartbeat) renewLease(ctx context.Context, node *corev1.Node) error {
	leases := h.api.Leases(corev1.NamespaceNodeLease)
	if h.lease == nil {
		l, err := leases.Get(ctx, h.node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created, err := leases.Create(ctx, h.renewed(&coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: h.node, Namespace: corev1.NamespaceNodeLease},
			}, node), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("creating the Lease %s/%s of node %s: %w", corev1.NamespaceNodeLease, h.node, h.node, err)
			}
			h.lease = created
			return nil
		case err != nil:
			return fmt.Errorf("reading the Lease %s/%s of node %s: %w", corev1.NamespaceNodeLease, h.node, h.node, err)
		}
		h.lease = l
	}
	updated, err := leases.Update(ctx, h.renewed(h.lease.DeepCopy(), node), metav1.UpdateOptions{})
	if err != nil {
		h.lease = nil
		return fmt.Errorf("renewing the Lease %s/%s of node %s: %w", corev1.NamespaceNodeLease, h.node, h.node, err)
	}
	h.lease = updated
	return nil
}

// renewed fills l as kubelet writes its node's Lease: held by the node,
// for the lease duration, renewed now, and owned by the Node, so that
// deleting the Node deletes its Lease (the garbage collector).
func (h *nodeHeartbeat) renewed(l *coordinationv1.Lease, node *corev1.Node) *coordinationv1.Lease {
	holder, seconds := h.node, int32(h.leaseDuration/time.Second)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &holder, &seconds
	l.Spec.RenewTime = &metav1.MicroTime{Time: h.now()}
	owned := false
	for _, o := range l.OwnerReferences {
		owned = owned || o.UID == node.UID
	}
	if !owned {
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
	}
	return l
}

// postReady writes the Node's Ready condition True when it is not (a new
// Node, or one the node-lifecycle controller marked Unknown while this
// node's agent was away) or when its last heartbeat is older than
// nodeStatusReportFrequency. A strategic merge patch of that one
// condition: the conditions others own stay as they are.
func (h *nodeHeartbeat) postReady(ctx context.Context, node *corev1.Node) error {
	now := metav1.NewTime(h.now())
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: nodeReadyReason, Message: nodeReadyMessage,
		LastHeartbeatTime: now, LastTransitionTime: now}
	if h.networkReady != nil {
		if err := h.networkReady(); err != nil {
			// kubelet's words, which tools and people search for.
			ready.Status, ready.Reason = corev1.ConditionFalse, "KubeletNotReady"
			ready.Message = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:" + err.Error()
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady || c.Status != ready.Status {
			continue
		}
		if c.Reason == ready.Reason && c.Message == ready.Message && now.Sub(c.LastHeartbeatTime.Time) < nodeStatusReportFrequency && h.endpointCurrent(node) &&
			machineStatusCurrent(node) {
			return nil
		}
		ready.LastTransitionTime = c.LastTransitionTime
	}
	status := map[string]any{"conditions": []corev1.NodeCondition{ready}}
	if !machineStatusCurrent(node) {
		// As kubelet's first status: kube-scheduler places no pod on a
		// Node without capacity.
		machine, _ := machineStatus()
		status["capacity"], status["allocatable"], status["nodeInfo"] = machine.Capacity, machine.Allocatable, machine.NodeInfo
	}
	if h.kubeletPort != 0 {
		// The API server reaches the kubelet at the first address of its
		// --kubelet-preferred-address-types the Node has, on this port.
		// An InternalIP the Node has already stays: it is the node's
		// underlay address, which other nodes tunnel to and where the
		// kubelet API listens then.
		status["daemonEndpoints"] = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: h.kubeletPort}}
		if !hasInternalIP(node) {
			status["addresses"] = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: h.address}}
		} else if !slices.Contains(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: h.address}) {
			h.log.Warn("the Node's InternalIP is not where its kubelet API listens: the API server cannot reach it for exec, logs or port-forward (give the agent --underlay-addr with the Node's InternalIP)",
				"node", h.node, "addresses", node.Status.Addresses, "kubeletAPI", h.address)
		}
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	if _, err := h.api.Nodes().Patch(ctx, h.node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("writing the Ready condition of node %s: %w", h.node, err)
	}
	return nil
}
