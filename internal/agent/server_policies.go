package agent

import (
	"net/http"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

// handleNetworkPolicies lists every NetworkPolicy as the API server does:
// a v1 List of networking.k8s.io/v1 objects.
func (a *Agent) handleNetworkPolicies(w http.ResponseWriter, r *http.Request) {
	list := networkingv1.NetworkPolicyList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"},
		Items: []networkingv1.NetworkPolicy{}}
	for _, np := range a.objects().NetworkPolicies() {
		p := *np.DeepCopy()
		p.APIVersion, p.Kind = "networking.k8s.io/v1", "NetworkPolicy"
		list.Items = append(list.Items, p)
	}
	writeJSON(w, http.StatusOK, list)
}

// handleShuntPolicies lists every ShuntNetworkPolicy: a v1 List of
// shunt.io/v1alpha1 objects.
func (a *Agent) handleShuntPolicies(w http.ResponseWriter, r *http.Request) {
	list := manifest.ShuntNetworkPolicyList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"},
		Items: []manifest.ShuntNetworkPolicy{}}
	for _, sp := range a.objects().ShuntPolicies() {
		p := *sp.DeepCopy()
		p.APIVersion, p.Kind = manifest.ShuntAPIVersion, "ShuntNetworkPolicy"
		list.Items = append(list.Items, p)
	}
	writeJSON(w, http.StatusOK, list)
}
