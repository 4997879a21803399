package lab

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

func TestSchedulerFilters(t *testing.T) {
	node := func(name string, labels map[string]string) manifest.Object {
		n := &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		labelNode(n)
		return manifest.Object{Obj: n}
	}
	store := model.NewStore([]manifest.Object{
		node("a", map[string]string{"zone": "one", "disk": "ssd"}),
		node("b", map[string]string{"zone": "two"}),
	})
	affinity := func(reqs ...corev1.NodeSelectorRequirement) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: reqs}}}}}
	}
	for _, c := range []struct {
		name string
		spec corev1.PodSpec
		want string
	}{
		{"nodeSelector", corev1.PodSpec{NodeSelector: map[string]string{"zone": "two"}}, "b"},
		{"hostname label", corev1.PodSpec{NodeSelector: map[string]string{corev1.LabelHostname: "a"}}, "a"},
		{"In", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"one", "three"}})}, "a"},
		{"NotIn", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"one"}})}, "b"},
		{"Exists", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorRequirement{Key: "disk", Operator: corev1.NodeSelectorOpExists})}, "a"},
		{"no node fits", corev1.PodSpec{NodeSelector: map[string]string{"zone": "three"}}, ""},
		{"selector and affinity both", corev1.PodSpec{NodeSelector: map[string]string{"zone": "two"},
			Affinity: affinity(corev1.NodeSelectorRequirement{Key: "disk", Operator: corev1.NodeSelectorOpExists})}, ""},
	} {
		s := newScheduler(store, "a")
		if got := s.place(&corev1.Pod{Spec: c.spec}); got != c.want {
			t.Errorf("%s: placed on %q, want %q", c.name, got, c.want)
		}
	}
	// Without constraints: the node with fewer pods.
	s := newScheduler(store, "a")
	if a, b := s.place(&corev1.Pod{}), s.place(&corev1.Pod{}); a != "a" || b != "b" {
		t.Errorf("spread: %s, %s; want a, b", a, b)
	}
	st := unschedulableStatus(2)
	if st.Phase != corev1.PodPending || st.Conditions[0].Type != corev1.PodScheduled || st.Conditions[0].Reason != "Unschedulable" {
		t.Errorf("unschedulable status %+v", st)
	}
}
