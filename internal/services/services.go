// Package services computes, from Services, EndpointSlices and pods, the
// exact service table the datapath must hold. It is pure: no I/O, no kernel.
//
// EndpointSlices are derived from the pods a Service selects, the way the
// endpoint-slice controller does, unless the Service has no selector, in
// which case the hand-written slices labelled with its name are used.
package services

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// Pod is a pod as the service controller sees it.
type Pod struct {
	Pod         *corev1.Pod
	IP          string
	Ready       bool // every container runs
	Terminating bool
}

// Selects reports whether a selector Service picks pod: same namespace,
// every selector label present with its value.
func Selects(svc *corev1.Service, pod *corev1.Pod) bool {
	return svc.Spec.Selector != nil && pod.Namespace == svc.Namespace &&
		labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels))
}

// DeriveSlices builds the EndpointSlices of a selector Service: one slice
// per distinct set of resolved ports (a named targetPort may resolve to a
// different number on each pod), endpoints sorted by address. The
// conditions are the ones Kubernetes' EndpointSlice controller writes:
// serving is the pod's readiness, terminating its deletion, and ready is
// serving and not terminating, or always with publishNotReadyAddresses
// (a headless StatefulSet's peers find each other before they are ready;
// kube-proxy then balances to them too, and so does shunt). A pod that
// has finished (Succeeded, Failed) or has no address yet is no endpoint.
func DeriveSlices(svc *corev1.Service, pods []Pod) []*discoveryv1.EndpointSlice {
	if svc.Spec.Selector == nil {
		return nil
	}
	groups := map[string]*discoveryv1.EndpointSlice{}
	var order []string
	for _, p := range pods {
		if p.IP == "" || !Selects(svc, p.Pod) || podFinished(p.Pod) {
			continue
		}
		ports := resolvePorts(svc, p.Pod)
		sig := portSignature(ports)
		slice, ok := groups[sig]
		if !ok {
			slice = &discoveryv1.EndpointSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
				ObjectMeta: metav1.ObjectMeta{
					Namespace: svc.Namespace,
					Labels: map[string]string{
						discoveryv1.LabelServiceName: svc.Name,
						discoveryv1.LabelManagedBy:   "shunt.io/lab",
					},
				},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       ports,
			}
			groups[sig] = slice
			order = append(order, sig)
		}
		serving, terminating := p.Ready, p.Terminating
		ready := svc.Spec.PublishNotReadyAddresses || (serving && !terminating)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{p.IP},
			Conditions: discoveryv1.EndpointConditions{
				Ready: &ready, Serving: &serving, Terminating: &terminating,
			},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: p.Pod.Namespace, Name: p.Pod.Name},
			NodeName:  nodeNameOf(p.Pod),
		})
	}
	sort.Strings(order)
	out := make([]*discoveryv1.EndpointSlice, 0, len(order))
	for i, sig := range order {
		s := groups[sig]
		s.Name = fmt.Sprintf("%s-%d", svc.Name, i+1)
		sort.Slice(s.Endpoints, func(a, b int) bool {
			return addrLess(s.Endpoints[a].Addresses[0], s.Endpoints[b].Addresses[0])
		})
		out = append(out, s)
	}
	return out
}

// podFinished says whether the pod's containers have all ended for good
// (phase Succeeded or Failed): its address may be reused.
func podFinished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// nodeNameOf is the endpoint's nodeName, as the controller writes it
// (externalTrafficPolicy Local reads it); nil for a pod not yet placed.
func nodeNameOf(p *corev1.Pod) *string {
	if p.Spec.NodeName == "" {
		return nil
	}
	n := p.Spec.NodeName
	return &n
}

func addrLess(a, b string) bool {
	pa, ea := netip.ParseAddr(a)
	pb, eb := netip.ParseAddr(b)
	if ea != nil || eb != nil {
		return a < b
	}
	return pa.Less(pb)
}

// resolvePorts maps each service port to the pod's port number; a named
// targetPort the pod does not declare leaves that port out, as the
// controller does.
func resolvePorts(svc *corev1.Service, pod *corev1.Pod) []discoveryv1.EndpointPort {
	var out []discoveryv1.EndpointPort
	for _, sp := range svc.Spec.Ports {
		num, ok := targetPortOn(sp, pod)
		if !ok {
			continue
		}
		name, proto := sp.Name, sp.Protocol
		out = append(out, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &num})
	}
	return out
}

