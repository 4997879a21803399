package services

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// Tracker keeps the service table computed from Services and
// EndpointSlices and recomputes only the services a change touches, so a
// change to one service of 10 000 computes one and writes one (kube-proxy's
// change tracker). It reads objects only: whoever wrote the EndpointSlices
// (the lab's controller, a cluster's) does not matter.
type Tracker struct {
	node  Node
	ports map[types.NamespacedName][]Port // computed ports by service
	dirty map[types.NamespacedName]bool
	// hostPorts are the frontends of the hostPorts of this node's pods,
	// by pod; dirtyPods the pods changed since the last Compute.
	hostPorts map[types.NamespacedName][]Port
	dirtyPods map[types.NamespacedName]bool
	full      bool // the next Compute starts from scratch
}

// NewTracker returns a tracker whose first Compute covers every service,
// for a node without NodePort addresses (ClusterIPs, externalIPs and load
// balancer addresses only).
func NewTracker() *Tracker { return NewTrackerFor(Node{}) }

// NewTrackerFor returns a tracker computing node's table: its endpoints
// are the local ones of externalTrafficPolicy Local, its NodePort
// addresses serve every nodePort.
func NewTrackerFor(node Node) *Tracker {
	return &Tracker{node: node, ports: map[types.NamespacedName][]Port{}, dirty: map[types.NamespacedName]bool{},
		hostPorts: map[types.NamespacedName][]Port{}, dirtyPods: map[types.NamespacedName]bool{}, full: true}
}

// Delta is what a Compute changed. Full means the table was computed from
// scratch: the caller writes all of Ports(), not only Upsert.
type Delta struct {
	Full   bool
	Upsert []Port     // ports new or changed
	Remove []Frontend // frontends gone
}

// Empty reports whether nothing changed.
func (d Delta) Empty() bool { return !d.Full && len(d.Upsert) == 0 && len(d.Remove) == 0 }

// Touch marks the services that changes (from old to next) can change: a
// Service itself, the Service an EndpointSlice names before and after.
func (t *Tracker) Touch(old, next *model.Store, changes []model.Change) {
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		switch c.Key.Kind {
		case manifest.KindService:
			t.dirty[types.NamespacedName{Namespace: c.Key.Namespace, Name: c.Key.Name}] = true
		case manifest.KindPod:
			t.dirtyPods[types.NamespacedName{Namespace: c.Key.Namespace, Name: c.Key.Name}] = true
		case manifest.KindNode:
			// A node's zone moves every Service's preference: all are
			// computed again (rare; a heartbeat changes no label).
			if zoneIn(old, c.Key) != zoneIn(next, c.Key) {
				t.full = true
			}
		case manifest.KindEndpointSlice:
			for _, s := range []*model.Store{old, next} {
				if o, ok := s.Get(c.Key); ok {
					sl := o.Obj.(*discoveryv1.EndpointSlice)
					t.dirty[types.NamespacedName{Namespace: sl.Namespace, Name: sl.Labels[discoveryv1.LabelServiceName]}] = true
				}
			}
		}
	}
}

func zoneIn(s *model.Store, k manifest.Key) string {
	if o, ok := s.Get(k); ok {
		return o.Obj.(*corev1.Node).Labels[ZoneLabel]
	}
	return ""
}

// Reset makes the next Compute start from scratch: after a failed write,
// when the kernel may hold anything between the old and the new table.
func (t *Tracker) Reset() { t.full = true }

