package lab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// The lab's API server: what a request's objects become before they are
// stored. Decoding and field validation are internal/manifest's; here are
// the checks that need the stored objects (references, immutable fields),
// the fields the API server assigns (uid, creation time, the pod's node,
// the ClusterIP) and the garbage collector's cascades.

// admitApply returns the store after creating or updating objs, or every
// problem that refuses the request as a whole.
func (cp *ControlPlane) admitApply(cur *model.Store, objs []manifest.Object) (*model.Store, []model.Change, ipAssignment, error) {
	var problems []string
	now := metav1.Now()
	sched := newScheduler(cur, cp.cfg.NodeName)
	accepted := make([]manifest.Object, 0, len(objs))
	for _, o := range objs {
		if old, exists := cur.Get(o.Key()); exists {
			keepAssigned(old, o)
			if msg := immutableChange(old, o); msg != "" {
				problems = append(problems, fmt.Sprintf("%s: %s %s: %s", o.Source, o.Kind(), o.Key().NamespacedName(), msg))
				continue
			}
		} else {
			cp.assignOnCreate(o, now, sched)
		}
		accepted = append(accepted, o)
	}
	next, changes := cur.Put(accepted)
	// The store held its invariants before; only what changed can break
	// them (an apply never removes a namespace or a service).
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		o, _ := next.Get(c.Key)
		problems = append(problems, checkReferences(next, o)...)
	}
	if len(problems) > 0 {
		return nil, nil, ipAssignment{}, errors.New(manifest.JoinProblems("nothing applied:", problems))
	}
	ips, err := cp.clusterIPs.assign(cur, next, changes)
	if err != nil {
		return nil, nil, ipAssignment{}, err
	}
	return next, changes, ips, nil
}

// assignOnCreate fills in what the API server assigns to a new object: a
// uid and a creation time, and (playing the scheduler) the pod's node.
// Status is the kubelet's to write, never the client's; a pod whose node
// does not exist is Pending with the reason.
func (cp *ControlPlane) assignOnCreate(o manifest.Object, now metav1.Time, sched *scheduler) {
	meta, ok := o.Obj.(metav1.Object)
	if !ok {
		return
	}
	if ts := meta.GetCreationTimestamp(); ts.IsZero() {
		meta.SetCreationTimestamp(now)
	}
	if meta.GetUID() == "" {
		meta.SetUID(newUID())
	}
	switch obj := o.Obj.(type) {
	case *corev1.Pod:
		obj.Status = corev1.PodStatus{}
		switch {
		case obj.Spec.NodeName == "":
			if obj.Spec.NodeName = sched.place(obj); obj.Spec.NodeName == "" {
				obj.Status = unschedulableStatus(len(sched.nodes))
			}
		case !sched.known[obj.Spec.NodeName]:
			obj.Status = unschedulable(obj.Spec.NodeName, sched)
		default:
			sched.pods[obj.Spec.NodeName]++ // placed by its author
		}
	case *gatewayv1.HTTPRoute:
		// Its conditions say which generation of the spec they judged.
		obj.Generation = 1
		obj.Status = gatewayv1.HTTPRouteStatus{}
	case *gatewayv1.GRPCRoute:
		obj.Generation = 1
		obj.Status = gatewayv1.GRPCRouteStatus{}
	}
}

