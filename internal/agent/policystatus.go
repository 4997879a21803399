package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/shuntnet/shunt/internal/kubesource"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
)

// policyStatus writes this node's entry in each ShuntNetworkPolicy's
// status (Kubernetes mode): enforced at which generation, and the parts
// the node cannot program. Only changed entries are written, each with a
// merge patch on the node's own key, so agents never conflict.
type policyStatus struct {
	node     string
	res      dynamic.NamespaceableResourceInterface
	objects  func() *model.Store
	problems func() []policy.Problem
	settled  func() bool
	log      *slog.Logger
}

func newPolicyStatus(dyn dynamic.Interface, node string, objects func() *model.Store, problems func() []policy.Problem, settled func() bool, log *slog.Logger) *policyStatus {
	return &policyStatus{node: node, res: dyn.Resource(kubesource.ShuntPolicyGVR), objects: objects, problems: problems,
		settled: settled, log: log.With("component", "policy-status")}
}

// write brings this node's entries up to date. It does nothing while the
// datapath has not caught up with the objects: an entry says what is
// enforced, not what is about to be.
func (s *policyStatus) write(ctx context.Context) {
	if !s.settled() {
		return
	}
	byPolicy := map[manifest.Key][]string{}
	for _, p := range s.problems() {
		if p.Kind == manifest.KindShuntNetworkPolicy {
			k := manifest.Key{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name}
			byPolicy[k] = append(byPolicy[k], p.Message)
		}
	}
	for _, p := range s.objects().ShuntPolicies() {
		k := manifest.Key{Kind: manifest.KindShuntNetworkPolicy, Namespace: p.Namespace, Name: p.Name}
		want := manifest.ShuntPolicyNodeStatus{Enforced: true, ObservedGeneration: p.Generation, Problems: byPolicy[k]}
		have := p.Status.Nodes[s.node]
		have.LastUpdated = metav1.Time{}
		if reflect.DeepEqual(want, have) {
			continue
		}
		// Every field named: a merge patch leaves out what it omits, and
		// problems that are gone must go (null removes them).
		entry := map[string]any{"enforced": want.Enforced, "observedGeneration": want.ObservedGeneration,
			"problems": want.Problems, "lastUpdated": metav1.NewTime(time.Now().Truncate(time.Second))}
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"nodes": map[string]any{s.node: entry}}})
		_, err := s.res.Namespace(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "shuntd"}, "status")
		if err != nil && !apierrors.IsNotFound(err) {
			s.log.Warn("writing the policy's status", "policy", p.Namespace+"/"+p.Name, "err", err)
		}
	}
}
