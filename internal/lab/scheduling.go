package lab

import (
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
