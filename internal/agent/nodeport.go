package agent

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/services"
)

// nodePortOf is how outside clients reach the node's external Service
// frontends (NodePort, externalIPs, load balancer addresses): through the
// uplink programs on the interface holding the node's underlay address,
// SNAT to the node's pod-network address for backends on other nodes,
// with ports of the masquerade's range (the node's own connections take
// none of them). nil without an underlay address: the node's pods and
// processes still reach these frontends through the socket layer.
// cfg.NodePortMode dsr or hybrid sends such flows to the backend's node by
// DSR (bpf/lib/dsr.h): IPIP between the nodes' underlay addresses, with
// native routing and with the overlay alike (the underlay that carries
// VXLAN carries it too). It needs routing between nodes: refused without,
// before anything of the node is made.
func nodePortOf(cfg Config, mode datapath.Mode, podNetAddr netip.Addr) (*datapath.NodePort, error) {
	if cfg.NodePortMode.UsesDSR() && !cfg.routesBetweenNodes() {
		return nil, fmt.Errorf("--nodeport-mode %s needs routing between nodes (--routing native, or --tunnel vxlan): "+
			"DSR sends a flow to its backend's node; use one of them or --nodeport-mode snat", cfg.NodePortMode)
	}
	if !cfg.Underlay.IsValid() || !mode.UsesBPF() {
		return nil, nil
	}
	_, ifindex, err := datapath.UplinkOf(cfg.Underlay)
	if err != nil {
		return nil, fmt.Errorf("NodePort: %w", err)
	}
	eph, err := datapath.EphemeralPorts()
	if err != nil {
		return nil, err
	}
	if cfg.MasqueradePorts.Overlaps(eph) {
		return nil, fmt.Errorf("--masquerade-ports %s overlaps the node's ephemeral ports %s (net.ipv4.ip_local_port_range): "+
			"NodePort flows SNATed to the node take their source ports from that range; choose ports outside it", cfg.MasqueradePorts, eph)
	}
	// Every node accepts DSR packets at its underlay address, whatever
	// its own mode: nodes of one cluster may be rolled to a new mode one
	// at a time.
	return &datapath.NodePort{UplinkIfindex: ifindex, SNATAddr: podNetAddr, Ports: cfg.MasqueradePorts,
		Mode: cfg.NodePortMode, DSRAddr: cfg.Underlay, UplinkAddr: cfg.Underlay}, nil
}

// routesBetweenNodes says whether the node reaches other nodes' pods,
// natively or by the overlay: what DSR needs (its IPIP goes over the
// underlay in either case), as lib/dsr.h dsr_wanted reads it from the
// native and tunnel interfaces.
func (c Config) routesBetweenNodes() bool {
	return c.Routing == RoutingNative || c.Routing == RoutingTunnel
}

// dsrUnavailable says why this node sends no flow from outside by DSR,
// "" when it can: a Service whose annotation asks for DSR
// (dpinfo.ForwardingModeAnnotation) is SNATed here instead (lib/dsr.h
// dsr_wanted reads the same routing), and says so as a problem. Nothing
// to say where shunt does not serve the outside frontends.
func (a *Agent) dsrUnavailable() string {
	if a.cfg.LeaveExternalToKubeProxy || !a.cfg.Underlay.IsValid() || a.cfg.routesBetweenNodes() {
		return ""
	}
	return "this node has no routing between nodes: DSR needs --routing native or --tunnel vxlan (it sends a flow to its backend's node)"
}

// overlayEndpoint is the node's overlay endpoint (tunnelEndpoint), whose
// UDP is the overlay's, never a frontend's, where shunt serves the
// frontends from outside (services.TunnelPortIssues); the zero value
// otherwise.
func (a *Agent) overlayEndpoint() netip.AddrPort {
	if a.cfg.LeaveExternalToKubeProxy {
		return netip.AddrPort{}
	}
	return tunnelEndpoint(a.cfg)
}

// podsDefaultRoute says whether pods route everything through their node
// (podnet.Node.DefaultRoute): wherever a pod may talk to an address off
// the pod network. A node of a Kubernetes cluster (as every CNI plugin
// gives its pods), one that masquerades, and one with an underlay
// address, whose uplink brings clients from outside (a NodePort's
// backend on the ingress node, or any with externalTrafficPolicy Local,
// replies to the client's own address). A single-node lab without an
// underlay keeps none: it never sends a pod's packet off the machine.
func podsDefaultRoute(cfg Config) bool {
	return cfg.Kubernetes || cfg.Masquerade || cfg.Underlay.IsValid()
}

// nodePortAddrs are the addresses the node serves NodePorts on: its
// underlay address (where outside clients reach it) and its address on
// the pod network.
func (a *Agent) nodePortAddrs() []netip.Addr {
	var out []netip.Addr
	if a.cfg.Underlay.IsValid() {
		out = append(out, a.cfg.Underlay)
	}
	if ip := a.podPool.NodeIP(); ip.IsValid() && ip != a.cfg.Underlay {
		out = append(out, ip)
	}
	return out
}

// healthCheckAddrs are the addresses the healthCheckNodePorts listen on,
// as kube-proxy's: every address of the node (nil) by default, else the
// ones --nodeport-addresses serves NodePorts on (none when it selects no
// address of the node, which the log says).
func (a *Agent) healthCheckAddrs() []netip.Addr {
	if a.cfg.NodePortAddresses.IsDefault() {
		return nil
	}
	node := services.Node{NodePortAddrs: a.nodePortAddrs(), NodePortAddresses: a.cfg.NodePortAddresses}
	addrs := node.NodePortFrontendAddrs()
	if len(addrs) == 0 {
		a.log.Warn("no address of the node matches --nodeport-addresses: health check node ports are not served",
			"nodeport-addresses", a.cfg.NodePortAddresses.String(), "node-addresses", node.NodePortAddrs)
		return []netip.Addr{}
	}
	return addrs
}

// enableUplinkForwarding turns IPv4 forwarding on for the uplink: what
// the programs send out of it themselves (the replies of flows from
// outside, lib/nodeport.h; what they encapsulate for other nodes,
// lib/encap.h) leaves through a route lookup on it, which bpf_fib_lookup
// refuses on a device that does not forward
// (BPF_FIB_LKUP_RET_FWD_DISABLED), as pods' veths do. Only the uplink:
// the machine's other interfaces are left as they are. why names the
// part that needs it.
func enableUplinkForwarding(uplink, why string) error {
	fwd := filepath.Join("/proc/sys/net/ipv4/conf", uplink, "forwarding")
	if err := os.WriteFile(fwd, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("%s: enabling forwarding on the uplink %s (bpf_fib_lookup routes what leaves there): %w", why, uplink, err)
	}
	return nil
}