// keepAssigned carries over to an update what the API server and the
// controllers assigned and the user does not write: uid, creation time, the
// pod's node and status, an allocated ClusterIP (an update that leaves
// spec.clusterIP empty keeps the address), a route's status and generation
// (counting changes of its spec).
func keepAssigned(old, updated manifest.Object) {
	om, nm := old.Obj.(metav1.Object), updated.Obj.(metav1.Object)
	nm.SetCreationTimestamp(om.GetCreationTimestamp())
	nm.SetUID(om.GetUID())
	switch o := old.Obj.(type) {
	case *corev1.Pod:
		n := updated.Obj.(*corev1.Pod)
		if n.Spec.NodeName == "" {
			n.Spec.NodeName = o.Spec.NodeName
		}
		n.Status = o.Status
	case *corev1.Service:
		n := updated.Obj.(*corev1.Service)
		if n.Spec.ClusterIP == "" && o.Spec.ClusterIP != "" {
			n.Spec.ClusterIP, n.Spec.ClusterIPs = o.Spec.ClusterIP, o.Spec.ClusterIPs
		}
		keepExternal(o, n)
	case *gatewayv1.HTTPRoute:
		n := updated.Obj.(*gatewayv1.HTTPRoute)
		n.Generation, n.Status = o.Generation, o.Status
		if !reflect.DeepEqual(n.Spec, o.Spec) {
			n.Generation++
		}
	case *gatewayv1.GRPCRoute:
		n := updated.Obj.(*gatewayv1.GRPCRoute)
		n.Generation, n.Status = o.Generation, o.Status
		if !reflect.DeepEqual(n.Spec, o.Spec) {
			n.Generation++
		}
	}
}

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

// checkReferences reports what o names that does not exist: its namespace,
// an EndpointSlice's Service.
func checkReferences(s *model.Store, o manifest.Object) []string {
	var problems []string
	label := o.Kind() + " " + o.Key().NamespacedName()
	if ns := o.Key().Namespace; ns != "" && !s.HasNamespace(ns) {
		problems = append(problems, fmt.Sprintf("%s: %s: metadata.namespace: namespace %q not found: add a Namespace object", o.Source, label, ns))
	}
	if slice, ok := o.Obj.(*discoveryv1.EndpointSlice); ok {
		svc := slice.Labels[discoveryv1.LabelServiceName]
		if _, ok := s.Service(slice.Namespace, svc); !ok {
			problems = append(problems, fmt.Sprintf("%s: %s: metadata.labels[%s]: service %q not found in namespace %q",
				o.Source, label, discoveryv1.LabelServiceName, svc, slice.Namespace))
		}
	}
	return problems
}

// admitDelete returns the store without objs and what depends on them, as
// Kubernetes' garbage collector removes a namespace's objects and a
// service's EndpointSlices; a missing object refuses the request.
func (cp *ControlPlane) admitDelete(cur *model.Store, objs []manifest.Object) (*model.Store, []model.Change, ipAssignment, error) {
	var problems []string
	var keys []manifest.Key
	queued := map[manifest.Key]bool{}
	queue := func(k manifest.Key) {
		if !queued[k] {
			queued[k] = true
			keys = append(keys, k)
		}
	}
	for _, o := range objs {
		key := o.Key()
		if _, ok := cur.Get(key); !ok {
			if !queued[key] { // deleted with its owner earlier in this request
				problems = append(problems, fmt.Sprintf("%s: %s %s: not found", o.Source, o.Kind(), key.NamespacedName()))
			}
			continue
		}
		queue(key)
		switch key.Kind {
		case manifest.KindNamespace:
			for _, k := range cur.KeysInNamespace(key.Name) {
				queue(k)
			}
		case manifest.KindService:
			for _, sl := range cur.EndpointSlicesFor(key.Namespace, key.Name) {
				queue(manifest.Key{Kind: manifest.KindEndpointSlice, Namespace: key.Namespace, Name: sl.Name})
			}
		case manifest.KindNode:
			// The pod garbage collector: pods bound to a node that no
			// longer exists are deleted.
			for _, p := range cur.Pods() {
				if p.Spec.NodeName == key.Name {
					queue(manifest.Key{Kind: manifest.KindPod, Namespace: p.Namespace, Name: p.Name})
				}
			}
		}
	}
	if len(problems) > 0 {
		return nil, nil, ipAssignment{}, errors.New(manifest.JoinProblems("nothing deleted:", problems))
	}
	next, changes := cur.Remove(keys)
	ips, err := cp.clusterIPs.assign(cur, next, changes)
	return next, changes, ips, err
}

func newUID() types.UID {
	b := make([]byte, 16)
	rand.Read(b)
	h := hex.EncodeToString(b)
	return types.UID(h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:])
}

