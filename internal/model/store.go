// Package model is the desired state of a node: the Kubernetes objects its
// sources (the lab's emulated API server today, client-go informers later)
// say exist, exactly as an API server would hold them. The store is an
// object store and nothing more: it checks nothing and defaults nothing.
// Admission (validation, defaults, references between objects) is the
// source's job, as it is the API server's in a cluster, so objects from a
// real API server go in as they are.
package model

import (
	"reflect"
	"sync/atomic"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/google/btree"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

// DefaultNamespace always exists, as in Kubernetes.
const DefaultNamespace = "default"

// Action says what a change did to one object.
type Action string

const (
	Created    Action = "created"
	Configured Action = "configured"
	Unchanged  Action = "unchanged"
	Deleted    Action = "deleted"
)

// Change says what an apply or delete did to one object.
type Change struct {
	Key    manifest.Key
	Action Action
}

// Changed reports whether a change did anything.
func (c Change) Changed() bool { return c.Action != Unchanged }

// Store is an immutable set of objects. Changes return a new Store that
// shares structure with the old one (copy-on-write B-trees), so a change of
// k objects among n costs O(k log n), not a copy of n.
type Store struct {
	objs *btree.BTreeG[entry] // by key: kind, namespace, name, so a kind is one range
	// slices indexes the EndpointSlices by the service they name.
	slices *btree.BTreeG[sliceEntry]
	// servicesGen changes whenever a Service is created, changed or
	// removed (ServicesGeneration).
	servicesGen uint64
}

// generations numbers the Services' generations of every store, so two
// stores never share one unless one descends from the other unchanged.
var generations atomic.Uint64

// ServicesGeneration identifies the store's Services: two stores with the
// same generation hold the same Services. What is computed from the
// Services alone (their problems, say) is kept until it changes, while the
// store itself changes with every pod status or Node heartbeat.
func (s *Store) ServicesGeneration() uint64 { return s.servicesGen }

type entry struct {
	key manifest.Key
	obj manifest.Object
}

func byKey(a, b entry) bool { return a.key.Compare(b.key) < 0 }

// sliceEntry indexes one EndpointSlice under (namespace, service, name).
type sliceEntry struct {
	ns, service, name string
	slice             *discoveryv1.EndpointSlice
}

func bySlice(a, b sliceEntry) bool {
	if a.ns != b.ns {
		return a.ns < b.ns
	}
	if a.service != b.service {
		return a.service < b.service
	}
	return a.name < b.name
}

// btreeDegree suits string keys: wide nodes, few levels.
const btreeDegree = 32

// New returns an empty store.
func New() *Store {
	return &Store{objs: btree.NewG(btreeDegree, byKey), slices: btree.NewG(btreeDegree, bySlice), servicesGen: generations.Add(1)}
}

// NewStore returns a store holding objs.
func NewStore(objs []manifest.Object) *Store {
	s, _ := New().Put(objs)
	return s
}

// clone is O(1): both stores share nodes until one of them writes.
func (s *Store) clone() *Store {
	return &Store{objs: s.objs.Clone(), slices: s.slices.Clone(), servicesGen: s.servicesGen}
}

func sliceIndex(o manifest.Object) (sliceEntry, bool) {
	sl, ok := o.Obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return sliceEntry{}, false
	}
	return sliceEntry{sl.Namespace, sl.Labels[discoveryv1.LabelServiceName], sl.Name, sl}, true
}

// put stores o under key, keeping the slice index in step.
func (s *Store) put(key manifest.Key, o manifest.Object) {
	if key.Kind == manifest.KindService {
		s.servicesGen = generations.Add(1)
	}
	if old, ok := s.objs.ReplaceOrInsert(entry{key, o}); ok {
		if e, ok := sliceIndex(old.obj); ok {
			s.slices.Delete(e)
		}
	}
	if e, ok := sliceIndex(o); ok {
		s.slices.ReplaceOrInsert(e)
	}
}

