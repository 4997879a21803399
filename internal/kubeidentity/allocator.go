// Package kubeidentity numbers security identities cluster-wide through
// ShuntIdentity objects (manifest.ShuntIdentity, deploy/crds/shunt.io_shuntidentities.yaml), so
// every agent of a cluster gives the pods of one (namespace, labels,
// namespace labels) the same number, and a number means the same pods on
// every node: what a receiving node needs to judge a sender's identity.
//
// The scheme needs no server beyond the API server. An identity's number
// is a slot derived from its key (a hash into the pod identity range); the
// object's name is the number, so creating it is the claim: the API server
// lets one create win. An agent that loses finds the winner's object: the
// same key (another agent got there first, and both now agree) or another
// key (a hash collision), in which case it tries the next slot. Every agent
// walks the same slots in the same order, so they converge on the same
// number without talking to each other, and an identity deleted and made
// again gets its old number back.
package kubeidentity

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/shuntnet/shunt/internal/kubeclient"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/policy"
)

// GVR is the ShuntIdentity resource.
var GVR = schema.GroupVersionResource{Group: "shunt.io", Version: "v1alpha1", Resource: "shuntidentities"}

// Spec is what an identity stands for (the object's spec).
type Spec = manifest.ShuntIdentitySpec

func key(s Spec) string { return policy.IdentityKeyOf(s.Namespace, s.Labels, s.NamespaceLabels) }

// slots is the size of the pod identity range.
const slots = uint64(policy.FirstCIDRIdentity - policy.FirstPodIdentity)

// maxProbes bounds the walk: with millions of slots and thousands of
// identities a key finds a free slot within a few.
const maxProbes = 64

// firstSlot is where a key's walk starts.
func firstSlot(key string) uint32 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return policy.FirstPodIdentity + uint32(h.Sum64()%slots)
}

func nextSlot(id uint32) uint32 {
	if id+1 >= policy.FirstCIDRIdentity {
		return policy.FirstPodIdentity
	}
	return id + 1
}

// Allocator knows every ShuntIdentity (an informer) and creates the
// missing ones.
type Allocator struct {
	res dynamic.NamespaceableResourceInterface
	inf cache.SharedIndexInformer
	log *slog.Logger

	mu    sync.Mutex
	byKey map[string]uint32 // key -> lowest number holding it
	byID  map[uint32]string // number -> key
	// unusedBefore: numbers the last Collect found unused.
	unusedBefore map[uint32]bool
}

// New prepares an allocator on an API server; Run starts it.
func New(rc *rest.Config, log *slog.Logger) (*Allocator, error) {
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	a := &Allocator{res: dyn.Resource(GVR), log: log.With("component", "identities"),
		byKey: map[string]uint32{}, byID: map[uint32]string{}}
	a.inf = kubeclient.DynamicInformer(dyn, GVR, 0)
	a.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.learn(o, true) },
		UpdateFunc: func(_, o any) { a.learn(o, true) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			a.learn(o, false)
		},
	})
	return a, nil
}

// Run starts the informer and waits for its first listing.
func (a *Allocator) Run(ctx context.Context) error {
	if _, err := a.res.List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("the API server does not serve ShuntIdentities: install shunt's CRDs first (kubectl apply -f deploy/crds/)")
		}
		return fmt.Errorf("listing ShuntIdentities: %w", err)
	}
	go a.inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), a.inf.HasSynced) {
		return fmt.Errorf("listing ShuntIdentities: %w (is the CRD installed? kubectl apply -f deploy/crds/)", ctx.Err())
	}
	return nil
}

// decode reads an object into its number and spec.
func decode(o any) (uint32, Spec, bool) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return 0, Spec{}, false
	}
	id, err := strconv.ParseUint(u.GetName(), 10, 32)
	if err != nil || uint32(id) < policy.FirstPodIdentity || uint32(id) >= policy.FirstCIDRIdentity {
		return 0, Spec{}, false
	}
	var s Spec
	raw, _, _ := unstructured.NestedMap(u.Object, "spec")
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &s); err != nil {
		return 0, Spec{}, false
	}
	return uint32(id), s, true
}

