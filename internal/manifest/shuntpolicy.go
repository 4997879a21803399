// The kubebuilder markers below generate the CRDs in deploy/crds
// (internal/manifest/generate.go) from these types, so the lab and a real
// API server accept the same objects.

// +groupName=shunt.io
// +versionName=v1alpha1
package manifest

import (
	"maps"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ShuntNetworkPolicy is shunt's own policy kind (apiVersion shunt.io/v1alpha1):
// the selectors of NetworkPolicy plus explicit deny rules, entities (host,
// world, ...) and L7 HTTP rules.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=snp
// +kubebuilder:subresource:status
type ShuntNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ShuntNetworkPolicySpec `json:"spec"`
	// Status is written by the nodes' agents; it is not part of the policy.
	// +optional
	Status ShuntNetworkPolicyStatus `json:"status,omitempty"`
}

// ShuntNetworkPolicyStatus is each node's enforcement of the policy. Each
// agent writes only its own key (a merge patch), so nodes never conflict.
type ShuntNetworkPolicyStatus struct {
	// Nodes maps a node's name to its enforcement of the policy.
	// +optional
	Nodes map[string]ShuntPolicyNodeStatus `json:"nodes,omitempty"`
}

// ShuntPolicyNodeStatus is one node's enforcement of a policy.
type ShuntPolicyNodeStatus struct {
	// Enforced says the node's datapath enforces the policy at
	// observedGeneration (with problems, all but the parts they name).
	Enforced bool `json:"enforced"`
	// ObservedGeneration is the generation of the policy the node programmed.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Problems are the parts of the policy the node cannot program.
	// +optional
	Problems []string `json:"problems,omitempty"`
	// LastUpdated is when the node last changed this entry.
	LastUpdated metav1.Time `json:"lastUpdated"`
}

// ShuntNetworkPolicyList is a list of ShuntNetworkPolicies, as `shunt get`
// prints them.
//
// +kubebuilder:object:root=true
type ShuntNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []ShuntNetworkPolicy `json:"items"`
}

// ShuntNetworkPolicySpec selects the pods the policy applies to and lists
// its rules per direction.
type ShuntNetworkPolicySpec struct {
	// PodSelector selects pods in the policy's namespace; {} selects all.
	PodSelector metav1.LabelSelector `json:"podSelector"`
	Ingress     []ShuntRule          `json:"ingress,omitempty"`
	Egress      []ShuntRule          `json:"egress,omitempty"`
}

// Rule actions.
const (
	ActionAllow = "allow"
	ActionDeny  = "deny"
)

// Peer entities: address sets that are not pods.
const (
	EntityHost    = "host"    // the node itself
	EntityWorld   = "world"   // everything outside the cluster
	EntityCluster = "cluster" // every pod and node of the cluster
	EntityAll     = "all"     // anything
)

// ShuntRule allows or denies traffic to/from its peers on its ports.
type ShuntRule struct {
	// Action is "allow" (the default) or "deny".
	// +kubebuilder:validation:Enum=allow;deny
	Action string `json:"action,omitempty"`
	// Peers are the other ends of the traffic; none means any peer.
	Peers []ShuntPeer `json:"peers,omitempty"`
	// Ports restricts the rule to these ports; none means all ports.
	Ports []networkingv1.NetworkPolicyPort `json:"ports,omitempty"`
	// HTTP restricts the rule to matching HTTP requests; none means any traffic.
	HTTP []HTTPRule `json:"http,omitempty"`
}

// ShuntPeer is one peer: pods (selected by podSelector and/or
// namespaceSelector), a CIDR with exceptions, or an entity. Exactly one of
// those forms must be used.
type ShuntPeer struct {
	PodSelector       *metav1.LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	CIDR              string                `json:"cidr,omitempty"`
	Except            []string              `json:"except,omitempty"`
	// +kubebuilder:validation:Enum=host;world;cluster;all
	Entity string `json:"entity,omitempty"` // host, world, cluster or all
}

// HTTPRule matches HTTP requests; an empty field matches anything.
type HTTPRule struct {
	Method  string            `json:"method,omitempty"`  // e.g. GET
	Path    string            `json:"path,omitempty"`    // regular expression (RE2) over the whole path
	Headers map[string]string `json:"headers,omitempty"` // header name -> exact value
}

// DeepCopyObject implements runtime.Object.
func (p *ShuntNetworkPolicy) DeepCopyObject() runtime.Object {
	if c := p.DeepCopy(); c != nil {
		return c
	}
	return nil // a typed nil in an interface would not be == nil
}

// DeepCopy returns a copy of p sharing no memory with it. nil and empty
// slices and maps stay as they were, so copies compare equal with
// reflect.DeepEqual.
func (p *ShuntNetworkPolicy) DeepCopy() *ShuntNetworkPolicy {
	if p == nil {
		return nil
	}
	out := &ShuntNetworkPolicy{TypeMeta: p.TypeMeta}
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	p.Spec.PodSelector.DeepCopyInto(&out.Spec.PodSelector)
	out.Spec.Ingress = copyRules(p.Spec.Ingress)
	out.Spec.Egress = copyRules(p.Spec.Egress)
	if p.Status.Nodes != nil {
		out.Status.Nodes = make(map[string]ShuntPolicyNodeStatus, len(p.Status.Nodes))
		for n, st := range p.Status.Nodes {
			st.Problems = copySlice(st.Problems)
			out.Status.Nodes[n] = st
		}
	}
	return out
}

func copyRules(in []ShuntRule) []ShuntRule {
	if in == nil {
		return nil
	}
	out := make([]ShuntRule, len(in))
	for i, r := range in {
		out[i].Action = r.Action
		if r.Peers != nil {
			out[i].Peers = make([]ShuntPeer, len(r.Peers))
			for j, pe := range r.Peers {
				out[i].Peers[j] = ShuntPeer{
					PodSelector:       pe.PodSelector.DeepCopy(), // nil-safe
					NamespaceSelector: pe.NamespaceSelector.DeepCopy(),
					CIDR:              pe.CIDR,
					Except:            copySlice(pe.Except),
					Entity:            pe.Entity,
				}
			}
		}
		if r.Ports != nil {
			out[i].Ports = make([]networkingv1.NetworkPolicyPort, len(r.Ports))
			for j := range r.Ports {
				r.Ports[j].DeepCopyInto(&out[i].Ports[j])
			}
		}
		if r.HTTP != nil {
			out[i].HTTP = make([]HTTPRule, len(r.HTTP))
			for j, h := range r.HTTP {
				out[i].HTTP[j] = HTTPRule{Method: h.Method, Path: h.Path, Headers: maps.Clone(h.Headers)}
			}
		}
	}
	return out
}

// copySlice copies s, keeping nil and empty apart.
func copySlice[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}