// Compute recomputes the touched services (every one after NewTracker or
// Reset) from store.
func (t *Tracker) Compute(store *model.Store) Delta {
	var d Delta
	var keys, pods []types.NamespacedName
	if t.full {
		d.Full, t.full = true, false
		clear(t.ports)
		clear(t.hostPorts)
		for _, s := range store.Services() {
			keys = append(keys, types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
		}
		for _, p := range store.Pods() {
			pods = append(pods, types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		}
	} else {
		keys = slices.SortedFunc(maps.Keys(t.dirty), compareNames)
		pods = slices.SortedFunc(maps.Keys(t.dirtyPods), compareNames)
	}
	clear(t.dirty)
	clear(t.dirtyPods)
	t.node.Zones = map[string]string{}
	for _, n := range store.Nodes() {
		if z := n.Labels[ZoneLabel]; z != "" {
			t.node.Zones[n.Name] = z
		}
	}
	for _, key := range pods {
		old := t.hostPorts[key]
		var ports []Port
		if p, ok := store.Pod(key.Namespace, key.Name); ok {
			ports = HostPortsFor(p, t.node)
		}
		if len(ports) == 0 {
			delete(t.hostPorts, key)
		} else {
			t.hostPorts[key] = ports
		}
		d.Upsert = append(d.Upsert, ports...)
		d.Remove = append(d.Remove, gone(old, ports)...)
	}
	for _, key := range keys {
		old := t.ports[key]
		svc, ok := store.Service(key.Namespace, key.Name)
		if !ok {
			for _, p := range old {
				d.Remove = append(d.Remove, p.Frontend)
			}
			delete(t.ports, key)
			continue
		}
		ports := PortsFor(svc, store.EndpointSlicesFor(key.Namespace, key.Name), t.node)
		t.ports[key] = ports
		d.Upsert = append(d.Upsert, ports...)
		d.Remove = append(d.Remove, gone(old, ports)...)
	}
	return d
}

// gone are the frontends of old that updated no longer has.
func gone(old, updated []Port) []Frontend {
	var out []Frontend
	for _, o := range old {
		if !slices.ContainsFunc(updated, func(n Port) bool { return n.Frontend == o.Frontend }) {
			out = append(out, o.Frontend)
		}
	}
	return out
}

// Ports is the whole table as last computed, sorted by service.
func (t *Tracker) Ports() []Port {
	var out []Port
	for _, key := range slices.SortedFunc(maps.Keys(t.ports), compareNames) {
		out = append(out, t.ports[key]...)
	}
	for _, key := range slices.SortedFunc(maps.Keys(t.hostPorts), compareNames) {
		out = append(out, t.hostPorts[key]...)
	}
	return out
}

// Count is the number of service ports and of their backends.
func (t *Tracker) Count() (ports, backends int) {
	for _, ps := range t.ports {
		ports += len(ps)
		for _, p := range ps {
			backends += len(p.Backends)
		}
	}
	for _, ps := range t.hostPorts {
		ports += len(ps)
		for _, p := range ps {
			backends += len(p.Backends)
		}
	}
	return ports, backends
}

func compareNames(a, b types.NamespacedName) int {
	if a.Namespace != b.Namespace {
		if a.Namespace < b.Namespace {
			return -1
		}
		return 1
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// PodOf describes a pod as the endpoint controller sees it: its address,
// readiness (the Ready condition) and whether it is terminating.
func PodOf(p *corev1.Pod) Pod {
	out := Pod{Pod: p, IP: p.Status.PodIP, Terminating: p.DeletionTimestamp != nil}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Ready = c.Status == corev1.ConditionTrue
		}
	}
	return out
}

// SelectorServicesTouched returns the selector services whose derived
// EndpointSlices changes (from old to next) can change: a selector Service
// itself, and those that select a changed pod before or after the change.
// It is the endpoint controller's change tracker.
func SelectorServicesTouched(old, next *model.Store, changes []model.Change) []types.NamespacedName {
	touched := map[types.NamespacedName]bool{}
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		switch c.Key.Kind {
		case manifest.KindService:
			touched[types.NamespacedName{Namespace: c.Key.Namespace, Name: c.Key.Name}] = true
		case manifest.KindPod:
			for _, s := range []*model.Store{old, next} {
				p, ok := s.Pod(c.Key.Namespace, c.Key.Name)
				if !ok {
					continue
				}
				for _, svc := range next.ServicesIn(p.Namespace) {
					if Selects(svc, p) {
						touched[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = true
					}
				}
			}
		}
	}
	return slices.SortedFunc(maps.Keys(touched), compareNames)
}
