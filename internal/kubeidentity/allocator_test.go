package kubeidentity

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/shuntnet/shunt/internal/kubetest"
	"github.com/shuntnet/shunt/internal/policy"
)

func keys(n int) []policy.IdentityKey {
	var out []policy.IdentityKey
	for i := range n {
		l := map[string]string{"app": "app" + strconv.Itoa(i)}
		nsl := map[string]string{policy.NamespaceNameLabel: "default"}
		out = append(out, policy.IdentityKey{Key: policy.IdentityKeyOf("default", l, nsl), Namespace: "default", Labels: l, NamespaceLabels: nsl})
	}
	return out
}

// TestTwoAgentsAgree: two allocators (two agents) resolving the same keys
// at the same time against one API server give every key the same number,
// one object per key; a slot held by another key (a hash collision) is
// skipped the same way by both; a fresh allocator (an agent restarting)
// finds the same numbers.
func TestTwoAgentsAgree(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	c.Apply(t, "../../deploy/crds/shunt.io_shuntidentities.yaml")

	ks := keys(40)
	// A collision: another key already sits in the first slot of ks[0].
	squatter := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "shunt.io/v1alpha1", "kind": "ShuntIdentity",
		"metadata": map[string]any{"name": strconv.FormatUint(uint64(firstSlot(ks[0].Key)), 10)},
		"spec":     map[string]any{"namespace": "other", "labels": map[string]any{"app": "squatter"}},
	}}
	if _, err := dyn.Resource(GVR).Create(ctx, squatter, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var got [2]map[string]uint32
	var wg sync.WaitGroup
	for i := range got {
		a, err := New(c.RESTConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Run(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rerr error
			if got[i], rerr = a.Resolve(ctx, ks); rerr != nil {
				t.Error(rerr)
			}
		}()
	}
	wg.Wait()
	for _, k := range ks {
		if got[0][k.Key] == 0 || got[0][k.Key] != got[1][k.Key] {
			t.Errorf("key %v: agents gave %d and %d", k.Labels, got[0][k.Key], got[1][k.Key])
		}
	}
	if id := got[0][ks[0].Key]; id == firstSlot(ks[0].Key) {
		t.Errorf("key %v took slot %d, which another key holds", ks[0].Labels, id)
	}
	list, err := dyn.Resource(GVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(ks)+1 {
		t.Errorf("%d ShuntIdentities, want %d (one per key, plus the squatter)", len(list.Items), len(ks)+1)
	}
	for _, it := range list.Items {
		id, s, ok := decode(&it)
		if !ok {
			t.Errorf("undecodable identity %s", it.GetName())
			continue
		}
		if s.Namespace != "other" && got[0][key(s)] != id {
			t.Errorf("identity %d (%v) is not the number the agents use (%d)", id, s.Labels, got[0][key(s)])
		}
	}

	restarted, err := New(c.RESTConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.Run(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := restarted.Resolve(ctx, ks)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ks {
		if again[k.Key] != got[0][k.Key] {
			t.Errorf("after a restart key %v: %d, before %d", k.Labels, again[k.Key], got[0][k.Key])
		}
	}

	// Garbage collection: identities of keys no pod uses go on the second
	// collection that finds them unused; a key coming back gets its number
	// back.
	if n, err := restarted.Collect(ctx, ks[:10]); err != nil || n != 0 {
		t.Fatalf("first collection: deleted %d (%v), want 0: unused once is not enough", n, err)
	}
	if n, err := restarted.Collect(ctx, ks[:10]); err != nil || n != len(ks)-10+1 {
		t.Fatalf("second collection: deleted %d (%v), want %d (30 unused keys and the squatter)", n, err, len(ks)-10+1)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return restarted.Known() == 10, nil
	}); err != nil {
		t.Fatalf("identities known after the collection: %d, want 10", restarted.Known())
	}
	back, err := restarted.Resolve(ctx, ks[10:12])
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ks[10:12] {
		if back[k.Key] != got[0][k.Key] && back[k.Key] != firstSlot(k.Key) {
			t.Errorf("key %v made again: %d, before %d", k.Labels, back[k.Key], got[0][k.Key])
		}
	}
}
