// Package podnet builds the network plumbing of pods and of the node: a
// veth pair into the pod's network namespace, a /32 address and routes. It
// is the one implementation of that plumbing: shunt-cni (internal/cniplugin)
// attaches pods into the namespace a runtime gives it, and the lab (playing
// the runtime) creates named namespaces for it. It touches network
// interfaces only; BPF programs are attached by internal/datapath.
package podnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces live (as with `ip netns`).
const NetnsDir = "/run/netns"

// PodIfName is the pod side of the veth, as every container runtime names it.
const PodIfName = "eth0"

// maxAliasLen is the longest interface alias the kernel takes (IFALIASZ-1).
const maxAliasLen = 255

// Node is the host side of a lab node.
type Node struct {
	Bridge  bool         // classic bridge mode: pods share one L2 segment
	PodCIDR netip.Prefix // addresses pods get
	NodeIP  netip.Addr   // the node's address in PodCIDR, the pods' gateway
	// ServiceCIDR is routed through the node too, so packets to a ClusterIP
	// that no socket hook translated reach the tc fallback.
	ServiceCIDR netip.Prefix
	// ClusterCIDR holds every node's pod CIDR: pods route it through
	// their node, which forwards to pods of other nodes (the overlay).
	// Invalid: one node, only its own pod CIDR is routed.
	ClusterCIDR netip.Prefix
	// DefaultRoute: pods route everything else through the node too:
	// to outside the cluster (masqueraded or not), and their replies to
	// clients from outside (without it a pod reaches nothing off the
	// node's pod network).
	DefaultRoute bool
	HostIf       string // name of the bridge (bridge mode) or of the veth holding NodeIP
	MTU          int
}

// Pod is the plumbing of one pod.
type Pod struct {
	Netns string // name under NetnsDir, for namespaces podnet creates (lab)
	// NetnsPath is the namespace to plumb when someone else made it (a
	// runtime's CNI_NETNS); it wins over Netns.
	NetnsPath string
	IfName    string // pod side of the veth; PodIfName when empty
	HostIf    string // host side of the veth
	PodIP     netip.Addr
	Alias     string // interface alias set on HostIf so leftovers can be found
}

func (p Pod) nsPath() string {
	if p.NetnsPath != "" {
		return p.NetnsPath
	}
	return NetnsPath(p.Netns)
}

func (p Pod) ifName() string {
	if p.IfName != "" {
		return p.IfName
	}
	return PodIfName
}

// Links is what the datapath needs to forward to a pod.
type Links struct {
	HostIfindex int
	HostMAC     net.HardwareAddr
	PodMAC      net.HardwareAddr
}

// NetnsPath returns the bind-mount path of a named namespace.
func NetnsPath(name string) string { return filepath.Join(NetnsDir, name) }

// SetupNode creates the node's interface holding NodeIP (a bridge in bridge
// mode, otherwise one end of a veth pair, as cilium_host/cilium_net: the
// dummy driver is not in every kernel). It is idempotent. It leaves the
// machine's global ip_forward alone: forwarding is enabled per pod veth.
func SetupNode(n Node) error {
	var l netlink.Link
	la := netlink.NewLinkAttrs()
	la.Name = n.HostIf
	la.MTU = n.mtu()
	prefixLen := 32
	if n.Bridge {
		l = &netlink.Bridge{LinkAttrs: la}
		prefixLen = n.PodCIDR.Bits()
	} else {
		l = &netlink.Veth{LinkAttrs: la, PeerName: nodePeerIf(n.HostIf)}
	}
	if err := netlink.LinkAdd(l); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("creating node interface %s: %w", n.HostIf, err)
	}
	l, err := netlink.LinkByName(n.HostIf)
	if err != nil {
		return fmt.Errorf("looking up node interface %s: %w", n.HostIf, err)
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.NodeIP, prefixLen))}
	if err := netlink.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("adding %s to %s: %w", addr, n.HostIf, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting %s up: %w", n.HostIf, err)
	}
	if peer, err := netlink.LinkByName(nodePeerIf(n.HostIf)); err == nil {
		netlink.LinkSetUp(peer)
	}
	return nil
}

// nodePeerIf names the other end of the node veth: foo_host -> foo_net.
func nodePeerIf(hostIf string) string {
	return strings.TrimSuffix(hostIf, "_host") + "_net"
}

// TeardownNode removes the node interface (a no-op when absent).
func TeardownNode(n Node) error {
	l, err := netlink.LinkByName(n.HostIf)
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("deleting %s: %w", n.HostIf, err)
	}
	return nil
}