func targetPortOn(sp corev1.ServicePort, pod *corev1.Pod) (int32, bool) {
	if sp.TargetPort.Type == intstr.Int {
		return sp.TargetPort.IntVal, true
	}
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == sp.TargetPort.StrVal && cp.Protocol == sp.Protocol {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

func portSignature(ports []discoveryv1.EndpointPort) string {
	parts := make([]string, len(ports))
	for i, p := range ports {
		parts[i] = fmt.Sprintf("%s/%s/%d", *p.Name, *p.Protocol, *p.Port)
	}
	return strings.Join(parts, ",")
}

var protoNumbers = map[corev1.Protocol]uint8{corev1.ProtocolTCP: 6, corev1.ProtocolUDP: 17}

// Ports computes the datapath entries of one Service's ClusterIP from its
// slices: one entry per service port, backends that are ready and not
// terminating, sorted. SCTP ports are not load balanced at the socket
// layer (yet) and are left out. A headless Service (clusterIP None) has no
// entries, nor does an IPv6 one (the datapath is IPv4; Unsupported says
// so).
func Ports(svc *corev1.Service, clusterIP netip.Addr, slices []*discoveryv1.EndpointSlice) []Port {
	return clusterPorts(svc, clusterIP, slices, nil)
}

// clusterPorts are the ClusterIP ports of svc: Ports, and on a node (nil:
// none, every endpoint) with internalTrafficPolicy Local this node's
// endpoints only, else those its trafficDistribution prefers.
func clusterPorts(svc *corev1.Service, clusterIP netip.Addr, slices []*discoveryv1.EndpointSlice, node *Node) []Port {
	if !clusterIP.IsValid() || !clusterIP.Is4() {
		return nil
	}
	var out []Port
	for _, sp := range svc.Spec.Ports {
		proto, ok := protoNumbers[sp.Protocol]
		if !ok {
			continue
		}
		var backends []Backend
		if node == nil {
			backends = portEndpoints(slices, sp, "").cluster(nil)
		} else {
			eps := portEndpoints(slices, sp, node.Name)
			backends = eps.cluster(func(all []Backend) []Backend { return preferred(svc, slices, *node, all, eps.readyHere) })
			if internalLocal(svc) {
				backends = eps.local()
			}
		}
		out = append(out, servicePort(svc, sp, Frontend{VIP: clusterIP, Port: uint16(sp.Port), Proto: proto}, KindClusterIP, backends))
	}
	return out
}

// PortsFor computes every frontend of one Service on node: its ClusterIP
// ports (Ports), and for a NodePort or LoadBalancer Service each nodePort
// on each of the node's NodePort addresses (those node.NodePortAddresses
// selects), each externalIP and each load
// balancer ingress IP at the service port. With externalTrafficPolicy
// Local the external frontends have this node's endpoints only. IPv6
// addresses are left out (Unsupported names them).
func PortsFor(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node Node) []Port {
	clusterIP, _ := netip.ParseAddr(svc.Spec.ClusterIP)
	out := clusterPorts(svc, clusterIP, slices, &node)
	if node.ExternalByKubeProxy {
		return dedupeFrontends(out)
	}
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	ranges, _ := SourceRanges(svc)
	forwarding, _ := dpinfo.ParseForwardingMode(svc.Annotations[dpinfo.ForwardingModeAnnotation]) // invalid: the node's (Unsupported says so)
	nodePortAddrs := node.NodePortFrontendAddrs()
	for _, sp := range svc.Spec.Ports {
		proto, ok := protoNumbers[sp.Protocol]
		if !ok {
			continue
		}
		eps := portEndpoints(slices, sp, node.Name)
		backends := eps.cluster(func(all []Backend) []Backend { return preferred(svc, slices, node, all, eps.readyHere) })
		if local {
			backends = eps.local()
		}
		add := func(addr netip.Addr, port uint16, kind Kind) {
			if !addr.Is4() || port == 0 {
				return
			}
			p := servicePort(svc, sp, Frontend{VIP: addr, Port: port, Proto: proto}, kind, backends)
			p.LocalOnly = local
			p.Forwarding = forwarding
			if kind == KindLoadBalancer {
				// As kube-proxy: the ranges guard the load balancer's
				// addresses; the nodePorts stay open to all.
				p.SourceRanges = ranges
			}
			out = append(out, p)
		}
		if nodePorts {
			for _, a := range nodePortAddrs {
				add(a, uint16(sp.NodePort), KindNodePort)
			}
		}
		for _, s := range svc.Spec.ExternalIPs {
			a, _ := netip.ParseAddr(s)
			add(a, uint16(sp.Port), KindExternalIP)
		}
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			for _, ing := range svc.Status.LoadBalancer.Ingress {
				a, _ := netip.ParseAddr(ing.IP)
				add(a, uint16(sp.Port), KindLoadBalancer)
			}
		}
	}
	return dedupeFrontends(out)
}

// endpointSets are the endpoints of one service port as kube-proxy's
// CategorizeEndpoints tells them apart: ready ones, and those that are
// terminating but still serving; of each, all and those on the node. Each
// list is sorted.
type endpointSets struct {
	ready, readyHere                    []Backend
	servingTerminating, terminatingHere []Backend
}

// cluster are the backends of a traffic policy Cluster: the ready
// endpoints that prefer (trafficDistribution; nil: all of them) keeps,
// or, as kube-proxy, with no ready endpoint anywhere, every serving one
// that is terminating: a Service whose pods all roll at once keeps
// taking new connections on the pods that still serve rather than none.
func (e endpointSets) cluster(prefer func(all []Backend) []Backend) []Backend {
	if len(e.ready) == 0 {
		return e.servingTerminating
	}
	if prefer == nil {
		return e.ready
	}
	return prefer(e.ready)
}

// local are the backends of a traffic policy Local: this node's ready
// endpoints, or, as kube-proxy, with no ready endpoint here, its serving
// ones that are terminating.
func (e endpointSets) local() []Backend {
	if len(e.readyHere) == 0 {
		return e.terminatingHere
	}
	return e.readyHere
}

// ZoneLabel is the Node label naming its zone.
const ZoneLabel = "topology.kubernetes.io/zone"

// preferred are the backends trafficDistribution prefers of all (onNode:
// those on node), as kube-proxy: PreferSameNode this node's, else (none
// here) those of its zone; PreferSameZone (or PreferClose, its old name)
// those of its zone; with none of them, or no zone known, all. An
// endpoint's zone is its own (the slice's) or else its node's label.
func preferred(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node Node, all, onNode []Backend) []Backend {
	d := svc.Spec.TrafficDistribution
	if d == nil {
		return all
	}
	switch *d {
	case corev1.ServiceTrafficDistributionPreferSameNode:
		if len(onNode) > 0 {
			return onNode
		}
	case corev1.ServiceTrafficDistributionPreferSameZone, corev1.ServiceTrafficDistributionPreferClose:
	default:
		return all
	}
	zone := node.Zones[node.Name]
	if zone == "" {
		return all
	}
	inZone := map[netip.Addr]bool{}
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			z := ""
			if ep.Zone != nil {
				z = *ep.Zone
			} else if ep.NodeName != nil {
				z = node.Zones[*ep.NodeName]
			}
			if z != zone {
				continue
			}
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					inZone[ip] = true
				}
			}
		}
	}
	var out []Backend
	for _, b := range all {
		if inZone[b.IP] {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return all
	}
	return out
}

