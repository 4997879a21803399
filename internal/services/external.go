package services

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// externalIssues names what of a Service's outside-facing fields shunt
// does not implement yet, so that none of it is dropped without a word:
// the rest of the Service is programmed.
func externalIssues(svc *corev1.Service) []Issue {
	var out []Issue
	spec := svc.Spec
	for _, s := range spec.ExternalIPs {
		if a, err := netip.ParseAddr(s); err == nil && !a.Is4() {
			out = append(out, Issue{"IPv6NotSupported", fmt.Sprintf("externalIP %s: shunt load-balances IPv4 only; this address gets no entry", a)})
		}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		a, err := netip.ParseAddr(ing.IP)
		switch {
		case ing.IP == "" && ing.Hostname != "":
			out = append(out, Issue{"LoadBalancerHostnameNotSupported", fmt.Sprintf("status.loadBalancer.ingress hostname %s: shunt serves ingress IPs only", ing.Hostname)})
		case err == nil && !a.Is4():
			out = append(out, Issue{"IPv6NotSupported", fmt.Sprintf("load balancer ingress %s: shunt load-balances IPv4 only; this address gets no entry", a)})
		}
	}
	_, rangeIssues := SourceRanges(svc)
	out = append(out, rangeIssues...)
	if _, err := dpinfo.ParseForwardingMode(svc.Annotations[dpinfo.ForwardingModeAnnotation]); err != nil {
		out = append(out, Issue{"InvalidForwardingMode", err.Error() + "; the node's mode is used"})
	}
	switch d := spec.TrafficDistribution; {
	case d == nil, *d == "", *d == corev1.ServiceTrafficDistributionPreferSameNode, *d == corev1.ServiceTrafficDistributionPreferSameZone,
		*d == corev1.ServiceTrafficDistributionPreferClose:
	default:
		out = append(out, Issue{"TrafficDistributionNotSupported", fmt.Sprintf("trafficDistribution %s is not known to shunt: endpoints of every node and zone are used alike", *d)})
	}
	return out
}

// ForwardingIssues names, on a node that cannot send flows by DSR (noDSR:
// why), a Service with external frontends whose annotation asks for DSR:
// its flows to backends on other nodes are SNATed there.
func ForwardingIssues(svc *corev1.Service, noDSR string) []Issue {
	mode, _ := dpinfo.ParseForwardingMode(svc.Annotations[dpinfo.ForwardingModeAnnotation])
	external := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0
	if mode != dpinfo.NodePortDSR || !external {
		return nil
	}
	return []Issue{{"ForwardingModeNotSupported", fmt.Sprintf("annotation %s: dsr: %s; flows from outside to backends on other nodes are SNATed here",
		dpinfo.ForwardingModeAnnotation, noDSR)}}
}

// HealthCheck is what the healthCheckNodePort server of one Service with
// externalTrafficPolicy Local answers on a node: how many of its
// endpoints are there (200 with some, 503 with none), as kube-proxy does.
type HealthCheck struct {
	Namespace, Name string
	Port            uint16 // spec.healthCheckNodePort
	LocalEndpoints  int
}

// HealthChecks lists the health checks of services on node: the Services
// with externalTrafficPolicy Local and a healthCheckNodePort, each with
// its endpoints on node that are ready (usable), counted once
// per address whatever the ports (kube-proxy counts endpoints).
func HealthChecks(svcs []*corev1.Service, slicesOf func(namespace, name string) []*discoveryv1.EndpointSlice, node string) []HealthCheck {
	var out []HealthCheck
	for _, svc := range svcs {
		if svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal || svc.Spec.HealthCheckNodePort == 0 {
			continue
		}
		seen := map[string]bool{}
		for _, s := range slicesOf(svc.Namespace, svc.Name) {
			for _, ep := range s.Endpoints {
				if !usable(ep) || ep.NodeName == nil || *ep.NodeName != node {
					continue
				}
				for _, a := range ep.Addresses {
					seen[a] = true
				}
			}
		}
		out = append(out, HealthCheck{Namespace: svc.Namespace, Name: svc.Name, Port: uint16(svc.Spec.HealthCheckNodePort), LocalEndpoints: len(seen)})
	}
	return out
}

