package services

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// NodePortAddresses selects the node addresses NodePorts are served on, as
// kube-proxy's --nodeport-addresses: the addresses in any of CIDRs, and
// with Primary the node's primary address (its InternalIP, the underlay
// address). A CIDR holding 127.0.0.1 makes the NodePorts reachable at
// 127.0.0.1:nodePort, from the node's own processes only (a pod's
// loopback is its own; nothing from outside reaches a loopback address).
// The zero value selects every address of the node except 127.0.0.1.
type NodePortAddresses struct {
	CIDRs   []netip.Prefix
	Primary bool
}

// nodeLoopback is the loopback address a NodePort may be served on: the
// one kube-proxy's iptables mode serves (route_localnet), which node
// processes dial as "localhost".
var nodeLoopback = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// ParseNodePortAddresses reads --nodeport-addresses values: IPv4 CIDRs
// and the word "primary". None: the default (every node address but
// 127.0.0.1).
func ParseNodePortAddresses(values []string) (NodePortAddresses, error) {
	var sel NodePortAddresses
	for _, v := range values {
		v = strings.TrimSpace(v)
		if v == "primary" {
			sel.Primary = true
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil || !p.Addr().Is4() {
			return NodePortAddresses{}, fmt.Errorf("--nodeport-addresses %q: give IPv4 CIDRs or \"primary\", e.g. primary,127.0.0.0/8 (as kube-proxy's flag)", v)
		}
		sel.CIDRs = append(sel.CIDRs, p.Masked())
	}
	return sel, nil
}

// IsDefault says the selector is the zero value: every node address
// except 127.0.0.1.
func (s NodePortAddresses) IsDefault() bool { return len(s.CIDRs) == 0 && !s.Primary }

// String is the selector as the flag takes it ("" for the default).
func (s NodePortAddresses) String() string {
	var parts []string
	if s.Primary {
		parts = append(parts, "primary")
	}
	for _, p := range s.CIDRs {
		parts = append(parts, p.String())
	}
	return strings.Join(parts, ",")
}

// NodePortFrontendAddrs are the addresses node serves its NodePorts on:
// by default every one of NodePortAddrs; with a selector those of
// NodePortAddrs and 127.0.0.1 it selects, in that order.
func (n *Node) NodePortFrontendAddrs() []netip.Addr {
	sel := n.NodePortAddresses
	if sel.IsDefault() {
		return n.NodePortAddrs
	}
	var out []netip.Addr
	for i, a := range append(slices.Clip(n.NodePortAddrs), nodeLoopback) {
		primary := i == 0 && a != nodeLoopback
		if (sel.Primary && primary) || slices.ContainsFunc(sel.CIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}