// Put returns a new store with objs created or replaced. An object equal
// to the stored one (its source aside) is Unchanged and not written.
func (s *Store) Put(objs []manifest.Object) (*Store, []Change) {
	next := s.clone()
	changes := make([]Change, 0, len(objs))
	for _, o := range objs {
		key := o.Key()
		old, exists := next.Get(key)
		switch {
		case !exists:
			changes = append(changes, Change{key, Created})
		case reflect.DeepEqual(old.Obj, o.Obj):
			changes = append(changes, Change{key, Unchanged})
			continue
		default:
			changes = append(changes, Change{key, Configured})
		}
		next.put(key, o)
	}
	return next, changes
}

// Remove returns a new store without the objects of keys; keys it does not
// hold are no change.
func (s *Store) Remove(keys []manifest.Key) (*Store, []Change) {
	next := s.clone()
	var changes []Change
	for _, key := range keys {
		old, ok := next.objs.Delete(entry{key: key})
		if !ok {
			continue
		}
		if key.Kind == manifest.KindService {
			next.servicesGen = generations.Add(1)
		}
		if e, ok := sliceIndex(old.obj); ok {
			next.slices.Delete(e)
		}
		changes = append(changes, Change{key, Deleted})
	}
	return next, changes
}

// KeysInNamespace returns the keys of every namespaced object in ns: one
// range per kind, the kinds found by skipping from one to the next.
func (s *Store) KeysInNamespace(ns string) []manifest.Key {
	var keys []manifest.Key
	from := manifest.Key{}
	for {
		kind := ""
		s.objs.AscendGreaterOrEqual(entry{key: from}, func(e entry) bool {
			kind = e.key.Kind
			return false
		})
		if kind == "" {
			return keys
		}
		s.objs.AscendRange(entry{key: manifest.Key{Kind: kind, Namespace: ns}}, entry{key: manifest.Key{Kind: kind, Namespace: ns + "\x00"}}, func(e entry) bool {
			keys = append(keys, e.key)
			return true
		})
		from = manifest.Key{Kind: kind + "\x00"} // the first key of the next kind
	}
}

// Len is the number of objects.
func (s *Store) Len() int { return s.objs.Len() }

// Get returns the object with a key.
func (s *Store) Get(key manifest.Key) (manifest.Object, bool) {
	e, ok := s.objs.Get(entry{key: key})
	return e.obj, ok
}

// Objects returns every object, sorted by key.
func (s *Store) Objects() []manifest.Object {
	out := make([]manifest.Object, 0, s.objs.Len())
	s.objs.Ascend(func(e entry) bool {
		out = append(out, e.obj)
		return true
	})
	return out
}

// Service returns one service.
func (s *Store) Service(ns, name string) (*corev1.Service, bool) {
	o, ok := s.Get(manifest.Key{Kind: manifest.KindService, Namespace: ns, Name: name})
	if !ok {
		return nil, false
	}
	return o.Obj.(*corev1.Service), true
}

// Pod returns one pod.
func (s *Store) Pod(ns, name string) (*corev1.Pod, bool) {
	o, ok := s.Get(manifest.Key{Kind: manifest.KindPod, Namespace: ns, Name: name})
	if !ok {
		return nil, false
	}
	return o.Obj.(*corev1.Pod), true
}

// Services returns every service, sorted by namespace and name.
func (s *Store) Services() []*corev1.Service {
	return ofKind[*corev1.Service](s, manifest.KindService, "")
}

// ServicesIn returns the services of one namespace, sorted by name.
func (s *Store) ServicesIn(ns string) []*corev1.Service {
	return ofKind[*corev1.Service](s, manifest.KindService, ns)
}

// EndpointSlices returns every EndpointSlice, sorted.
func (s *Store) EndpointSlices() []*discoveryv1.EndpointSlice {
	return ofKind[*discoveryv1.EndpointSlice](s, manifest.KindEndpointSlice, "")
}

// EndpointSlicesFor returns the slices naming a service, sorted by name.
func (s *Store) EndpointSlicesFor(ns, service string) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	s.slices.AscendRange(sliceEntry{ns: ns, service: service}, sliceEntry{ns: ns, service: service + "\x00"}, func(e sliceEntry) bool {
		out = append(out, e.slice)
		return true
	})
	return out
}

