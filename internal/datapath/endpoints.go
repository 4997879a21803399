package datapath

import (
	"net"
	"net/netip"
)

// Endpoint is the desired shunt_endpoints entry of one local pod.
type Endpoint struct {
	IP      netip.Addr
	Ifindex int
	PodMAC  net.HardwareAddr
	NodeMAC net.HardwareAddr

	Identity        uint32 // the pod's security identity
	IngressIsolated bool   // some policy isolates the pod for ingress (default deny)
	EgressIsolated  bool   // some policy isolates the pod for egress (default deny)
	IngressRules    bool   // the pod has ingress policy entries (look them up even when not isolated)
	EgressRules     bool   // the pod has egress policy entries
}

// endpointKey keeps the address in network order: the C side compares it
// with iphdr->daddr.
func endpointKey(ip netip.Addr) podtcEndpointKey { return podtcEndpointKey{Ip4: be32(ip)} }

func endpointValue(e Endpoint) podtcEndpointInfo {
	v := podtcEndpointInfo{Ifindex: uint32(e.Ifindex), Identity: e.Identity}
	if e.IngressIsolated {
		v.Flags |= uint32(podtcEndpointFlagsENDPOINT_F_INGRESS_ISOLATED)
	}
	if e.EgressIsolated {
		v.Flags |= uint32(podtcEndpointFlagsENDPOINT_F_EGRESS_ISOLATED)
	}
	if e.IngressRules {
		v.Flags |= uint32(podtcEndpointFlagsENDPOINT_F_INGRESS_RULES)
	}
	if e.EgressRules {
		v.Flags |= uint32(podtcEndpointFlagsENDPOINT_F_EGRESS_RULES)
	}
	copy(v.PodMac[:], e.PodMAC)
	copy(v.NodeMac[:], e.NodeMAC)
	return v
}
