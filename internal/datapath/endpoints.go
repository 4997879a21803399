package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"github.com/shuntnet/shunt/internal/netnsrun"
	"golang.org/x/sys/unix"
)

// Endpoint is the desired shunt_endpoints entry of one local pod.
type Endpoint struct {
	IP      netip.Addr
	Ifindex int
	PodMAC  net.HardwareAddr
	NodeMAC net.HardwareAddr
	// Netns is the pod's network namespace (a bind-mount path, as CNI's
	// CNI_NETNS): socket acceleration keys the pod's sockets by its
	// cookie. "" leaves the pod's sockets out of acceleration.
	Netns string

	Identity        uint32 // the pod's security identity
	IngressIsolated bool   // some policy isolates the pod for ingress (default deny)
	EgressIsolated  bool   // some policy isolates the pod for egress (default deny)
	IngressRules    bool   // the pod has ingress policy entries (look them up even when not isolated)
	EgressRules     bool   // the pod has egress policy entries
	// OwnProxy: the pod has its own inbound proxy (shunt.io/inbound-redirect),
	// to which tc sends clients from off the node (bpf/lib/steer.h).
	OwnProxy bool
}

// endpointKey keeps the address in network order: the C side compares it
// with iphdr->daddr.
func endpointKey(ip netip.Addr) podtcEndpointKey { return podtcEndpointKey{Ip4: be32(ip)} }

func endpointValue(e Endpoint, netnsCookie uint64) podtcEndpointInfo {
	v := podtcEndpointInfo{Ifindex: uint32(e.Ifindex), Identity: e.Identity, NetnsCookie: netnsCookie}
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
	if e.OwnProxy {
		v.Flags |= uint32(podtcEndpointFlagsENDPOINT_F_OWN_PROXY)
	}
	copy(v.PodMac[:], e.PodMAC)
	copy(v.NodeMac[:], e.NodeMAC)
	return v
}

// netnsCookies caches the cookie of each pod's network namespace by the
// namespace's inode: reading a cookie means entering the namespace, and a
// path can be reused by a new namespace (a pod recreated under its name),
// which has another inode.
type netnsCookies struct {
	byInode map[uint64]uint64
}

// cookie returns the network namespace cookie of the namespace file at
// path, 0 (and no error) when the namespace is gone.
func (c *netnsCookies) cookie(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("network namespace %s: %w", path, err)
	}
	if v, ok := c.byInode[st.Ino]; ok {
		return v, nil
	}
	var cookie uint64
	err := netnsrun.Do(path, func() error {
		var err error
		cookie, err = currentNetnsCookie()
		return err
	})
	if errors.Is(err, netnsrun.ErrGone) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if c.byInode == nil {
		c.byInode = map[uint64]uint64{}
	}
	c.byInode[st.Ino] = cookie
	return cookie, nil
}

// forget drops the cached namespaces that no endpoint uses any more.
func (c *netnsCookies) forget(keep map[uint64]bool) {
	for ino, cookie := range c.byInode {
		if !keep[cookie] {
			delete(c.byInode, ino)
		}
	}
}

// currentNetnsCookie is the cookie of the calling thread's network
// namespace, as bpf_get_netns_cookie reports it (SO_NETNS_COOKIE, Linux
// 5.14+).
func currentNetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for SO_NETNS_COOKIE: %w", err)
	}
	defer unix.Close(fd)
	var cookie uint64
	size := uint32(unsafe.Sizeof(cookie))
	if _, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE,
		uintptr(unsafe.Pointer(&cookie)), uintptr(unsafe.Pointer(&size)), 0); errno != 0 {
		return 0, fmt.Errorf("getsockopt(SO_NETNS_COOKIE) (Linux 5.14+): %w", errno)
	}
	return cookie, nil
}
