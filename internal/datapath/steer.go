package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Steering to the node proxy in tc (bpf/lib/steer.h): a connection from off
// the node (another node's pod, a client outside through a NodePort) to a
// local pod's port with HTTP rules is given to the proxy's transparent
// listener with bpf_sk_assign where it enters the node. The packet keeps
// the pod's address as its destination, so the node must deliver it
// locally rather than forward it to the pod: the programs mark it, and a
// routing rule sends marked packets to a table whose only route is
// `local 0.0.0.0/0 dev lo` (the routing TPROXY needs too).

// ProxySteer is where steered connections go and how they are routed.
type ProxySteer struct {
	// Listen is the node proxy's transparent listener (IP_TRANSPARENT),
	// e.g. 127.0.0.1:15006.
	Listen netip.AddrPort
	// Mark is what steered packets carry; the rule matches it exactly, so
	// it must not be a proxy upstream mark (ProxyMark), which the same
	// rule would otherwise deliver locally.
	Mark uint32
	// Table is the routing table of the local route; Priority the rule's.
	Table    int
	Priority int
}

func (s *ProxySteer) check(pm ProxyMark) error {
	if !s.Listen.Addr().Is4() || s.Listen.Port() == 0 {
		return fmt.Errorf("proxy steering listener %s: give the node proxy's transparent listener as an IPv4 address and port", s.Listen)
	}
	if s.Mark == 0 {
		return errors.New("proxy steering mark 0: every unmarked packet would be delivered locally")
	}
	if pm.Mask != 0 && s.Mark&pm.Mask == pm.Magic {
		return fmt.Errorf("proxy steering mark %#x is a proxy upstream mark (%#x under %#x): the proxy's upstream connections would be delivered locally", s.Mark, pm.Magic, pm.Mask)
	}
	if s.Table <= 0 || s.Table == unix.RT_TABLE_MAIN || s.Table == unix.RT_TABLE_LOCAL || s.Table == unix.RT_TABLE_DEFAULT {
		return fmt.Errorf("proxy steering routing table %d: give a table of shunt's own (not main, local or default)", s.Table)
	}
	return nil
}

// EnsureProxySteerRouting installs (again) the rule and the local route
// that deliver steered packets to the node's stack. A no-op without
// ProxySteer.
func (d *Datapath) EnsureProxySteerRouting() error {
	s := d.cfg.ProxySteer
	if s == nil {
		return nil
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("proxy steering: the loopback device: %w", err)
	}
	_, all, _ := net.ParseCIDR("0.0.0.0/0")
	route := &netlink.Route{
		LinkIndex: lo.Attrs().Index, Dst: all, Table: s.Table, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
		Protocol: tunnelRouteProtocol,
	}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("proxy steering: local route in table %d (`ip route replace local 0.0.0.0/0 dev lo table %d`): %w", s.Table, s.Table, err)
	}
	rule := netlink.NewRule()
	rule.Family = unix.AF_INET
	rule.Mark = s.Mark
	mask := uint32(0xffffffff)
	rule.Mask = &mask
	rule.Table = s.Table
	rule.Priority = s.Priority
	rules, err := netlink.RuleList(unix.AF_INET)
	if err != nil {
		return fmt.Errorf("proxy steering: listing routing rules: %w", err)
	}
	for _, r := range rules {
		if r.Mark == s.Mark && r.Table == s.Table && r.Priority == s.Priority {
			return nil
		}
	}
	if err := netlink.RuleAdd(rule); err != nil {
		return fmt.Errorf("proxy steering: routing rule (`ip rule add fwmark %#x lookup %d pref %d`): %w", s.Mark, s.Table, s.Priority, err)
	}
	return nil
}
