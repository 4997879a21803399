package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/steerroute"
)

// TunnelRoute is the route to another node's pods: its pod CIDR, reached
// at that node's underlay address. With the overlay it carries this node's
// own traffic (its processes, not its pods: the pod programs encapsulate
// theirs) through the VXLAN device, encapsulated to that node with the
// remote-node identity as the VNI. With native routing it is an ordinary
// route on the underlay interface, via that node: the node's own traffic
// takes it, and the pod programs find it with bpf_fib_lookup.
type TunnelRoute struct {
	PodCIDR netip.Prefix
	Node    netip.Addr // the other node's underlay address
}

// tunnelRouteProtocol marks the routes shunt owns on the overlay device or
// the underlay interface (rtm_protocol), so a sync removes only its own
// stale ones: shunt's one protocol number, which the proxy steering's
// rule and route carry too.
const tunnelRouteProtocol = netlink.RouteProtocol(steerroute.Protocol)

// SyncTunnelRoutes makes the overlay device (or, with native routing, the
// underlay interface) carry exactly routes of shunt's, with src (this
// node's pod-network address, which the other nodes know as this node's)
// as the source of what the node sends on them. A no-op with neither.
// The routes go when the node does: with the overlay device, or, on the
// underlay, with src (the kernel removes the routes whose source address
// is removed, and teardown removes the node interface holding it).
//
// With native routing, a node that is not a next hop this node reaches
// directly (ENETUNREACH: not on the underlay interface's network) gets no
// route and is returned in unreachable, not as an error: the rest is
// programmed, and trying again cannot help until that Node's address or
// the underlay changes (which brings another sync). The caller names it
// as a problem of that Node.
func (d *Datapath) SyncTunnelRoutes(src netip.Addr, routes []TunnelRoute) (unreachable []TunnelRoute, err error) {
	dev := d.cfg.TunnelIfindex
	if d.cfg.NativeIfindex != 0 {
		dev = d.cfg.NativeIfindex
	}
	if dev == 0 {
		return nil, nil
	}
	want := map[netip.Prefix]bool{}
	var errs []error
	for _, r := range routes {
		want[r.PodCIDR.Masked()] = true
		rt := &netlink.Route{
			LinkIndex: dev, Dst: prefixNet(r.PodCIDR.Masked()), Src: src.AsSlice(), Protocol: tunnelRouteProtocol,
		}
		if d.cfg.NativeIfindex != 0 {
			rt.Gw = r.Node.AsSlice()
		} else {
			rt.Scope = netlink.SCOPE_LINK
			rt.Encap = &ipTunnelEncap{ID: uint32(podtcShuntIdentitySHUNT_ID_REMOTE_NODE), Dst: r.Node}
		}
		if err := netlink.RouteReplace(rt); err != nil {
			switch {
			case d.cfg.NativeIfindex != 0 && errors.Is(err, unix.ENETUNREACH):
				unreachable = append(unreachable, r)
				continue
			case d.cfg.NativeIfindex == 0 && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)):
				err = fmt.Errorf("%w (the kernel needs lightweight tunnels, CONFIG_LWTUNNEL, Linux 4.3+)", err)
			}
			errs = append(errs, fmt.Errorf("route to node %s's pods %s: %w", r.Node, r.PodCIDR, err))
		}
	}
	have, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: dev, Protocol: tunnelRouteProtocol},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return unreachable, errors.Join(append(errs, fmt.Errorf("listing the routes of shunt's on ifindex %d: %w", dev, err))...)
	}
	for _, r := range have {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		addr, _ := netip.AddrFromSlice(r.Dst.IP)
		if want[netip.PrefixFrom(addr.Unmap(), ones)] {
			continue
		}
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("removing the stale route to %s: %w", r.Dst, err))
		}
	}
	return unreachable, errors.Join(errs...)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// ipTunnelEncap is the kernel's lightweight IPv4 tunnel encapsulation
// (LWTUNNEL_ENCAP_IP, `ip route ... encap ip id ID dst ADDR`): the route
// gives a collect-metadata device the tunnel key, as the pod programs do
// with bpf_skb_set_tunnel_key. vishvananda/netlink has only the IPv6 one.
type ipTunnelEncap struct {
	ID  uint32 // the VNI
	Dst netip.Addr
}

// Attributes of LWTUNNEL_ENCAP_IP (include/uapi/linux/lwtunnel.h).
const (
	lwtunnelIPID  = 1 // __be64
	lwtunnelIPDst = 2 // IPv4 address
)

func (e *ipTunnelEncap) Type() int { return nl.LWTUNNEL_ENCAP_IP }

func (e *ipTunnelEncap) Encode() ([]byte, error) {
	if !e.Dst.Is4() {
		return nil, fmt.Errorf("tunnel destination %s is not IPv4", e.Dst)
	}
	b := binary.NativeEndian.AppendUint16(nil, 4+8)
	b = binary.NativeEndian.AppendUint16(b, lwtunnelIPID)
	b = binary.BigEndian.AppendUint64(b, uint64(e.ID))
	b = binary.NativeEndian.AppendUint16(b, 4+4)
	b = binary.NativeEndian.AppendUint16(b, lwtunnelIPDst)
	dst := e.Dst.As4()
	return append(b, dst[:]...), nil
}

func (e *ipTunnelEncap) Decode(b []byte) error {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return err
	}
	for _, a := range attrs {
		switch {
		case a.Attr.Type == lwtunnelIPID && len(a.Value) == 8:
			e.ID = uint32(binary.BigEndian.Uint64(a.Value))
		case a.Attr.Type == lwtunnelIPDst && len(a.Value) == 4:
			e.Dst = netip.AddrFrom4([4]byte(a.Value))
		}
	}
	return nil
}

func (e *ipTunnelEncap) String() string { return fmt.Sprintf("ip id %d dst %s", e.ID, e.Dst) }

func (e *ipTunnelEncap) Equal(o netlink.Encap) bool {
	x, ok := o.(*ipTunnelEncap)
	return ok && *x == *e
}
