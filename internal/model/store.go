// Package model is the desired state of a node: the Kubernetes objects the
// sources (lab manifests today, informers later) say should exist. Changes
// produce a new Store or an error and never a half-applied one, so an apply
// is all or nothing.
package model

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

// DefaultNamespace always exists, as in Kubernetes.
const DefaultNamespace = "default"

// Store is an immutable set of objects by manifest key.
type Store struct {
	objs   map[string]manifest.Object
	sorted []manifest.Object // Objects(), computed once: a store is not changed after Apply/Delete return
	keys   []string          // the keys of sorted

	slicesOnce  sync.Once
	slicesBySvc map[string][]*discoveryv1.EndpointSlice
}

// NewStore returns a store holding objs, checked like an apply.
func NewStore(objs []manifest.Object) (*Store, error) {
	s, _, err := (&Store{}).Apply(objs)
	return s, err
}

// Change says what an apply or delete did to one object.
type Change struct {
	Key    string `json:"key"`
	Action string `json:"action"` // created, configured, unchanged, deleted
}

func (s *Store) clone() *Store {
	c := &Store{objs: make(map[string]manifest.Object, len(s.objs))}
	for k, v := range s.objs {
		c.objs[k] = v
	}
	return c
}

// Apply returns a new store with objs created or updated.
func (s *Store) Apply(objs []manifest.Object) (*Store, []Change, error) {
	next := s.clone()
	var changes []Change
	var problems []string
	now := metav1.Now()
	for _, o := range objs {
		key := o.Key()
		old, exists := next.objs[key]
		// The API server stamps creation once; an update keeps the stamp.
		if meta, ok := o.Obj.(metav1.Object); ok {
			if exists {
				meta.SetCreationTimestamp(old.Obj.(metav1.Object).GetCreationTimestamp())
			} else if ts := meta.GetCreationTimestamp(); ts.IsZero() {
				meta.SetCreationTimestamp(now)
			}
		}
		switch {
		case !exists:
			changes = append(changes, Change{key, "created"})
		case equalIgnoringSource(old, o):
			changes = append(changes, Change{key, "unchanged"})
			continue
		default:
			if msg := immutableChange(old, o); msg != "" {
				problems = append(problems, fmt.Sprintf("%s: %s %s: %s", o.Source, o.Kind(), nsName(o), msg))
				continue
			}
			changes = append(changes, Change{key, "configured"})
		}
		next.objs[key] = o
	}
	// The store held its invariants before; only what changed can break
	// them (an apply never removes a namespace or a service).
	var touched []manifest.Object
	for _, c := range changes {
		if c.Action != "unchanged" {
			touched = append(touched, next.objs[c.Key])
		}
	}
	problems = append(problems, next.checkNamespaces(touched)...)
	problems = append(problems, next.checkSliceServices(touched)...)
	if len(problems) > 0 {
		return nil, nil, errors.New(manifest.JoinProblems("nothing applied:", problems))
	}
	next.sorted, next.keys = s.sortedAfter(next, changes)
	return next, changes, nil
}

// sortedAfter derives next's sorted objects from s's, if s has them, by
// replacing changed objects and merging in created ones: O(n + k log k)
// instead of sorting every key again.
func (s *Store) sortedAfter(next *Store, changes []Change) ([]manifest.Object, []string) {
	if s.sorted == nil {
		return nil, nil
	}
	var created []string
	for _, c := range changes {
		if c.Action == "created" {
			created = append(created, c.Key)
		}
	}
	sort.Strings(created)
	out := make([]manifest.Object, 0, len(next.objs))
	keys := make([]string, 0, len(next.objs))
	i := 0
	for _, k := range s.keys {
		for i < len(created) && created[i] < k {
			out, keys = append(out, next.objs[created[i]]), append(keys, created[i])
			i++
		}
		if cur, ok := next.objs[k]; ok {
			out, keys = append(out, cur), append(keys, k)
		}
	}
	for ; i < len(created); i++ {
		out, keys = append(out, next.objs[created[i]]), append(keys, created[i])
	}
	return out, keys
}

// Delete returns a new store without objs. Deleting a Namespace deletes
// everything in it, deleting a Service its EndpointSlices.
func (s *Store) Delete(objs []manifest.Object) (*Store, []Change, error) {
	next := s.clone()
	var changes []Change
	var problems []string
	cascaded := map[string]bool{}
	for _, o := range objs {
		key := o.Key()
		if _, ok := next.objs[key]; !ok {
			if !cascaded[key] { // deleted with its owner earlier in this request
				problems = append(problems, fmt.Sprintf("%s: %s %s: not found", o.Source, o.Kind(), nsName(o)))
			}
			continue
		}
		delete(next.objs, key)
		changes = append(changes, Change{key, "deleted"})
		// Dependents go with their owner, as Kubernetes' garbage collector
		// does: a namespace's objects, a service's EndpointSlices.
		ns, name := o.NamespaceName()
		for k, other := range next.objs {
			otherNS, _ := other.NamespaceName()
			slice, isSlice := other.Obj.(*discoveryv1.EndpointSlice)
			if (o.Kind() == "Namespace" && otherNS == name) ||
				(o.Kind() == "Service" && isSlice && otherNS == ns && slice.Labels[discoveryv1.LabelServiceName] == name) {
				delete(next.objs, k)
				cascaded[k] = true
				changes = append(changes, Change{k, "deleted"})
			}
		}
	}
	if len(problems) > 0 {
		return nil, nil, errors.New(manifest.JoinProblems("nothing deleted:", problems))
	}
	return next, changes, nil
}