// clusterIPs says which service holds which ClusterIP. The address itself
// lives in the Service's spec.clusterIP, as the API server records it, so
// it is persisted with the object; this is the index that finds free ones.
type clusterIPs struct {
	pool ipam.Pool
	// lbPool is where LoadBalancer Services get their address
	// (assignExternal); invalid: none, they stay pending.
	lbPool netip.Prefix
	owner  map[netip.Addr]string // ClusterIP -> service namespace/name
}

func newClusterIPs(pool ipam.Pool, store *model.Store) clusterIPs {
	c := clusterIPs{pool: pool, owner: map[netip.Addr]string{}}
	for _, s := range store.Services() {
		if ip, err := netip.ParseAddr(s.Spec.ClusterIP); err == nil {
			c.owner[ip] = s.Namespace + "/" + s.Name
		}
	}
	return c
}

// ipAssignment is what a change does to the ClusterIPs: held becomes the
// owner of each address, freed addresses go back to the pool.
type ipAssignment struct {
	held  map[netip.Addr]string
	freed []netip.Addr
}

// assign gives each Service that changes create a ClusterIP, as the API
// server's allocator does: a requested address must be in the service CIDR
// and free, otherwise the lowest free one is taken and written into the
// object's spec (next is not published yet, and a created object is the
// request's own). old is the store the changes start from. Nothing is
// changed in c: commit does that once the whole change is accepted.
func (c *clusterIPs) assign(old, next *model.Store, changes []model.Change) (ipAssignment, error) {
	a := ipAssignment{held: map[netip.Addr]string{}}
	taken := func(ip netip.Addr) string {
		if key, ok := a.held[ip]; ok {
			return key
		}
		return c.owner[ip]
	}
	var problems []string
	var alloc *ipam.Allocator
	for _, ch := range changes {
		if ch.Key.Kind != manifest.KindService {
			continue
		}
		key := ch.Key.NamespacedName()
		switch ch.Action {
		case model.Deleted:
			if o, ok := old.Get(ch.Key); ok {
				if ip, err := netip.ParseAddr(o.Obj.(*corev1.Service).Spec.ClusterIP); err == nil {
					a.freed = append(a.freed, ip)
				}
			}
			continue
		case model.Created:
		default:
			continue // an update keeps its address (admission refuses a different one)
		}
		o, _ := next.Get(ch.Key)
		s := o.Obj.(*corev1.Service)
		switch want := s.Spec.ClusterIP; want {
		case corev1.ClusterIPNone:
		case "":
			if alloc == nil {
				alloc = c.pool.NewAllocator(func(ip netip.Addr) bool { return taken(ip) != "" })
			}
			ip, err := alloc.Next()
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: Service %s: service CIDR %v", o.Source, key, err))
				continue
			}
			a.held[ip] = key
			s.Spec.ClusterIP, s.Spec.ClusterIPs = ip.String(), []string{ip.String()}
		default:
			ip := netip.MustParseAddr(want) // validated by the manifest reader
			switch {
			case !c.pool.Contains(ip):
				problems = append(problems, fmt.Sprintf("%s: Service %s: spec.clusterIP: %s is not in the service CIDR %s", o.Source, key, ip, c.pool.CIDR))
			case taken(ip) != "": // a created service holds nothing yet
				problems = append(problems, fmt.Sprintf("%s: Service %s: spec.clusterIP: %s is already allocated to Service %s", o.Source, key, ip, taken(ip)))
			default:
				a.held[ip] = key
				s.Spec.ClusterIPs = []string{want}
			}
		}
	}
	problems = append(problems, assignExternal(next, changes, c.lbPool)...)
	problems = append(problems, checkHostPorts(next, changes)...)
	if len(problems) > 0 {
		sort.Strings(problems)
		return ipAssignment{}, errors.New(manifest.JoinProblems("nothing applied:", problems))
	}
	return a, nil
}

// commit records an accepted assignment.
func (c *clusterIPs) commit(a ipAssignment) {
	for _, ip := range a.freed {
		delete(c.owner, ip)
	}
	maps.Copy(c.owner, a.held)
}
