package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// VXLANOverhead is what encapsulation adds to a pod's packet: outer IPv4
// (20) + UDP (8) + VXLAN (8) headers and the inner Ethernet header (14).
// Pod interfaces get the underlay's MTU less this, so an encapsulated
// packet still fits the underlay without fragments.
const VXLANOverhead = 50

// minIPv4MTU is the least MTU an IPv4 interface may have (RFC 791: every
// module must forward 68 bytes without fragmenting).
const minIPv4MTU = 68

// UnderlayMTU is the MTU of the interface holding addr in the calling
// thread's network namespace.
func UnderlayMTU(addr netip.Addr) (int, error) {
	l, err := underlayLink(addr)
	if err != nil {
		return 0, err
	}
	return l.Attrs().MTU, nil
}

// EnsureVXLAN makes the node's overlay device in the calling thread's
// network namespace: a collect-metadata ("external") VXLAN device named
// name on UDP port port, which takes its tunnel endpoint and VNI from each
// packet's tunnel key (set by the pod programs, read by the overlay
// program) instead of from its configuration, so one device reaches every
// node. underlay is this node's address on the underlay, the one other
// nodes' ipcache entries name as the tunnel endpoint of its pods: it must
// be an address of this namespace. An existing device of that name is
// adopted when it is such a device on that port (a restarted agent), and
// refused otherwise. The device's MTU is the underlay interface's less
// VXLANOverhead, as pods': what the node routes onto it (its own traffic to
// other nodes' pods) fits the underlay once encapsulated, and the pod
// programs answer a packet bigger than it with ICMP fragmentation needed
// (bpf/lib/encap.h). The device is set up; its ifindex goes into
// Config.TunnelIfindex and AttachOverlay.
func EnsureVXLAN(name string, underlay netip.Addr, port int) (ifindex int, err error) {
	if !underlay.Is4() || underlay.IsUnspecified() {
		return 0, fmt.Errorf("VXLAN device %s: underlay address %s: the overlay needs the node's IPv4 underlay address", name, underlay)
	}
	if port <= 0 || port > 65535 {
		return 0, fmt.Errorf("VXLAN device %s: UDP port %d: use 1-65535 (4789 is VXLAN's)", name, port)
	}
	ul, err := underlayLink(underlay)
	if err != nil {
		return 0, fmt.Errorf("VXLAN device %s: %w", name, err)
	}
	mtu := ul.Attrs().MTU - VXLANOverhead
	if mtu < minIPv4MTU {
		return 0, fmt.Errorf("VXLAN device %s: the underlay interface %s's MTU %d leaves %d bytes after the encapsulation, "+
			"less than IPv4's minimum %d: raise the underlay's MTU", name, ul.Attrs().Name, ul.Attrs().MTU, mtu, minIPv4MTU)
	}
	l, err := netlink.LinkByName(name)
	if err == nil {
		vx, ok := l.(*netlink.Vxlan)
		if !ok || !vx.FlowBased || vx.Port != port {
			return 0, fmt.Errorf("interface %s exists and is not a collect-metadata VXLAN device on UDP port %d (%s): "+
				"delete it or choose another name for the overlay device", name, port, describeLink(l))
		}
	} else {
		var notFound netlink.LinkNotFoundError
		if !errors.As(err, &notFound) {
			return 0, fmt.Errorf("looking up VXLAN device %s: %w", name, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = name
		la.MTU = mtu
		vx := &netlink.Vxlan{LinkAttrs: la, FlowBased: true, Port: port, Learning: false, SrcAddr: underlay.AsSlice()}
		if err := netlink.LinkAdd(vx); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				return 0, fmt.Errorf("creating VXLAN device %s: %w: the kernel has no vxlan driver "+
					"(CONFIG_VXLAN; load the vxlan module, or use a kernel built with it)", name, err)
			}
			if errors.Is(err, unix.EINVAL) {
				return 0, fmt.Errorf("creating VXLAN device %s: %w: the kernel refused a collect-metadata (external) "+
					"VXLAN device on UDP port %d, which needs Linux 4.3+", name, err, port)
			}
			if errors.Is(err, unix.EADDRINUSE) || errors.Is(err, unix.EEXIST) {
				return 0, fmt.Errorf("creating VXLAN device %s: %w: another collect-metadata VXLAN device already uses UDP port %d "+
					"in this network namespace; use it, delete it, or choose another port", name, err, port)
			}
			return 0, fmt.Errorf("creating VXLAN device %s: %w", name, err)
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return 0, fmt.Errorf("looking up VXLAN device %s after creating it: %w", name, err)
		}
	}
	// The node's own traffic to other nodes' pods is routed onto the
	// device with a tunnel key per route (SyncTunnelRoutes); nobody would
	// answer ARP for those pods behind it, and none is needed: the
	// receiving node's program rewrites the frame's MACs.
	if l.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(l, mtu); err != nil {
			return 0, fmt.Errorf("setting VXLAN device %s's MTU to %d (the underlay's %d less the encapsulation): %w",
				name, mtu, ul.Attrs().MTU, err)
		}
	}
	if err := netlink.LinkSetARPOff(l); err != nil {
		return 0, fmt.Errorf("turning ARP off on VXLAN device %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return 0, fmt.Errorf("setting VXLAN device %s up: %w", name, err)
	}
	return l.Attrs().Index, nil
}

// underlayLink is the interface of the calling thread's network namespace
// that holds the address a.
func underlayLink(a netip.Addr) (netlink.Link, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing this network namespace's addresses: %w", err)
	}
	for _, x := range addrs {
		if got, ok := netip.AddrFromSlice(x.IP); ok && got.Unmap() == a {
			l, err := netlink.LinkByIndex(x.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("the interface holding underlay address %s: %w", a, err)
			}
			return l, nil
		}
	}
	return nil, fmt.Errorf("underlay address %s is not an address of this node's network namespace: "+
		"add it to the underlay interface first", a)
}

func describeLink(l netlink.Link) string {
	if vx, ok := l.(*netlink.Vxlan); ok {
		return fmt.Sprintf("type vxlan, collect-metadata %v, port %d", vx.FlowBased, vx.Port)
	}
	return "type " + l.Type()
}
