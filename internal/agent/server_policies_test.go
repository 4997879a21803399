package agent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

const policiesDoc = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, labels: {team: a}}
spec: {podSelector: {matchLabels: {app: web}}}
---
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: deny-db}
spec:
  podSelector: {}
  egress: [{action: deny, peers: [{entity: world}]}]
`

// The policy listings are Kubernetes-shaped: a v1 List whose items carry
// their apiVersion and kind, an empty list as [] (not null).
func TestPolicyListings(t *testing.T) {
	get := func(a *Agent, h http.HandlerFunc, out any) {
		t.Helper()
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			t.Fatal(err)
		}
	}
	a := &Agent{objects: storeOf(t, policiesDoc)}
	var nps networkingv1.NetworkPolicyList
	get(a, a.handleNetworkPolicies, &nps)
	if nps.APIVersion != "v1" || nps.Kind != "List" || len(nps.Items) != 1 {
		t.Fatalf("network policies: %+v", nps)
	}
	if np := nps.Items[0]; np.APIVersion != "networking.k8s.io/v1" || np.Kind != "NetworkPolicy" ||
		np.Namespace != "default" || np.Labels["team"] != "a" {
		t.Errorf("network policy: %+v", np)
	}
	var snps manifest.ShuntNetworkPolicyList
	get(a, a.handleShuntPolicies, &snps)
	if snps.APIVersion != "v1" || snps.Kind != "List" || len(snps.Items) != 1 {
		t.Fatalf("shunt policies: %+v", snps)
	}
	if p := snps.Items[0]; p.APIVersion != "shunt.io/v1alpha1" || p.Kind != "ShuntNetworkPolicy" || p.Name != "deny-db" ||
		len(p.Spec.Egress) != 1 || p.Spec.Egress[0].Action != "deny" {
		t.Errorf("shunt policy: %+v", p)
	}

	empty := &Agent{objects: storeOf(t, "")}
	for _, h := range []http.HandlerFunc{empty.handleNetworkPolicies, empty.handleShuntPolicies} {
		var raw struct{ Items json.RawMessage }
		get(empty, h, &raw)
		if string(raw.Items) != "[]" {
			t.Errorf("empty list has items %s, want []", raw.Items)
		}
	}
}

// storeOf returns the objects of doc, as the lab would hold them.
func storeOf(t *testing.T, doc string) func() *model.Store {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s := model.NewStore(objs)
	return func() *model.Store { return s }
}
