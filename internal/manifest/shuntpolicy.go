package manifest

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ShuntNetworkPolicy is shunt's own policy kind (shunt.io/v1alpha1): the
// selectors of NetworkPolicy plus explicit deny, entities and L7 HTTP rules.
type ShuntNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ShuntNetworkPolicySpec `json:"spec"`
}

// ShuntNetworkPolicySpec selects pods and lists rules per direction.
type ShuntNetworkPolicySpec struct {
	PodSelector metav1.LabelSelector `json:"podSelector"`
	Ingress     []ShuntRule          `json:"ingress,omitempty"`
	Egress      []ShuntRule          `json:"egress,omitempty"`
}

// ShuntRule allows or denies traffic with the peers and ports it names.
type ShuntRule struct {
	Action string                           `json:"action,omitempty"` // allow (default) or deny; deny wins
	Peers  []ShuntPeer                      `json:"peers,omitempty"`
	Ports  []networkingv1.NetworkPolicyPort `json:"ports,omitempty"`
	HTTP   []HTTPRule                       `json:"http,omitempty"`
}

// ShuntPeer is a set of pods, a CIDR or an entity.
type ShuntPeer struct {
	PodSelector       *metav1.LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	CIDR              string                `json:"cidr,omitempty"`
	Except            []string              `json:"except,omitempty"`
	Entity            string                `json:"entity,omitempty"` // host, world, cluster, all
}

// HTTPRule matches HTTP requests; empty fields match anything.
type HTTPRule struct {
	Method  string            `json:"method,omitempty"`
	Path    string            `json:"path,omitempty"` // regular expression, anchored
	Headers map[string]string `json:"headers,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (p *ShuntNetworkPolicy) DeepCopyObject() runtime.Object {
	if p == nil {
		return nil
	}
	out := *p
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	p.Spec.PodSelector.DeepCopyInto(&out.Spec.PodSelector)
	out.Spec.Ingress = copyRules(p.Spec.Ingress)
	out.Spec.Egress = copyRules(p.Spec.Egress)
	return &out
}

func copyRules(in []ShuntRule) []ShuntRule {
	if in == nil {
		return nil
	}
	out := make([]ShuntRule, len(in))
	for i, r := range in {
		out[i] = ShuntRule{Action: r.Action}
		for _, pe := range r.Peers {
			c := ShuntPeer{CIDR: pe.CIDR, Entity: pe.Entity, Except: append([]string(nil), pe.Except...)}
			if pe.PodSelector != nil {
				c.PodSelector = pe.PodSelector.DeepCopy()
			}
			if pe.NamespaceSelector != nil {
				c.NamespaceSelector = pe.NamespaceSelector.DeepCopy()
			}
			out[i].Peers = append(out[i].Peers, c)
		}
		for _, port := range r.Ports {
			out[i].Ports = append(out[i].Ports, *port.DeepCopy())
		}
		for _, h := range r.HTTP {
			hc := HTTPRule{Method: h.Method, Path: h.Path}
			if h.Headers != nil {
				hc.Headers = map[string]string{}
				for k, v := range h.Headers {
					hc.Headers[k] = v
				}
			}
			out[i].HTTP = append(out[i].HTTP, hc)
		}
	}
	return out
}