// PodRoutes are the prefixes a pod routes through the node (gateway
// NodeIP). The pod network and the services, and a default route when
// the node asks (DefaultRoute: a Kubernetes node, one that masquerades or
// has an uplink, where pods answer clients outside the cluster); a
// single-node lab asks none, so it never sends a packet off this machine
// (a pod's DNS lookup of the host's resolver fails at once instead of
// leaking out).
func (n Node) PodRoutes() []netip.Prefix {
	var routes []netip.Prefix
	if n.ServiceCIDR.IsValid() {
		routes = append(routes, n.ServiceCIDR)
	}
	if !n.Bridge && n.PodCIDR.IsValid() {
		routes = append(routes, n.PodCIDR) // in bridge mode it is on-link
	}
	if n.ClusterCIDR.IsValid() && n.ClusterCIDR != n.PodCIDR {
		routes = append(routes, n.ClusterCIDR) // the node's own, more specific, wins
	}
	if n.DefaultRoute {
		routes = append(routes, netip.PrefixFrom(netip.IPv4Unspecified(), 0))
	}
	return routes
}

// PodPrefixLen is the prefix length of a pod's address: a /32 routed
// through the node, or the whole pod CIDR on a bridge.
func (n Node) PodPrefixLen() int {
	if n.Bridge {
		return n.PodCIDR.Bits()
	}
	return 32
}

func (n Node) mtu() int {
	if n.MTU == 0 {
		return 1500
	}
	return n.MTU
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// SetupPod creates the pod's named namespace and attaches the pod to it.
// It is idempotent: an existing pod is only re-inspected.
func SetupPod(n Node, p Pod) (Links, error) {
	if links, err := Inspect(p); err == nil {
		return links, nil
	}
	// A half-built pod (namespace without veth) is rebuilt from scratch.
	if err := TeardownPod(p); err != nil {
		return Links{}, err
	}
	if err := CreateNetns(p.Netns, p.Alias); err != nil {
		return Links{}, err
	}
	links, err := AttachPod(n, p)
	if err != nil {
		TeardownPod(p)
		return Links{}, err
	}
	return links, nil
}

// CreateNetns creates a named network namespace under NetnsDir, as a
// container runtime does before it calls the CNI plugin. A non-empty owner
// is set as the alias of the namespace's loopback interface: the mark by
// which NetnsOwnedBy finds it again, with or without the creator's state
// (a name prefix alone would claim namespaces someone else named alike).
// The mark is set before the namespace gets its name, so a creator killed
// midway leaves no namespace that is named but unmarked (which no sweep
// could claim): at worst a file with nothing mounted (HalfMadeNetns).
func CreateNetns(name, owner string) error {
	ns, err := newNamedNetns(name, owner)
	if err != nil {
		return err
	}
	return ns.Close()
}

func markNetns(ns netns.NsHandle, owner string) error {
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err != nil {
		return err
	}
	return nh.LinkSetAlias(lo, owner[:min(len(owner), maxAliasLen)])
}

// NetnsOwnedBy lists the paths of the named network namespaces whose name
// starts with namePrefix and which hold an interface whose alias starts
// with owner: the loopback CreateNetns marked, or a pod side a plugin
// aliased. A namespace it cannot open is not claimed.
func NetnsOwnedBy(namePrefix, owner string) []string {
	var owned []string
	for _, path := range namedNetnsWithPrefix(namePrefix) {
		if netnsHoldsAlias(path, owner) {
			owned = append(owned, path)
		}
	}
	return owned
}

// HalfMadeNetns are the paths under NetnsDir, with names that start with
// prefix, that are files and not mounted namespaces: what a process killed
// between creating a namespace's file and bind-mounting the namespace on it
// leaves (netns.NewNamed and `ip netns add` create the file first), or
// between unmounting one and removing its file (netns.DeleteNamed). Nothing
// holds such a file and no namespace is behind it; `ip netns list` shows it
// and fails on it ("Peer netns reference is invalid").
func HalfMadeNetns(prefix string) []string {
	var half []string
	for _, path := range namedNetnsWithPrefix(prefix) {
		var fs unix.Statfs_t
		if err := unix.Statfs(path, &fs); err == nil && fs.Type != unix.NSFS_MAGIC {
			half = append(half, path)
		}
	}
	return half
}

func netnsHoldsAlias(path, prefix string) bool {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return false
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return false
	}
	defer nh.Close()
	links, err := nh.LinkList()
	if err != nil {
		return false
	}
	return slices.ContainsFunc(links, func(l netlink.Link) bool { return strings.HasPrefix(l.Attrs().Alias, prefix) })
}

