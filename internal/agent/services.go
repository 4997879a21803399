package agent

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/services"
)

// DefaultServiceCIDR is where ClusterIPs come from unless --service-cidr says otherwise.
const DefaultServiceCIDR = "10.96.0.0/16"

// assignClusterIPs gives every non-headless Service of next a ClusterIP,
// keeping existing ones, as the API server's allocator does: a requested
// address must be in the service CIDR and free, and never changes later.
// With changes (of the step from the store that current belongs to), only
// the services they name are looked at; nil looks at all of them.
func assignClusterIPs(pool ipam.Pool, current map[string]string, next *model.Store, changes []model.Change) (map[string]string, error) {
	out := map[string]string{}
	var svcs []*corev1.Service
	if changes == nil {
		svcs = next.Services()
	} else {
		for k, v := range current {
			out[k] = v
		}
		for _, c := range changes {
			kind, key, _ := strings.Cut(c.Key, "/")
			if kind != "Service" || c.Action == "unchanged" {
				continue
			}
			delete(out, key) // looked at again below, if it still exists
			if o, ok := next.Get(c.Key); ok {
				svcs = append(svcs, o.Obj.(*corev1.Service))
			}
		}
	}
	used := make(map[netip.Addr]string, len(out))
	for key, ip := range out {
		used[netip.MustParseAddr(ip)] = key
	}
	var problems []string
	alloc := pool.NewAllocator(func(ip netip.Addr) bool { return used[ip] != "" })
	// Keep existing allocations first so a new service cannot take one.
	for _, s := range svcs {
		key := s.Namespace + "/" + s.Name
		if ip, ok := current[key]; ok {
			if want := s.Spec.ClusterIP; want != "" && want != ip {
				problems = append(problems, fmt.Sprintf("Service %s: spec.clusterIP: field is immutable (%s, requested %s): delete the service first", key, ip, want))
				continue
			}
			out[key] = ip
			used[netip.MustParseAddr(ip)] = key
		}
	}
	for _, s := range svcs {
		key := s.Namespace + "/" + s.Name
		if _, done := out[key]; done || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		if _, refused := current[key]; refused {
			continue
		}
		if want := s.Spec.ClusterIP; want != "" {
			ip := netip.MustParseAddr(want) // validated by the manifest reader
			switch {
			case !pool.Contains(ip):
				problems = append(problems, fmt.Sprintf("Service %s: spec.clusterIP: %s is not in the service CIDR %s", key, ip, pool.CIDR))
			case used[ip] != "":
				problems = append(problems, fmt.Sprintf("Service %s: spec.clusterIP: %s is already allocated to Service %s", key, ip, used[ip]))
			default:
				out[key], used[ip] = ip.String(), key
			}
			continue
		}
		ip, err := alloc.Next()
		if err != nil {
			problems = append(problems, fmt.Sprintf("Service %s: service CIDR %v", key, err))
			continue
		}
		out[key], used[ip] = ip.String(), key
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, errors.New(manifest.JoinProblems("nothing applied:", problems))
	}
	return out, nil
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

// readiness summarises which pods are ready, in a stable order.
func (a *Agent) readiness() string {
	var b strings.Builder
	for _, p := range a.podsForServices() {
		fmt.Fprintf(&b, "%s/%s=%v,", p.Pod.Namespace, p.Pod.Name, p.Ready)
	}
	return b.String()
}

// serviceEntry is one service's computed ports and what they were
// computed from: unchanged inputs give the same ports, so a change to one
// service of 10 000 recomputes and writes one.
type serviceEntry struct {
	svc     *corev1.Service
	slices  []*discoveryv1.EndpointSlice // hand-written slices
	derived []*discoveryv1.EndpointSlice // from the selector, as the endpoint-slice controller would
	ip      string
	pods    uint64 // podsVersion, for services with a selector
	ports   []datapath.ServicePort
}

func (e *serviceEntry) current(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, ip string, pods uint64) bool {
	return e != nil && e.svc == svc && e.ip == ip && slicesEqual(e.slices, slices) &&
		(svc.Spec.Selector == nil || e.pods == pods)
}

// slicesEqual: the same slice objects (the store never changes an object
// in place, so the same pointer means the same content).
func slicesEqual(a, b []*discoveryv1.EndpointSlice) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// computeServices brings the per-service cache up to date with the store
// and returns the ports that changed (upsert) and those gone (remove).
// Called with mu held.
func (a *Agent) computeServices() (upsert, remove []datapath.ServicePort) {
	written := a.store.EndpointSlicesByService()
	var pods []services.Pod // computed only if a selector service needs it
	seen := make(map[string]bool, len(a.svcCache))
	for _, s := range a.store.Services() {
		key := s.Namespace + "/" + s.Name
		seen[key] = true
		ip := a.state.ClusterIPs[key]
		old := a.svcCache[key]
		if old.current(s, written[key], ip, a.podsVersion) {
			continue
		}
		e := &serviceEntry{svc: s, slices: written[key], ip: ip, pods: a.podsVersion}
		if s.Spec.Selector != nil {
			if pods == nil {
				pods = a.podsForServices()
			}
			e.derived = services.DeriveSlices(s, pods)
		}
		addr, _ := netip.ParseAddr(ip)
		e.ports = services.Ports(s, addr, append(slices.Clip(e.derived), e.slices...))
		a.svcCache[key] = e
		upsert = append(upsert, e.ports...)
		if old != nil {
			remove = append(remove, gonePorts(old.ports, e.ports)...)
		}
	}
	for key, e := range a.svcCache {
		if !seen[key] {
			remove = append(remove, e.ports...)
			delete(a.svcCache, key)
		}
	}
	return upsert, remove
}

// gonePorts are the ports of old whose frontend new no longer has.
func gonePorts(old, new []datapath.ServicePort) []datapath.ServicePort {
	var out []datapath.ServicePort
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
func (a *Agent) desiredServicePorts() []datapath.ServicePort {
	var out []datapath.ServicePort
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
	if !a.servicesSynced {
		if err := a.dp.SyncServices(a.desiredServicePorts()); err != nil {
			return err
		}
		a.servicesSynced = true
		return nil
	}
	if len(upsert) == 0 && len(remove) == 0 {
		return nil
	}
	if err := a.dp.UpdateServices(upsert, remove); err != nil {
		// The cache is ahead of the kernel now: start over next time.
		clear(a.svcCache)
		a.servicesSynced = false
		return err
	}
	return nil
}
