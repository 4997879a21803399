package services

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// The overlay's own endpoint, the node's underlay address and the VXLAN
// UDP port, belongs to the overlay: the uplink program hands every UDP
// packet to it to the overlay at its first look (bpf/uplink_tc.c,
// overlay_arrival: the overlay program off the wire, else the node's VXLAN
// device), before any Service frontend is matched. A frontend there (UDP, that address, that port) is therefore
// never served, and these issues say so for the object that asks for
// one. The same frontend at the node's other addresses is served.

// TunnelPortIssues names the frontends of svc this node cannot serve
// because they are its overlay endpoint tunnel (the zero value: the node
// has no overlay, nothing to say): a UDP nodePort on the tunnel's port
// when the node serves NodePorts at the underlay address (nodePortAddrs,
// Node.NodePortFrontendAddrs), and a UDP port of an externalIP or load
// balancer address that is the underlay address.
func TunnelPortIssues(svc *corev1.Service, tunnel netip.AddrPort, nodePortAddrs []netip.Addr) []Issue {
	if !tunnel.IsValid() {
		return nil
	}
	at := tunnel.Addr()
	external := slices.Contains(svc.Spec.ExternalIPs, at.String())
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil && a == at {
			external = true
		}
	}
	nodePorts := slices.Contains(nodePortAddrs, at)
	var out []Issue
	for _, sp := range svc.Spec.Ports {
		if sp.Protocol != corev1.ProtocolUDP {
			continue
		}
		if nodePorts && sp.NodePort != 0 && uint16(sp.NodePort) == tunnel.Port() {
			out = append(out, tunnelPortIssue(fmt.Sprintf("nodePort %d/UDP", sp.NodePort), tunnel,
				"the Service is reached on this port at the node's other addresses only; choose another nodePort"))
		}
		if external && uint16(sp.Port) == tunnel.Port() {
			out = append(out, tunnelPortIssue(fmt.Sprintf("port %d/UDP at external address %s", sp.Port, at), tunnel,
				"choose another port or address"))
		}
	}
	return out
}

// TunnelHostPortIssues names the hostPorts of pod this node cannot serve
// because they are its overlay endpoint tunnel (the zero value: none): a
// UDP hostPort on the tunnel's port, on every address of the node or at
// the underlay address. None for a pod of another node: its own node
// reports its hostPorts.
func TunnelHostPortIssues(pod *corev1.Pod, node string, tunnel netip.AddrPort) []Issue {
	if !tunnel.IsValid() || pod.Spec.NodeName != node || pod.Spec.HostNetwork {
		return nil
	}
	var out []Issue
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Protocol != corev1.ProtocolUDP || cp.HostPort == 0 || uint16(cp.HostPort) != tunnel.Port() {
				continue
			}
			switch hostIP := HostIPOf(cp); {
			case !hostIP.IsValid():
				out = append(out, tunnelPortIssue(fmt.Sprintf("container %s: hostPort %d/UDP", c.Name, cp.HostPort), tunnel,
					"it is reached at the node's other addresses only; choose another hostPort"))
			case hostIP == tunnel.Addr():
				out = append(out, tunnelPortIssue(fmt.Sprintf("container %s: hostPort %d/UDP at hostIP %s", c.Name, cp.HostPort, hostIP), tunnel,
					"choose another hostPort or hostIP"))
			}
		}
	}
	return out
}

func tunnelPortIssue(what string, tunnel netip.AddrPort, advice string) Issue {
	return Issue{"TunnelPortConflict", fmt.Sprintf("%s: %s is this node's overlay endpoint (VXLAN): UDP there goes to the tunnel, not to this frontend; %s",
		what, tunnel, advice)}
}
