package agent

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/services"
)

// DefaultServiceCIDR is where ClusterIPs come from unless --service-cidr says otherwise.
const DefaultServiceCIDR = "10.96.0.0/16"

// assignClusterIPs gives every non-headless Service of next a ClusterIP,
// keeping existing ones, as the API server's allocator does: a requested
// address must be in the service CIDR and free, and never changes later.
func assignClusterIPs(pool ipam.Pool, current map[string]string, next *model.Store) (map[string]string, error) {
	out := map[string]string{}
	used := map[netip.Addr]string{}
	svcs := next.Services()
	var problems []string
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
		inUse := map[netip.Addr]bool{}
		for ip := range used {
			inUse[ip] = true
		}
		ip, err := pool.Allocate(inUse)
		if err != nil {
			problems = append(problems, fmt.Sprintf("Service %s: %v", key, err))
			continue
		}
		out[key], used[ip] = ip.String(), key
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("nothing applied:\n%s", strings.Join(problems, "\n"))
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

// endpointSlices returns each Service's slices: derived from its selector,
// or the hand-written ones for a Service without selector.
func (a *Agent) endpointSlices() map[string][]*discoveryv1.EndpointSlice {
	pods := a.podsForServices()
	out := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range a.store.Services() {
		if s.Spec.Selector != nil {
			out[s.Namespace+"/"+s.Name] = services.DeriveSlices(s, pods)
		}
	}
	for _, sl := range a.store.EndpointSlices() {
		key := sl.Namespace + "/" + sl.Labels[discoveryv1.LabelServiceName]
		out[key] = append(out[key], sl)
	}
	return out
}

// desiredServicePorts is the whole service table for the datapath.
func (a *Agent) desiredServicePorts() []datapath.ServicePort {
	slices := a.endpointSlices()
	var out []datapath.ServicePort
	for _, s := range a.store.Services() {
		key := s.Namespace + "/" + s.Name
		ip, _ := netip.ParseAddr(a.state.ClusterIPs[key])
		out = append(out, services.Ports(s, ip, slices[key])...)
	}
	return out
}

// syncServices writes the service table; called with mu held. The
// datapath writes only the service ports that changed, so the periodic
// resync costs one comparison per port when nothing did.
func (a *Agent) syncServices() error {
	return a.dp.SyncServices(a.desiredServicePorts())
}
