package services

import (
	"net/netip"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// Frontend is what a client dials: a service address, port and protocol.
// It is the one key of a service port everywhere (compute, datapath,
// flow names).
type Frontend struct {
	VIP   netip.Addr
	Port  uint16
	Proto uint8 // 6 TCP, 17 UDP
}

// Kind says which address of a Service a frontend is: the ClusterIP, or
// one that traffic from outside the cluster reaches (a node's address and
// nodePort, an externalIP, a load balancer's ingress address).
type Kind uint8

const (
	KindClusterIP Kind = iota
	KindNodePort
	KindExternalIP
	KindLoadBalancer
	KindHostPort // a pod's hostPort on its node's addresses (or its hostIP)
)

var kindNames = [...]string{KindClusterIP: "clusterip", KindNodePort: "nodeport", KindExternalIP: "externalip", KindLoadBalancer: "lb",
	KindHostPort: "hostport"}

// String is the kind as flows and dumps name it.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// External says whether traffic from outside the cluster reaches the
// frontend: the uplink programs translate it.
func (k Kind) External() bool { return k != KindClusterIP }

// Port is the desired state of one service port: what a connect to its
// frontend may be translated to.
type Port struct {
	Frontend
	Kind            Kind
	Name            string // "ns/svc:port", for dumps, errors and flows
	AffinityTimeout uint32 // seconds; 0: no session affinity
	// LocalOnly: externalTrafficPolicy Local on an external frontend: the
	// backends are this node's endpoints only, and the client's address
	// is kept.
	LocalOnly bool
	// Forwarding: the Service's forwarding mode on an external frontend
	// (annotation shunt.io/forwarding-mode): how a flow to a backend on
	// another node goes, snat or dsr; "": the node's --nodeport-mode.
	Forwarding dpinfo.NodePortMode
	// SourceRanges: a load balancer frontend's loadBalancerSourceRanges,
	// the only clients from outside it admits (none: every client).
	SourceRanges []netip.Prefix
	Backends     []Backend
}

// Backend is one endpoint address of a service port.
type Backend struct {
	IP   netip.Addr
	Port uint16
}

// Node is the node a service table is computed for: its name (which
// endpoints are local, for externalTrafficPolicy Local) and the addresses
// its NodePorts are served on.
type Node struct {
	Name string
	// NodePortAddrs are the node's addresses (its primary one, the
	// underlay's, first): its NodePorts are served on those
	// NodePortAddresses selects, its hostPorts on all of them.
	NodePortAddrs []netip.Addr
	// ExternalByKubeProxy: kube-proxy runs beside shunt and serves the
	// Services' outside frontends (NodePorts, load balancer addresses,
	// externalIPs); shunt computes the ClusterIPs only (hostPorts, which
	// are no kube-proxy's, stay).
	ExternalByKubeProxy bool
	// NodePortAddresses selects which addresses serve NodePorts (shuntd
	// --nodeport-addresses); zero: all of NodePortAddrs.
	NodePortAddresses NodePortAddresses
	// Zones are the nodes' zones (their topology.kubernetes.io/zone
	// label) by node name, for trafficDistribution PreferSameZone.
	Zones map[string]string
}