// internalLocal: internalTrafficPolicy Local, the ClusterIP balancing
// over this node's endpoints only (none here: refused, as a Service
// without endpoints).
func internalLocal(svc *corev1.Service) bool {
	p := svc.Spec.InternalTrafficPolicy
	return p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal
}

// dedupeFrontends keeps the first port of each frontend: an externalIP
// that is also a node's address, say, is one frontend, not two.
func dedupeFrontends(ports []Port) []Port {
	seen := map[Frontend]bool{}
	out := ports[:0]
	for _, p := range ports {
		if !seen[p.Frontend] {
			seen[p.Frontend] = true
			out = append(out, p)
		}
	}
	return out
}

func servicePort(svc *corev1.Service, sp corev1.ServicePort, fe Frontend, kind Kind, backends []Backend) Port {
	var timeout uint32
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		timeout = uint32(*svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds)
	}
	return Port{Frontend: fe, Kind: kind, Name: fmt.Sprintf("%s/%s:%s", svc.Namespace, svc.Name, portLabel(sp)),
		AffinityTimeout: timeout, Backends: backends}
}

// portEndpoints sorts the endpoints of service port sp in slices into
// endpointSets (node "": none is on the node). An address is counted once,
// ready if any endpoint naming it is (slices overlap while the controller
// moves an endpoint from one to another), else as the first that names it.
func portEndpoints(slices []*discoveryv1.EndpointSlice, sp corev1.ServicePort, node string) endpointSets {
	ready, fallback := map[Backend]bool{}, map[Backend]bool{} // address: on the node
	for _, s := range slices {
		num, ok := slicePort(s, sp)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			into := ready
			switch {
			case usable(ep):
			case servingTerminating(ep):
				into = fallback
			default:
				continue
			}
			here := node != "" && ep.NodeName != nil && *ep.NodeName == node
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				b := Backend{IP: ip, Port: uint16(num)}
				if _, dup := into[b]; err != nil || !ip.Is4() || dup {
					continue
				}
				into[b] = here
			}
		}
	}
	var e endpointSets
	for b, here := range ready {
		e.ready = append(e.ready, b)
		if here {
			e.readyHere = append(e.readyHere, b)
		}
	}
	for b, here := range fallback {
		if _, isReady := ready[b]; isReady {
			continue
		}
		e.servingTerminating = append(e.servingTerminating, b)
		if here {
			e.terminatingHere = append(e.terminatingHere, b)
		}
	}
	for _, bs := range [][]Backend{e.ready, e.readyHere, e.servingTerminating, e.terminatingHere} {
		sortBackends(bs)
	}
	return e
}