// DeleteNetns removes a named namespace (a no-op when absent).
func DeleteNetns(name string) error {
	if _, err := os.Stat(NetnsPath(name)); err != nil {
		return nil
	}
	if err := netns.DeleteNamed(name); err != nil {
		// Not a mount point any more (half-deleted): remove the file.
		if rerr := os.Remove(NetnsPath(name)); rerr != nil {
			return fmt.Errorf("deleting namespace %s: %w", name, err)
		}
	}
	return nil
}

// AttachPod plumbs a pod into its existing namespace (p.NetnsPath, else
// p.Netns): the veth pair, the pod's address and routes, the host side's
// route and neighbour. What a CNI ADD does. On failure nothing is left
// behind: the host veth (and with it the pod side) is deleted.
func AttachPod(n Node, p Pod) (Links, error) {
	ns, err := netns.GetFromPath(p.nsPath())
	if err != nil {
		return Links{}, fmt.Errorf("opening the pod's network namespace %s: %w", p.nsPath(), err)
	}
	defer ns.Close()
	links, err := setupVeth(n, p, ns)
	if err != nil {
		DeleteLink(p.HostIf)
		return Links{}, fmt.Errorf("pod namespace %s: %w", p.nsPath(), err)
	}
	return links, nil
}

// DetachPod deletes the pod's veth (its peer, addresses and routes go with
// it), leaving the namespace to its owner. What a CNI DEL does; absent is
// not an error.
func DetachPod(p Pod) error {
	if err := DeleteLink(p.HostIf); err != nil {
		return fmt.Errorf("deleting %s: %w", p.HostIf, err)
	}
	return nil
}

// ensureNetnsDir makes NetnsDir a shared bind mount of itself, as
// `ip netns add` does. Without it, the first `ip netns add` run later on the
// machine bind-mounts the directory over our namespace mounts, hiding them
// so they can no longer be unmounted by path.
func ensureNetnsDir() error {
	// Pods are built several at a time: two first calls at once would
	// both find no mount point and stack two bind mounts.
	netnsDirMu.Lock()
	defer netnsDirMu.Unlock()
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == unix.EINVAL { // not a mount point yet
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s: %w", NetnsDir, err)
		}
		err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount: %w", NetnsDir, err)
	}
	return nil
}

var netnsDirMu sync.Mutex

// newNamedNetns creates a named namespace, marked as owner's (CreateNetns;
// "": unmarked), without moving the calling thread into it for longer than
// the creation itself. It is netns.NewNamed with the mark set between the
// namespace's creation and its bind mount on NetnsPath(name).
func newNamedNetns(name, owner string) (netns.NsHandle, error) {
	if err := ensureNetnsDir(); err != nil {
		return 0, err
	}
	type created struct {
		ns  netns.NsHandle
		err error
	}
	result := make(chan created, 1)
	// netns.New switches the thread it runs on; do it on a locked thread
	// that is thrown away afterwards (it exits still locked), so no
	// goroutine of the process ever runs in the pod's namespace by
	// accident.
	go func() {
		runtime.LockOSThread()
		ns, err := netns.New()
		if err == nil {
			err = nameNetns(ns, name, owner)
			if err != nil {
				ns.Close()
			}
		}
		result <- created{ns, err}
	}()
	r := <-result
	if r.err != nil {
		return 0, fmt.Errorf("creating network namespace %s: %w", name, r.err)
	}
	return r.ns, nil
}