func (a *Allocator) learn(o any, present bool) {
	id, s, ok := decode(o)
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := key(s)
	if present {
		a.byID[id] = key
		if cur, ok := a.byKey[key]; !ok || id < cur {
			a.byKey[key] = id
		}
		return
	}
	delete(a.byID, id)
	if a.byKey[key] == id {
		delete(a.byKey, key)
		// Another number may hold the key too (made while the API server
		// was partitioned, say): the lowest stays its number.
		for other, k := range a.byID {
			if k == key && (a.byKey[key] == 0 || other < a.byKey[key]) {
				a.byKey[key] = other
			}
		}
	}
}

// Resolve gives every key its cluster-wide number, creating the identities
// no agent made yet. It fails (and the caller keeps its previous policy)
// when the API server cannot be asked.
func (a *Allocator) Resolve(ctx context.Context, keys []policy.IdentityKey) (map[string]uint32, error) {
	out := make(map[string]uint32, len(keys))
	for _, k := range keys {
		a.mu.Lock()
		id, ok := a.byKey[k.Key]
		a.mu.Unlock()
		if !ok {
			var err error
			if id, err = a.claim(ctx, k); err != nil {
				return nil, err
			}
		}
		out[k.Key] = id
	}
	return out, nil
}

// claim walks the key's slots until it owns one or finds its key there.
func (a *Allocator) claim(ctx context.Context, k policy.IdentityKey) (uint32, error) {
	spec := Spec{Namespace: k.Namespace, Labels: k.Labels, NamespaceLabels: k.NamespaceLabels}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&spec)
	if err != nil {
		return 0, err
	}
	id := firstSlot(k.Key)
	for range maxProbes {
		a.mu.Lock()
		holder, known := a.byID[id]
		a.mu.Unlock()
		if known && holder == k.Key {
			return id, nil
		}
		if !known {
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": GVR.GroupVersion().String(), "kind": "ShuntIdentity",
				"metadata": map[string]any{"name": strconv.FormatUint(uint64(id), 10)},
				"spec":     raw,
			}}
			created, err := a.res.Create(ctx, obj, metav1.CreateOptions{})
			switch {
			case err == nil:
				a.learn(created, true)
				a.log.Info("identity created", "id", id, "namespace", k.Namespace, "labels", k.Labels)
				return id, nil
			case apierrors.IsAlreadyExists(err):
				got, gerr := a.res.Get(ctx, obj.GetName(), metav1.GetOptions{})
				if gerr != nil {
					return 0, fmt.Errorf("reading ShuntIdentity %d: %w", id, gerr)
				}
				a.learn(got, true)
				if _, s, ok := decode(got); ok && key(s) == k.Key {
					return id, nil // another agent made it: we agree
				}
			default:
				return 0, fmt.Errorf("creating ShuntIdentity %d for namespace %s labels %v: %w", id, k.Namespace, k.Labels, err)
			}
		}
		id = nextSlot(id)
	}
	return 0, fmt.Errorf("no free identity within %d slots of %d for namespace %s labels %v", maxProbes, firstSlot(k.Key), k.Namespace, k.Labels)
}

// Known is the number of identities the cluster holds.
func (a *Allocator) Known() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.byID)
}

// Collect deletes the identities no pod of the cluster uses any more, once
// they were found unused by two collections in a row (so a pod this
// agent's informers have not seen yet does not lose its identity to a
// single glance). Agents may collect at the same time: deletes are
// idempotent, and a key whose identity was collected while still needed
// gets the same number again from its slot.
func (a *Allocator) Collect(ctx context.Context, inUse []policy.IdentityKey) (deleted int, err error) {
	used := make(map[string]bool, len(inUse))
	for _, k := range inUse {
		used[k.Key] = true
	}
	a.mu.Lock()
	var stale []uint32
	unused := map[uint32]bool{}
	for id, key := range a.byID {
		if used[key] {
			continue
		}
		unused[id] = true
		if a.unusedBefore[id] {
			stale = append(stale, id)
		}
	}
	a.unusedBefore = unused
	a.mu.Unlock()
	for _, id := range stale {
		err := a.res.Delete(ctx, strconv.FormatUint(uint64(id), 10), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return deleted, fmt.Errorf("deleting unused ShuntIdentity %d: %w", id, err)
		}
		deleted++
	}
	if deleted > 0 {
		a.log.Info("unused identities deleted", "count", deleted)
	}
	return deleted, nil
}