// servingTerminating: an endpoint going away that still serves (its
// Serving condition; unset means serving, as the API defines it), which
// kube-proxy keeps using when a Service has no ready endpoint for the
// traffic's policy.
func servingTerminating(ep discoveryv1.Endpoint) bool {
	c := ep.Conditions
	return c.Terminating != nil && *c.Terminating && (c.Serving == nil || *c.Serving)
}

func sortBackends(bs []Backend) {
	sort.Slice(bs, func(i, j int) bool {
		a, b := bs[i], bs[j]
		if a.IP != b.IP {
			return a.IP.Less(b.IP)
		}
		return a.Port < b.Port
	})
}

func portLabel(sp corev1.ServicePort) string {
	if sp.Name != "" {
		return sp.Name
	}
	return fmt.Sprintf("%d/%s", sp.Port, sp.Protocol)
}

// slicePort finds the slice's port for a service port: same name and protocol.
func slicePort(s *discoveryv1.EndpointSlice, sp corev1.ServicePort) (int32, bool) {
	for _, p := range s.Ports {
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if name == sp.Name && proto == sp.Protocol && p.Port != nil {
			return *p.Port, true
		}
	}
	return 0, false
}

// usable: ready. An explicit Ready is the controller's word, which is
// true for a terminating endpoint only when its Service publishes
// not-ready addresses; kube-proxy balances to such an endpoint, and so
// does shunt. An unset Ready counts as ready unless the endpoint is
// terminating. Other terminating endpoints keep their established
// connections but get no new ones (servingTerminating is the fallback).
func usable(ep discoveryv1.Endpoint) bool {
	c := ep.Conditions
	if c.Ready != nil {
		return *c.Ready
	}
	return c.Terminating == nil || !*c.Terminating
}

// Issue is one thing of a Service that shunt does not load-balance.
type Issue struct {
	Reason  string // CamelCase, as Events have it
	Message string
}

// Unsupported lists what of a Service shunt leaves out: ports of protocols
// the socket layer does not balance (SCTP), and an IPv6 ClusterIP. An API
// server accepts both; the rest of the Service is programmed.
func Unsupported(svc *corev1.Service) []Issue {
	var out []Issue
	if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil && !ip.Is4() {
		out = append(out, Issue{"IPv6NotSupported", fmt.Sprintf("ClusterIP %s: shunt load-balances IPv4 only; the Service gets no entries", ip)})
	}
	for _, sp := range svc.Spec.Ports {
		if _, ok := protoNumbers[sp.Protocol]; !ok {
			out = append(out, Issue{"ProtocolNotSupported", fmt.Sprintf("port %d/%s: shunt load-balances TCP and UDP only; this port gets no entry", sp.Port, sp.Protocol)})
		}
	}
	return append(out, externalIssues(svc)...)
}
