// Package model is the desired state of a node: the Kubernetes objects the
// sources (lab manifests today, informers later) say should exist. Changes
// produce a new Store or an error and never a half-applied one, so an apply
// is all or nothing.
package model

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/google/btree"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

// DefaultNamespace always exists, as in Kubernetes.
const DefaultNamespace = "default"

// Store is an immutable set of objects by manifest key. Changes return a
// new Store that shares structure with the old one (copy-on-write B-trees),
// so a change of k objects among n costs O(k log n), not a copy of n.
type Store struct {
	objs *btree.BTreeG[entry] // by key: "Kind/namespace/name", so a kind is one range
	// slices indexes the EndpointSlices by the service they name:
	// "namespace/service\x00slice" -> the slice.
	slices *btree.BTreeG[entry]
}

// entry is one object under its key (in the slices index, obj.Obj is the slice).
type entry struct {
	key string
	obj manifest.Object
}

func byKey(a, b entry) bool { return a.key < b.key }

// btreeDegree suits string keys: wide nodes, few levels.
const btreeDegree = 32

// NewStore returns a store holding objs, checked like an apply.
func NewStore(objs []manifest.Object) (*Store, error) {
	empty := &Store{objs: btree.NewG(btreeDegree, byKey), slices: btree.NewG(btreeDegree, byKey)}
	s, _, err := empty.Apply(objs)
	return s, err
}

// Change says what an apply or delete did to one object.
type Change struct {
	Key    string `json:"key"`
	Action string `json:"action"` // created, configured, unchanged, deleted
}

// clone is O(1): both stores share nodes until one of them writes.
func (s *Store) clone() *Store {
	return &Store{objs: s.objs.Clone(), slices: s.slices.Clone()}
}

func sliceIndexKey(o manifest.Object) (string, bool) {
	sl, ok := o.Obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return "", false
	}
	return sl.Namespace + "/" + sl.Labels[discoveryv1.LabelServiceName] + "\x00" + sl.Name, true
}

// put stores o under key, keeping the slice index in step.
func (s *Store) put(key string, o manifest.Object) {
	if old, ok := s.objs.ReplaceOrInsert(entry{key, o}); ok {
		if k, ok := sliceIndexKey(old.obj); ok {
			s.slices.Delete(entry{key: k})
		}
	}
	if k, ok := sliceIndexKey(o); ok {
		s.slices.ReplaceOrInsert(entry{k, o})
	}
}

// remove deletes key, keeping the slice index in step.
func (s *Store) remove(key string) (manifest.Object, bool) {
	old, ok := s.objs.Delete(entry{key: key})
	if !ok {
		return manifest.Object{}, false
	}
	if k, ok := sliceIndexKey(old.obj); ok {
		s.slices.Delete(entry{key: k})
	}
	return old.obj, true
}