// HostPortsFor are the frontends of the hostPorts of pod on node: each
// container port with a hostPort is reached at that port on the node's
// NodePort addresses (hostIP unset or 0.0.0.0) or at its hostIP
// (127.0.0.1 included: the node's own processes only), translated to the
// pod's address and container port, as the portmap plugin does, without
// it. None for a pod of another node, of the host's network (its ports
// are the node's already), without an IPv4 address yet, or finished.
func HostPortsFor(pod *corev1.Pod, node Node) []Port {
	podIP, err := netip.ParseAddr(pod.Status.PodIP)
	if pod.Spec.NodeName != node.Name || pod.Spec.HostNetwork || err != nil || !podIP.Is4() || podFinished(pod) {
		return nil
	}
	var out []Port
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			proto, ok := protoNumbers[cmp.Or(cp.Protocol, corev1.ProtocolTCP)]
			if cp.HostPort == 0 || !ok {
				continue
			}
			addrs := node.NodePortAddrs
			if hostIP := HostIPOf(cp); hostIP.IsValid() {
				addrs = []netip.Addr{hostIP}
			}
			for _, a := range addrs {
				if !a.Is4() {
					continue
				}
				out = append(out, Port{Frontend: Frontend{VIP: a, Port: uint16(cp.HostPort), Proto: proto}, Kind: KindHostPort,
					Name:     fmt.Sprintf("%s/%s:%d/%s", pod.Namespace, pod.Name, cp.HostPort, cmp.Or(cp.Protocol, corev1.ProtocolTCP)),
					Backends: []Backend{{IP: podIP, Port: uint16(cp.ContainerPort)}}})
			}
		}
	}
	return dedupeFrontends(out)
}

// HostIPOf is the one address a container port's hostPort takes: its
// hostIP; invalid when it takes every address of the node (hostIP unset,
// 0.0.0.0 or not an address).
func HostIPOf(cp corev1.ContainerPort) netip.Addr {
	if a, err := netip.ParseAddr(cp.HostIP); err == nil && !a.IsUnspecified() {
		return a
	}
	return netip.Addr{}
}

// HostPortIssues names what of a pod's hostPorts shunt does not serve:
// an IPv6 hostIP, a protocol other than TCP and UDP, a hostPort of a pod
// of the host's network (its ports are the node's: nothing to map).
func HostPortIssues(pod *corev1.Pod) []Issue {
	var out []Issue
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort == 0 {
				continue
			}
			proto := cmp.Or(p.Protocol, corev1.ProtocolTCP)
			what := fmt.Sprintf("container %s: hostPort %d/%s", c.Name, p.HostPort, proto)
			hostIP, err := netip.ParseAddr(p.HostIP)
			switch _, ok := protoNumbers[proto]; {
			case pod.Spec.HostNetwork:
			case !ok:
				out = append(out, Issue{"ProtocolNotSupported", what + ": shunt maps TCP and UDP hostPorts only; this one is reached at the pod's address only"})
			case err == nil && !hostIP.Is4():
				out = append(out, Issue{"IPv6NotSupported", fmt.Sprintf("%s: hostIP %s: shunt maps IPv4 only; this port is reached at the pod's address only", what, hostIP)})
			}
		}
	}
	return out
}

// SourceRangesAnnotation is the older way to give a LoadBalancer's source
// ranges, which kube-proxy reads when spec.loadBalancerSourceRanges is
// empty: comma-separated CIDRs.
const SourceRangesAnnotation = "service.beta.kubernetes.io/load-balancer-source-ranges"

// SourceRanges are the IPv4 prefixes a LoadBalancer Service admits on its
// load balancer addresses (spec.loadBalancerSourceRanges, else the
// annotation), canonical (host bits cleared) and without duplicates; nil
// when it admits every client. A range that is not a CIDR, or an IPv6
// one (no IPv4 client is in it), is an issue and left out. When every
// range given is left out, the Service admits no client from outside, as
// the ranges asked for none of the IPv4 ones: 0.0.0.0/32 stands for that.
func SourceRanges(svc *corev1.Service) ([]netip.Prefix, []Issue) {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return nil, nil
	}
	given, field := svc.Spec.LoadBalancerSourceRanges, "loadBalancerSourceRanges"
	if len(given) == 0 && svc.Annotations[SourceRangesAnnotation] != "" {
		given, field = strings.Split(svc.Annotations[SourceRangesAnnotation], ","), "annotation "+SourceRangesAnnotation
	}
	var out []netip.Prefix
	var issues []Issue
	for _, s := range given {
		s = strings.TrimSpace(s)
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			issues = append(issues, Issue{"InvalidSourceRange", fmt.Sprintf("%s: %q is not a CIDR: left out", field, s)})
		case !p.Addr().Is4():
			issues = append(issues, Issue{"IPv6NotSupported", fmt.Sprintf("%s: %s: shunt load-balances IPv4 only; this range admits no client", field, p)})
		default:
			if p = p.Masked(); !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	if len(given) > 0 && len(out) == 0 {
		out = []netip.Prefix{netip.PrefixFrom(netip.IPv4Unspecified(), 32)}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out, issues
}
