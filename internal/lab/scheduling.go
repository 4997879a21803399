package lab

import (
	"context"
	"fmt"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// The filters of kube-scheduler the lab's scheduling applies: a pod's
// nodeSelector and required node affinity (matchExpressions and
// matchFields, with kube-scheduler's own code), and the labels a kubelet
// gives its Node, which selectors name.

// labelNode gives a Node the labels a kubelet sets on its own where they
// are missing: kubernetes.io/hostname, os and arch.
func labelNode(n *corev1.Node) {
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	for k, v := range map[string]string{
		corev1.LabelHostname: n.Name, corev1.LabelOSStable: runtime.GOOS, corev1.LabelArchStable: runtime.GOARCH,
	} {
		if _, ok := n.Labels[k]; !ok {
			n.Labels[k] = v
		}
	}
}

// podFitsNode says whether the pod's nodeSelector and required node
// affinity admit the node.
func podFitsNode(pod *corev1.Pod, node *corev1.Node) bool {
	ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
	return err == nil && ok
}

// unschedulable is the status kube-scheduler writes on a pod no node fits:
// Pending, PodScheduled false for the reason Unschedulable.
func unschedulableStatus(nodes int) corev1.PodStatus {
	msg := fmt.Sprintf("0/%d nodes are available: %d node(s) didn't match Pod's node affinity/selector.", nodes, nodes)
	return corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: msg,
		LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second))}}}
}

// bindIfFits binds a pod that names no node to this node when its
// nodeSelector and node affinity admit it (kube-scheduler's filter; the
// nodes of `shunt dev cluster` each schedule for themselves). When no
// node of the cluster admits it, the pod is marked Unschedulable as
// kube-scheduler would; when another does, that node's kubelet binds it.
func (kp *kubePods) bindIfFits(ctx context.Context, p *corev1.Pod, node string) error {
	if p.Spec.NodeSelector == nil && (p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil) {
		return kp.bindHere(ctx, p, node)
	}
	nodes, err := kp.api.Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("scheduling pod %s/%s: listing nodes: %w", p.Namespace, p.Name, err)
	}
	fits := 0
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !podFitsNode(p, n) {
			continue
		}
		if n.Name == node {
			return kp.bindHere(ctx, p, node)
		}
		fits++
	}
	if fits > 0 || podCondition(p, corev1.PodScheduled) != nil {
		return nil // another node's; or marked already
	}
	np := p.DeepCopy()
	st := unschedulableStatus(len(nodes.Items))
	np.Status.Phase = st.Phase
	np.Status.Conditions = append(np.Status.Conditions, st.Conditions...)
	return kp.updateStatus(ctx, np)
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