// Apply returns a new store with objs created or updated.
func (s *Store) Apply(objs []manifest.Object) (*Store, []Change, error) {
	next := s.clone()
	var changes []Change
	var problems []string
	now := metav1.Now()
	for _, o := range objs {
		key := o.Key()
		old, exists := next.Get(key)
		if exists {
			keepAssigned(old, o)
		} else if meta, ok := o.Obj.(metav1.Object); ok {
			if ts := meta.GetCreationTimestamp(); ts.IsZero() {
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
		next.put(key, o)
	}
	// The store held its invariants before; only what changed can break
	// them (an apply never removes a namespace or a service).
	var touched []manifest.Object
	for _, c := range changes {
		if c.Action != "unchanged" {
			o, _ := next.Get(c.Key)
			touched = append(touched, o)
		}
	}
	problems = append(problems, next.checkNamespaces(touched)...)
	problems = append(problems, next.checkSliceServices(touched)...)
	if len(problems) > 0 {
		return nil, nil, errors.New(manifest.JoinProblems("nothing applied:", problems))
	}
	return next, changes, nil
}

// keepAssigned carries over to an update what the API server assigned and
// the user does not write: the creation time and an allocated ClusterIP
// (an update that leaves spec.clusterIP empty keeps the address).
func keepAssigned(old, updated manifest.Object) {
	if meta, ok := updated.Obj.(metav1.Object); ok {
		meta.SetCreationTimestamp(old.Obj.(metav1.Object).GetCreationTimestamp())
	}
	os, ok1 := old.Obj.(*corev1.Service)
	ns, ok2 := updated.Obj.(*corev1.Service)
	if ok1 && ok2 && ns.Spec.ClusterIP == "" && os.Spec.ClusterIP != "" {
		ns.Spec.ClusterIP, ns.Spec.ClusterIPs = os.Spec.ClusterIP, os.Spec.ClusterIPs
	}
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
		if _, ok := next.remove(key); !ok {
			if !cascaded[key] { // deleted with its owner earlier in this request
				problems = append(problems, fmt.Sprintf("%s: %s %s: not found", o.Source, o.Kind(), nsName(o)))
			}
			continue
		}
		changes = append(changes, Change{key, "deleted"})
		// Dependents go with their owner, as Kubernetes' garbage collector
		// does: a namespace's objects, a service's EndpointSlices.
		ns, name := o.NamespaceName()
		var dependents []string
		switch o.Kind() {
		case "Namespace":
			dependents = next.keysInNamespace(name)
		case "Service":
			for _, sl := range next.EndpointSlicesFor(ns, name) {
				dependents = append(dependents, "EndpointSlice/"+ns+"/"+sl.Name)
			}
		}
		for _, k := range dependents {
			next.remove(k)
			cascaded[k] = true
			changes = append(changes, Change{k, "deleted"})
		}
	}
	if len(problems) > 0 {
		return nil, nil, errors.New(manifest.JoinProblems("nothing deleted:", problems))
	}
	return next, changes, nil
}

// keysInNamespace returns the keys of every namespaced object in ns: one
// range per kind, the kinds found by skipping from one to the next.
func (s *Store) keysInNamespace(ns string) []string {
	var keys []string
	from := ""
	for {
		kind := ""
		s.objs.AscendGreaterOrEqual(entry{key: from}, func(e entry) bool {
			kind, _, _ = strings.Cut(e.key, "/")
			return false
		})
		if kind == "" {
			return keys
		}
		s.objs.AscendRange(entry{key: kind + "/" + ns + "/"}, entry{key: kind + "/" + ns + "0"}, func(e entry) bool {
			keys = append(keys, e.key)
			return true
		})
		from = kind + "0" // '0' follows '/': the first key of the next kind
	}
}

// checkNamespaces reports objects whose namespace does not exist.
func (s *Store) checkNamespaces(objs []manifest.Object) []string {
	var problems []string
	for _, o := range objs {
		ns, _ := o.NamespaceName()
		if ns == "" || ns == DefaultNamespace {
			continue
		}
		if _, ok := s.Get("Namespace//" + ns); !ok {
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
		if _, ok := s.Get("Service/" + slice.Namespace + "/" + svc); !ok {
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
// a pod's spec cannot change once it runs (its labels can), nor a
// service's ClusterIP.
func immutableChange(old, updated manifest.Object) string {
	switch o := old.Obj.(type) {
	case *corev1.Pod:
		if !reflect.DeepEqual(o.Spec, updated.Obj.(*corev1.Pod).Spec) {
			return "spec: pod updates may not change the spec (only labels and annotations): delete the pod and apply it again"
		}
	case *corev1.Service:
		if want := updated.Obj.(*corev1.Service).Spec.ClusterIP; o.Spec.ClusterIP != "" && want != o.Spec.ClusterIP {
			return fmt.Sprintf("spec.clusterIP: field is immutable (%s, requested %s): delete the service first", o.Spec.ClusterIP, want)
		}
	}
	return ""
}

// Len is the number of objects.
func (s *Store) Len() int { return s.objs.Len() }

// Get returns the object with a key.
func (s *Store) Get(key string) (manifest.Object, bool) {
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

// Services returns every service, sorted by namespace and name.
func (s *Store) Services() []*corev1.Service { return ofKind[*corev1.Service](s, "Service", "") }

// ServicesIn returns the services of one namespace, sorted by name.
func (s *Store) ServicesIn(ns string) []*corev1.Service {
	return ofKind[*corev1.Service](s, "Service", ns)
}

// EndpointSlices returns the hand-written slices, sorted.
func (s *Store) EndpointSlices() []*discoveryv1.EndpointSlice {
	return ofKind[*discoveryv1.EndpointSlice](s, "EndpointSlice", "")
}

// EndpointSlicesFor returns the hand-written slices naming a service,
// sorted by name.
func (s *Store) EndpointSlicesFor(ns, service string) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	prefix := ns + "/" + service + "\x00"
	s.slices.AscendRange(entry{key: prefix}, entry{key: ns + "/" + service + "\x01"}, func(e entry) bool {
		out = append(out, e.obj.Obj.(*discoveryv1.EndpointSlice))
		return true
	})
	return out
}

// NetworkPolicies returns every Kubernetes NetworkPolicy, sorted.
func (s *Store) NetworkPolicies() []*networkingv1.NetworkPolicy {
	return ofKind[*networkingv1.NetworkPolicy](s, "NetworkPolicy", "")
}

// ShuntPolicies returns every ShuntNetworkPolicy, sorted.
func (s *Store) ShuntPolicies() []*manifest.ShuntNetworkPolicy {
	return ofKind[*manifest.ShuntNetworkPolicy](s, "ShuntNetworkPolicy", "")
}

// Pods returns every pod, sorted by namespace and name.
func (s *Store) Pods() []*corev1.Pod { return ofKind[*corev1.Pod](s, "Pod", "") }

// Namespaces returns every declared namespace plus the implicit default one.
func (s *Store) Namespaces() []*corev1.Namespace {
	out := ofKind[*corev1.Namespace](s, "Namespace", "")
	for _, ns := range out {
		if ns.Name == DefaultNamespace {
			return out
		}
	}
	def := &corev1.Namespace{}
	def.APIVersion, def.Kind, def.Name = "v1", "Namespace", DefaultNamespace
	return append([]*corev1.Namespace{def}, out...)
}

// ofKind returns the objects of one kind (of one namespace, if ns is not
// empty) in key order: one range of the tree.
func ofKind[T any](s *Store, kind, ns string) []T {
	from, to := kind+"/", kind+"0"
	if ns != "" {
		from, to = kind+"/"+ns+"/", kind+"/"+ns+"0"
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
