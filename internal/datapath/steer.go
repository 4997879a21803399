package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/steerroute"
)

// Steering to the node proxy in tc (bpf/lib/steer.h): a connection from off
// the node (another node's pod, a client outside through a NodePort) to a
// local pod's port with HTTP rules is given to the proxy's transparent
// listener with bpf_sk_assign where it enters the node. The packet keeps
// the pod's address as its destination, so the node must deliver it
// locally rather than forward it to the pod: the programs mark it, and a
// routing rule sends marked packets to a table whose only route is
// `local 0.0.0.0/0 dev lo`. That routing is the namespace's, shared by
// every instance in it: internal/steerroute installs and removes it.

// ProxySteer is where steered connections go and how they are routed.
type ProxySteer struct {
	// Listen is the node proxy's transparent listener (IP_TRANSPARENT),
	// e.g. 127.0.0.1:15006.
	Listen netip.AddrPort
	// Routing's Mark is what steered packets carry; the rule matches it
	// exactly, so it must not be a proxy upstream mark (ProxyMark), which
	// the same rule would otherwise deliver locally.
	steerroute.Routing
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