// checkNamespaces reports objects whose namespace does not exist.
func (s *Store) checkNamespaces(objs []manifest.Object) []string {
	var problems []string
	for _, o := range objs {
		ns, _ := o.NamespaceName()
		if ns == "" || ns == DefaultNamespace {
			continue
		}
		if _, ok := s.objs["Namespace//"+ns]; !ok {
			problems = append(problems, fmt.Sprintf("%s: %s %s: metadata.namespace: namespace %q not found: add a Namespace object",
				o.Source, o.Kind(), nsName(o), ns))
		}
	}
	return problems
}

// checkSliceServices reports EndpointSlices whose Service does not exist.
func (s *Store) checkSliceServices(objs []manifest.Object) []string {
	var problems []string
	for _, o := range objs {
		slice, ok := o.Obj.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		svc := slice.Labels[discoveryv1.LabelServiceName]
		if _, ok := s.objs["Service/"+slice.Namespace+"/"+svc]; !ok {
			problems = append(problems, fmt.Sprintf("%s: EndpointSlice %s: metadata.labels[%s]: service %q not found in namespace %q",
				o.Source, nsName(o), discoveryv1.LabelServiceName, svc, slice.Namespace))
		}
	}
	return problems
}

func nsName(o manifest.Object) string {
	ns, name := o.NamespaceName()
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

func equalIgnoringSource(a, b manifest.Object) bool { return reflect.DeepEqual(a.Obj, b.Obj) }

// immutableChange says why an update is refused, as the API server would:
// a pod's spec cannot change once it runs (its labels can).
func immutableChange(old, updated manifest.Object) string {
	op, ok1 := old.Obj.(*corev1.Pod)
	np, ok2 := updated.Obj.(*corev1.Pod)
	if ok1 && ok2 && !reflect.DeepEqual(op.Spec, np.Spec) {
		return "spec: pod updates may not change the spec (only labels and annotations): delete the pod and apply it again"
	}
	return ""
}

// Len is the number of objects.
func (s *Store) Len() int { return len(s.objs) }

// Get returns the object with a key.
func (s *Store) Get(key string) (manifest.Object, bool) {
	o, ok := s.objs[key]
	return o, ok
}

// Objects returns every object, sorted by key. Callers must not modify it.
func (s *Store) Objects() []manifest.Object {
	if s.sorted != nil {
		return s.sorted
	}
	keys := make([]string, 0, len(s.objs))
	for k := range s.objs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]manifest.Object, len(keys))
	for i, k := range keys {
		out[i] = s.objs[k]
	}
	s.sorted, s.keys = out, keys
	return out
}

// Services returns every service, sorted by namespace and name.
func (s *Store) Services() []*corev1.Service { return ofType[*corev1.Service](s) }

// EndpointSlices returns the hand-written slices, sorted.
func (s *Store) EndpointSlices() []*discoveryv1.EndpointSlice {
	return ofType[*discoveryv1.EndpointSlice](s)
}

// EndpointSlicesByService groups the hand-written slices by the service
// they name (namespace/name), each group sorted; computed once per store.
func (s *Store) EndpointSlicesByService() map[string][]*discoveryv1.EndpointSlice {
	s.slicesOnce.Do(func() {
		s.slicesBySvc = map[string][]*discoveryv1.EndpointSlice{}
		for _, sl := range s.EndpointSlices() {
			key := sl.Namespace + "/" + sl.Labels[discoveryv1.LabelServiceName]
			s.slicesBySvc[key] = append(s.slicesBySvc[key], sl)
		}
	})
	return s.slicesBySvc
}

// NetworkPolicies returns every Kubernetes NetworkPolicy, sorted.
func (s *Store) NetworkPolicies() []*networkingv1.NetworkPolicy {
	return ofType[*networkingv1.NetworkPolicy](s)
}

// ShuntPolicies returns every ShuntNetworkPolicy, sorted.
func (s *Store) ShuntPolicies() []*manifest.ShuntNetworkPolicy {
	return ofType[*manifest.ShuntNetworkPolicy](s)
}

// Pods returns every pod, sorted by namespace and name.
func (s *Store) Pods() []*corev1.Pod { return ofType[*corev1.Pod](s) }

// Namespaces returns every declared namespace plus the implicit default one.
func (s *Store) Namespaces() []*corev1.Namespace {
	out := ofType[*corev1.Namespace](s)
	for _, ns := range out {
		if ns.Name == DefaultNamespace {
			return out
		}
	}
	def := &corev1.Namespace{}
	def.APIVersion, def.Kind, def.Name = "v1", "Namespace", DefaultNamespace
	return append([]*corev1.Namespace{def}, out...)
}

func ofType[T any](s *Store) []T {
	var out []T
	for _, o := range s.Objects() {
		if t, ok := o.Obj.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
