package datapath

import (
	"fmt"
	"net/netip"
)

// The nodes DSR's IPIP is taken from (bpf/lib/dsr.h): shunt_dsr_nodes
// holds the underlay addresses of the cluster's other nodes, and the
// uplink's ingress program drops an IPIP packet in DSR's format whose
// outer source is not one of them (dsr-unknown-node). Without it, any
// host of the underlay could hand a pod a packet with a source of its
// choosing, judged by the pod's ingress policy as that source, past the
// ingress node's checks (a load balancer address's source ranges).

// dsrNodesOn says whether the node takes DSR packets at all: the uplink
// programs run with an underlay address to take them at.
func (d *Datapath) dsrNodesOn() bool {
	np := d.cfg.NodePort
	return np != nil && np.DSRAddr.IsValid() && d.uplink.ShuntDsrNodes != nil
}

// SyncDSRNodes makes shunt_dsr_nodes hold exactly addrs: the underlay
// addresses of the cluster's other nodes (each Node's InternalIP, else its
// ExternalIP: policy.NodeTunnel), the outer sources DSR packets are taken
// from. A no-op on a node that takes none (no NodePort with a DSR
// address). A list that does not fit is refused before any write.
func (d *Datapath) SyncDSRNodes(addrs []netip.Addr) error {
	if !d.dsrNodesOn() {
		return nil
	}
	want := map[uplinktcDsrNodeKey]uplinktcDsrNodeValue{}
	for _, a := range addrs {
		if !a.Is4() {
			return fmt.Errorf("node address %s for shunt_dsr_nodes: only IPv4 underlay addresses are supported", a)
		}
		want[uplinktcDsrNodeKey{Addr: be32(a)}] = uplinktcDsrNodeValue{}
	}
	return replaceMirrored(d, &d.dsrNodes, want)
}

// dsrNodeKeyText names an entry of shunt_dsr_nodes, as `map dump` and the
// drift report show it.
func dsrNodeKeyText(k uplinktcDsrNodeKey) string { return fromBe32(k.Addr).String() }

// verifyDSRNodes compares shunt_dsr_nodes with what SyncDSRNodes wrote.
func (d *Datapath) verifyDSRNodes(r *DriftReport, repair bool) error {
	if !d.dsrNodesOn() {
		return nil
	}
	fix, err := verifyMirror(r, &d.dsrNodes, dsrNodeKeyText, func(uplinktcDsrNodeKey, uplinktcDsrNodeValue) string { return "node" })
	if err != nil || !repair {
		return err
	}
	// Nodes missing first, then the entries of no node.
	if err := fix.puts(nil); err != nil {
		return fmt.Errorf("repairing shunt_dsr_nodes: %w", err)
	}
	if err := fix.deletes(nil); err != nil {
		return fmt.Errorf("repairing shunt_dsr_nodes: %w", err)
	}
	countFix(r, fix)
	return nil
}