// nameNetns marks ns (the calling thread's namespace) as owner's, then
// bind-mounts it on NetnsPath(name), as `ip netns add` names one.
func nameNetns(ns netns.NsHandle, name, owner string) error {
	if owner != "" {
		if err := markNetns(ns, owner); err != nil {
			return fmt.Errorf("marking it as %q's: %w", owner, err)
		}
	}
	path := NetnsPath(name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
	if err := unix.Mount(self, path, "bind", unix.MS_BIND, ""); err != nil {
		return errors.Join(fmt.Errorf("bind-mounting it on %s: %w", path, err), os.Remove(path))
	}
	return nil
}

func setupVeth(n Node, p Pod, ns netns.NsHandle) (Links, error) {
	la := netlink.NewLinkAttrs()
	la.Name = p.HostIf
	la.MTU = n.mtu()
	veth := &netlink.Veth{LinkAttrs: la, PeerName: p.ifName(), PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return Links{}, fmt.Errorf("creating veth %s: %w", p.HostIf, err)
	}
	host, err := netlink.LinkByName(p.HostIf)
	if err != nil {
		return Links{}, err
	}
	if p.Alias != "" {
		// The kernel keeps IFALIASZ-1 bytes and refuses more; the alias
		// is found by its prefix (the instance's), which is kept.
		alias := p.Alias[:min(len(p.Alias), maxAliasLen)]
		if err := netlink.LinkSetAlias(host, alias); err != nil {
			return Links{}, fmt.Errorf("setting alias on %s: %w", p.HostIf, err)
		}
	}
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return Links{}, err
	}
	defer nh.Close()
	pod, err := nh.LinkByName(p.ifName())
	if err != nil {
		return Links{}, err
	}
	hostMAC, podMAC := host.Attrs().HardwareAddr, pod.Attrs().HardwareAddr

	// Pod side: address, loopback, default route via the node.
	if err := nh.AddrAdd(pod, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(p.PodIP, n.PodPrefixLen()))}); err != nil {
		return Links{}, fmt.Errorf("adding %s to the pod: %w", p.PodIP, err)
	}
	if lo, err := nh.LinkByName("lo"); err == nil {
		nh.LinkSetUp(lo)
	}
	if err := nh.LinkSetUp(pod); err != nil {
		return Links{}, err
	}
	gw := n.NodeIP.AsSlice()
	if !n.Bridge {
		// The gateway is the host veth itself: a static neighbour entry
		// saves the ARP round trip and works without proxy ARP.
		if err := nh.NeighSet(&netlink.Neigh{LinkIndex: pod.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: gw, HardwareAddr: hostMAC}); err != nil {
			return Links{}, fmt.Errorf("adding gateway neighbour in the pod: %w", err)
		}
	}
	for _, dst := range n.PodRoutes() {
		r := &netlink.Route{LinkIndex: pod.Attrs().Index, Dst: ipNet(dst), Gw: gw, Flags: int(netlink.FLAG_ONLINK)}
		if err := nh.RouteAdd(r); err != nil {
			return Links{}, fmt.Errorf("adding route to %s in the pod: %w", dst, err)
		}
	}

	// Host side.
	if n.Bridge {
		br, err := netlink.LinkByName(n.HostIf)
		if err != nil {
			return Links{}, fmt.Errorf("bridge %s: %w", n.HostIf, err)
		}
		if err := netlink.LinkSetMaster(host, br); err != nil {
			return Links{}, fmt.Errorf("adding %s to bridge %s: %w", p.HostIf, n.HostIf, err)
		}
	}
	if err := disableIPv6(p.HostIf); err != nil {
		return Links{}, err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return Links{}, err
	}
	if !n.Bridge {
		// IPv4 forwarding is decided by the device a packet comes in on:
		// enabling it on the pod's veth alone lets the node route between
		// pods without making the whole machine a router.
		fwd := filepath.Join("/proc/sys/net/ipv4/conf", p.HostIf, "forwarding")
		if err := os.WriteFile(fwd, []byte("1"), 0o644); err != nil {
			return Links{}, fmt.Errorf("enabling forwarding on %s: %w", p.HostIf, err)
		}
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: host.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: p.PodIP.AsSlice(), HardwareAddr: podMAC}); err != nil {
			return Links{}, fmt.Errorf("adding pod neighbour on the host: %w", err)
		}
		route := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipNet(netip.PrefixFrom(p.PodIP, 32)),
			Scope: netlink.SCOPE_LINK, Src: n.NodeIP.AsSlice()}
		if err := netlink.RouteReplace(route); err != nil {
			return Links{}, fmt.Errorf("adding host route to %s: %w", p.PodIP, err)
		}
	}
	return Links{HostIfindex: host.Attrs().Index, HostMAC: hostMAC, PodMAC: podMAC}, nil
}

// disableIPv6 turns IPv6 off on a host-side pod veth before it comes up,
// so it never gets a link-local address and the node drops every IPv6
// packet a pod sends. shunt's datapath and policy are IPv4: without this a
// pod reached any service of the node listening on all addresses (a
// metrics listener on ":9962", sshd) at the veth's fe80:: address, past
// every NetworkPolicy. A kernel without IPv6 has nothing to turn off.
func disableIPv6(hostIf string) error {
	err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", hostIf, "disable_ipv6"), []byte("1"), 0o644)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disabling IPv6 on %s: %w", hostIf, err)
	}
	return nil
}

