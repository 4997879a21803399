package manifest

import (
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ShuntIdentity is one security identity, cluster-wide: its name is the
// number, its spec the (namespace, pod labels, namespace labels) it stands
// for. Agents write them (internal/kubeidentity); people only read them.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name=Namespace,type=string,JSONPath=`.spec.namespace`
// +kubebuilder:printcolumn:name=Age,type=date,JSONPath=`.metadata.creationTimestamp`
type ShuntIdentity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ShuntIdentitySpec `json:"spec"`
}

// ShuntIdentitySpec is what an identity stands for.
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="an identity never changes what it stands for: delete it instead"
type ShuntIdentitySpec struct {
	// +kubebuilder:validation:MinLength=1
	Namespace       string            `json:"namespace"`
	Labels          map[string]string `json:"labels,omitempty"`
	NamespaceLabels map[string]string `json:"namespaceLabels,omitempty"`
}

// ShuntIdentityList is a list of ShuntIdentities.
//
// +kubebuilder:object:root=true
type ShuntIdentityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []ShuntIdentity `json:"items"`
}

// DeepCopyObject implements runtime.Object.
func (i *ShuntIdentity) DeepCopyObject() runtime.Object {
	if i == nil {
		return nil
	}
	out := &ShuntIdentity{TypeMeta: i.TypeMeta}
	i.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = ShuntIdentitySpec{Namespace: i.Spec.Namespace, Labels: maps.Clone(i.Spec.Labels), NamespaceLabels: maps.Clone(i.Spec.NamespaceLabels)}
	return out
}
