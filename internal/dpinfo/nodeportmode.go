package dpinfo

import "fmt"

// NodePortMode is how a flow from outside reaches a backend on another
// node (shuntd --nodeport-mode): SNAT to the ingress node's address, the
// reply coming back through it; DSR, the client's address kept and the
// flow carried to the backend's node in IPIP with the service address,
// the reply leaving from there (bpf/lib/dsr.h); hybrid, DSR for TCP and
// SNAT for UDP, as Cilium's.
type NodePortMode string

const (
	NodePortSNAT   NodePortMode = "snat"
	NodePortDSR    NodePortMode = "dsr"
	NodePortHybrid NodePortMode = "hybrid"
)

// UsesDSR says whether some flows go by DSR.
func (m NodePortMode) UsesDSR() bool { return m == NodePortDSR || m == NodePortHybrid }

// ParseNodePortMode reads a mode; "" is the default, snat.
func ParseNodePortMode(s string) (NodePortMode, error) {
	switch m := NodePortMode(s); m {
	case "":
		return NodePortSNAT, nil
	case NodePortSNAT, NodePortDSR, NodePortHybrid:
		return m, nil
	}
	return "", fmt.Errorf("nodeport mode %q: give snat, dsr (direct server return) or hybrid (DSR for TCP, SNAT for UDP)", s)
}

// ForwardingModeAnnotation sets, on a Service, how flows from outside to
// its external frontends (NodePorts, load balancer addresses, externalIPs)
// reach a backend on another node, over the node's --nodeport-mode: snat
// or dsr, as Cilium's service.cilium.io/forwarding-mode.
const ForwardingModeAnnotation = "shunt.io/forwarding-mode"

// ParseForwardingMode reads a ForwardingModeAnnotation value: snat or
// dsr; "" (no annotation) is the node's mode, and so is the zero mode
// returned with an error.
func ParseForwardingMode(s string) (NodePortMode, error) {
	switch m := NodePortMode(s); m {
	case "", NodePortSNAT, NodePortDSR:
		return m, nil
	}
	return "", fmt.Errorf("annotation %s: %q: give snat or dsr (direct server return); without it the node's --nodeport-mode holds",
		ForwardingModeAnnotation, s)
}