// NetworkPolicies returns every Kubernetes NetworkPolicy, sorted.
func (s *Store) NetworkPolicies() []*networkingv1.NetworkPolicy {
	return ofKind[*networkingv1.NetworkPolicy](s, manifest.KindNetworkPolicy, "")
}

// ShuntPolicies returns every ShuntNetworkPolicy, sorted.
func (s *Store) ShuntPolicies() []*manifest.ShuntNetworkPolicy {
	return ofKind[*manifest.ShuntNetworkPolicy](s, manifest.KindShuntNetworkPolicy, "")
}

// Nodes returns every Node of the cluster, ordered by name.
func (s *Store) Nodes() []*corev1.Node { return ofKind[*corev1.Node](s, manifest.KindNode, "") }

// Pods returns every pod, sorted by namespace and name.
func (s *Store) Pods() []*corev1.Pod { return ofKind[*corev1.Pod](s, manifest.KindPod, "") }

// PodsIn returns the pods of one namespace, sorted by name.
func (s *Store) PodsIn(ns string) []*corev1.Pod { return ofKind[*corev1.Pod](s, manifest.KindPod, ns) }

// HasNamespace reports whether a namespace exists (default always does).
func (s *Store) HasNamespace(ns string) bool {
	if ns == DefaultNamespace {
		return true
	}
	_, ok := s.Get(manifest.Key{Kind: manifest.KindNamespace, Name: ns})
	return ok
}

// Namespaces returns every declared namespace plus the implicit default one.
func (s *Store) Namespaces() []*corev1.Namespace {
	out := ofKind[*corev1.Namespace](s, manifest.KindNamespace, "")
	for _, ns := range out {
		if ns.Name == DefaultNamespace {
			return out
		}
	}
	def := &corev1.Namespace{}
	def.APIVersion, def.Kind, def.Name = "v1", manifest.KindNamespace, DefaultNamespace
	return append([]*corev1.Namespace{def}, out...)
}

// ofKind returns the objects of one kind (of one namespace, if ns is not
// empty) in key order: one range of the tree.
func ofKind[T any](s *Store, kind, ns string) []T {
	from, to := manifest.Key{Kind: kind}, manifest.Key{Kind: kind + "\x00"}
	if ns != "" {
		from, to = manifest.Key{Kind: kind, Namespace: ns}, manifest.Key{Kind: kind, Namespace: ns + "\x00"}
	}
	var out []T
	s.objs.AscendRange(entry{key: from}, entry{key: to}, func(e entry) bool {
		if t, ok := e.obj.Obj.(T); ok {
			out = append(out, t)
		}
		return true
	})
	return out
}

// HTTPRoutes lists the Gateway API HTTPRoutes of every namespace.
func (s *Store) HTTPRoutes() []*gatewayv1.HTTPRoute {
	return ofKind[*gatewayv1.HTTPRoute](s, manifest.KindHTTPRoute, "")
}

// GRPCRoutes lists the Gateway API GRPCRoutes of every namespace.
func (s *Store) GRPCRoutes() []*gatewayv1.GRPCRoute {
	return ofKind[*gatewayv1.GRPCRoute](s, manifest.KindGRPCRoute, "")
}

// GRPCRoutesIn returns the GRPCRoutes of one namespace, sorted by name.
func (s *Store) GRPCRoutesIn(ns string) []*gatewayv1.GRPCRoute {
	return ofKind[*gatewayv1.GRPCRoute](s, manifest.KindGRPCRoute, ns)
}

// ReferenceGrants lists the Gateway API ReferenceGrants of every namespace.
func (s *Store) ReferenceGrants() []*gatewayv1beta1.ReferenceGrant {
	return ofKind[*gatewayv1beta1.ReferenceGrant](s, manifest.KindReferenceGrant, "")
}

// HTTPRoutesIn returns the HTTPRoutes of one namespace, sorted by name.
func (s *Store) HTTPRoutesIn(ns string) []*gatewayv1.HTTPRoute {
	return ofKind[*gatewayv1.HTTPRoute](s, manifest.KindHTTPRoute, ns)
}