// Inspect reads the plumbing of an existing pod.
func Inspect(p Pod) (Links, error) {
	ns, err := netns.GetFromPath(p.nsPath())
	if err != nil {
		return Links{}, fmt.Errorf("pod namespace %s: %w", p.nsPath(), err)
	}
	defer ns.Close()
	host, err := netlink.LinkByName(p.HostIf)
	if err != nil {
		return Links{}, fmt.Errorf("pod interface %s: %w", p.HostIf, err)
	}
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return Links{}, err
	}
	defer nh.Close()
	pod, err := nh.LinkByName(p.ifName())
	if err != nil {
		return Links{}, fmt.Errorf("pod %s: %s: %w", p.nsPath(), p.ifName(), err)
	}
	return Links{HostIfindex: host.Attrs().Index, HostMAC: host.Attrs().HardwareAddr, PodMAC: pod.Attrs().HardwareAddr}, nil
}

// Verify checks that a pod's plumbing is what AttachPod built: both ends
// of the veth, the pod's address and routes, and (routed modes) the host's
// route to the pod. What a CNI CHECK asks; the error names what is missing.
func Verify(n Node, p Pod) (Links, error) {
	links, err := Inspect(p)
	if err != nil {
		return Links{}, err
	}
	ns, err := netns.GetFromPath(p.nsPath())
	if err != nil {
		return Links{}, fmt.Errorf("pod namespace %s: %w", p.nsPath(), err)
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return Links{}, err
	}
	defer nh.Close()
	pod, err := nh.LinkByName(p.ifName())
	if err != nil {
		return Links{}, fmt.Errorf("pod %s: %s: %w", p.nsPath(), p.ifName(), err)
	}
	addrs, err := nh.AddrList(pod, netlink.FAMILY_V4)
	if err != nil {
		return Links{}, fmt.Errorf("listing addresses of %s in %s: %w", p.ifName(), p.nsPath(), err)
	}
	if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(p.PodIP.AsSlice()) }) {
		return Links{}, fmt.Errorf("%s in %s does not hold %s", p.ifName(), p.nsPath(), p.PodIP)
	}
	routes, err := nh.RouteList(pod, netlink.FAMILY_V4)
	if err != nil {
		return Links{}, fmt.Errorf("listing routes in %s: %w", p.nsPath(), err)
	}
	for _, dst := range n.PodRoutes() {
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
			// A default route may be listed without a destination.
			return (r.Dst == nil && dst.Bits() == 0 || r.Dst != nil && r.Dst.String() == dst.String()) && r.Gw.Equal(n.NodeIP.AsSlice())
		}) {
			return Links{}, fmt.Errorf("pod %s has no route to %s via %s", p.nsPath(), dst, n.NodeIP)
		}
	}
	if !n.Bridge {
		host, err := netlink.LinkByIndex(links.HostIfindex)
		if err != nil {
			return Links{}, err
		}
		hostRoutes, err := netlink.RouteList(host, netlink.FAMILY_V4)
		if err != nil {
			return Links{}, fmt.Errorf("listing routes of %s: %w", p.HostIf, err)
		}
		want := netip.PrefixFrom(p.PodIP, 32).String()
		if !slices.ContainsFunc(hostRoutes, func(r netlink.Route) bool { return r.Dst != nil && r.Dst.String() == want }) {
			return Links{}, fmt.Errorf("the node has no route to %s on %s", want, p.HostIf)
		}
	}
	return links, nil
}

// TeardownPod deletes the veth (its peer and routes go with it) and the
// named namespace. Absent pieces are not an error.
func TeardownPod(p Pod) error {
	var errs []error
	if p.HostIf != "" {
		errs = append(errs, DetachPod(p))
	}
	if p.Netns != "" {
		errs = append(errs, DeleteNetns(p.Netns))
	}
	return errors.Join(errs...)
}

// LinksWithAliasPrefix lists host interfaces whose alias starts with prefix:
// how uninstall finds pod veths even when the agent's state is lost.
func LinksWithAliasPrefix(prefix string) ([]string, error) {
	links, err := linksWithAliasPrefix(prefix)
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names, err
}

// LinkAliasesWithPrefix lists the aliases, starting with prefix, of host
// interfaces.
func LinkAliasesWithPrefix(prefix string) ([]string, error) {
	links, err := linksWithAliasPrefix(prefix)
	var aliases []string
	for _, l := range links {
		aliases = append(aliases, l.Attrs().Alias)
	}
	return aliases, err
}

func linksWithAliasPrefix(prefix string) ([]netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(links, func(l netlink.Link) bool { return !strings.HasPrefix(l.Attrs().Alias, prefix) }), nil
}

// DeleteLink deletes a host interface by name (a no-op when absent).
func DeleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil
	}
	return netlink.LinkDel(l)
}

// HostAddresses lists the IPv4 addresses of the host's network namespace:
// traffic from any of them comes from the node.
func HostAddresses() ([]netip.Addr, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing host addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			out = append(out, ip)
		}
	}
	return out, nil
}
