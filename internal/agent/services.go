package agent

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/services"
)

// clusterIPs says which service holds which ClusterIP. The address itself
// lives in the Service's spec.clusterIP, as the API server records it, so
// it is persisted with the object; this is the index that finds free ones.
type clusterIPs struct {
	pool  ipam.Pool
	owner map[netip.Addr]string // ClusterIP -> service namespace/name
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
		kind, key, _ := strings.Cut(ch.Key, "/")
		if kind != "Service" {
			continue
		}
		switch ch.Action {
		case "deleted":
			if o, ok := old.Get(ch.Key); ok {
				if ip, err := netip.ParseAddr(o.Obj.(*corev1.Service).Spec.ClusterIP); err == nil {
					a.freed = append(a.freed, ip)
				}
			}
			continue
		case "created":
		default:
			continue // an update keeps its address (the store refuses a different one)
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

// podsForServices describes the pods as the endpoint controller sees them.
func (a *Agent) podsForServices() []services.Pod {
	var out []services.Pod
	for _, p := range a.store.Pods() {
		rec := a.state.Pods[podKey(p.Namespace, p.Name)]
		if rec == nil {
			continue
		}
		out = append(out, services.Pod{Pod: p, IP: rec.IP, Ready: a.podReady(rec)})
	}
	return out
}

// podReady: every container of the pod runs.
func (a *Agent) podReady(rec *PodRecord) bool {
	if len(rec.Containers) == 0 {
		return false
	}
	for _, c := range rec.Containers {
		if _, exited := readExitStatus(c.ExitFile); exited || !processAlive(c.ShimPID) {
			return false
		}
	}
	return true
}

// serviceEntry is one service's computed ports and the slices they came
// from (hand-written, and derived from the selector as the endpoint-slice
// controller would).
type serviceEntry struct {
	slices  []*discoveryv1.EndpointSlice
	derived []*discoveryv1.EndpointSlice
	ports   []services.Port
}

// servicesTouched marks the services a change of obj (as it was in old and
// is in next) can change: a service itself, the service an EndpointSlice
// names, the selector services a pod matches before or after. Called with
// mu held.
func (a *Agent) servicesTouched(old, next *model.Store, key string) {
	for _, st := range []*model.Store{old, next} {
		o, ok := st.Get(key)
		if !ok {
			continue
		}
		switch obj := o.Obj.(type) {
		case *corev1.Service:
			a.svcDirty[obj.Namespace+"/"+obj.Name] = true
		case *discoveryv1.EndpointSlice:
			a.svcDirty[obj.Namespace+"/"+obj.Labels[discoveryv1.LabelServiceName]] = true
		case *corev1.Pod:
			a.podServicesTouched(next, obj)
		}
	}
}

// podServicesTouched marks the services whose selector picks pod.
func (a *Agent) podServicesTouched(store *model.Store, pod *corev1.Pod) {
	for _, s := range store.ServicesIn(pod.Namespace) {
		if services.Selects(s, pod) {
			a.svcDirty[s.Namespace+"/"+s.Name] = true
		}
	}
}

// readinessChanged marks the services of pods whose readiness changed
// since the last look and reports whether any did. Containers start and
// exit on their own; this follows them into the endpoints, as the
// endpoint controller does. Called with mu held.
func (a *Agent) readinessChanged() bool {
	changed := false
	seen := make(map[string]bool, len(a.state.Pods))
	for _, p := range a.store.Pods() {
		key := podKey(p.Namespace, p.Name)
		rec := a.state.Pods[key]
		if rec == nil {
			continue
		}
		seen[key] = true
		ready := a.podReady(rec)
		if was, known := a.lastReady[key]; !known || was != ready {
			a.lastReady[key] = ready
			a.podServicesTouched(a.store, p)
			changed = true
		}
	}
	for key := range a.lastReady {
		if !seen[key] {
			delete(a.lastReady, key)
		}
	}
	return changed
}

// computeServices recomputes the services marked dirty (every service when
// the cache is empty) and returns the ports that changed (upsert) and
// those gone (remove). Called with mu held.
func (a *Agent) computeServices() (upsert, remove []services.Port) {
	var keys []string
	if !a.servicesSynced {
		clear(a.svcCache)
		for _, s := range a.store.Services() {
			keys = append(keys, s.Namespace+"/"+s.Name)
		}
	} else {
		keys = slices.Sorted(maps.Keys(a.svcDirty))
	}
	clear(a.svcDirty)
	var pods []services.Pod // computed only if a selector service needs it
	for _, key := range keys {
		old := a.svcCache[key]
		ns, name, _ := strings.Cut(key, "/")
		o, ok := a.store.Get("Service/" + key)
		if !ok {
			if old != nil {
				remove = append(remove, old.ports...)
				delete(a.svcCache, key)
			}
			continue
		}
		s := o.Obj.(*corev1.Service)
		e := &serviceEntry{slices: a.store.EndpointSlicesFor(ns, name)}
		if s.Spec.Selector != nil {
			if pods == nil {
				pods = a.podsForServices()
			}
			e.derived = services.DeriveSlices(s, pods)
		}
		addr, _ := netip.ParseAddr(s.Spec.ClusterIP)
		e.ports = services.Ports(s, addr, append(slices.Clip(e.derived), e.slices...))
		a.svcCache[key] = e
		upsert = append(upsert, e.ports...)
		if old != nil {
			remove = append(remove, gonePorts(old.ports, e.ports)...)
		}
	}
	return upsert, remove
}

// gonePorts are the ports of old whose frontend new no longer has.
func gonePorts(old, new []services.Port) []services.Port {
	var out []services.Port
	for _, o := range old {
		kept := false
		for _, n := range new {
			kept = kept || (n.VIP == o.VIP && n.Port == o.Port && n.Proto == o.Proto)
		}
		if !kept {
			out = append(out, o)
		}
	}
	return out
}

// desiredServicePorts is the whole service table for the datapath, as last
// computed. Called with mu held.
func (a *Agent) desiredServicePorts() []services.Port {
	var out []services.Port
	for _, key := range slices.Sorted(maps.Keys(a.svcCache)) {
		out = append(out, a.svcCache[key].ports...)
	}
	return out
}

// syncServices writes what changed in the service table; called with mu
// held. The first sync after start writes (compares) the whole table, so
// what an earlier agent left is reconciled.
func (a *Agent) syncServices() error {
	upsert, remove := a.computeServices()
	a.svcNames.update(upsert, remove)
	var gone []netip.AddrPort
	var err error
	switch {
	case !a.servicesSynced:
		gone, err = a.dp.SyncServices(a.desiredServicePorts())
		a.servicesSynced = err == nil
	case len(upsert) > 0 || len(remove) > 0:
		var frontends []services.Frontend
		for _, p := range remove {
			frontends = append(frontends, p.Frontend)
		}
		if gone, err = a.dp.UpdateServices(upsert, frontends); err != nil {
			// The cache is ahead of the kernel now: start over next time.
			clear(a.svcCache)
			a.servicesSynced = false
		}
	}
	if err != nil {
		return err
	}
	a.closeStaleUDPSockets(gone)
	return nil
}

// closeStaleUDPSockets destroys the connected UDP sockets, on the node and
// in every pod, that a service sent to a backend no service has any more:
// they would keep sending into the void (a DNS pod replaced, say). The
// application sees ECONNABORTED and connects again, through the service.
// TCP connections are left alone: they end when their peer does. Failing
// here does not fail the change; it is logged.
func (a *Agent) closeStaleUDPSockets(gone []netip.AddrPort) {
	if len(gone) == 0 {
		return
	}
	netns := []string{""} // the agent's own: the node's processes
	for _, rec := range a.state.Pods {
		netns = append(netns, filepath.Join(podnet.NetnsDir, rec.Netns))
	}
	n, err := a.dp.DestroyUDPSockets(netns, gone)
	a.metrics.udpDestroyed.Add(float64(n))
	if err != nil {
		a.log.Warn("closing UDP sockets of removed backends", "backends", len(gone), "closed", n, "err", err)
	} else if n > 0 {
		a.log.Info("closed UDP sockets of removed backends", "backends", len(gone), "closed", n)
	}
}
