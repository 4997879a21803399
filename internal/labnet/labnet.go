// Package labnet lays out a multi-node lab on one machine (`shunt lab up
// --nodes N`): each node's host side is a network namespace of its own,
// joined to the others by an underlay (a bridge in a namespace of its
// own, one address per node), with one more host on the underlay that is
// outside the cluster (`shunt lab exec --external`). The machine's own
// network is untouched. Each node runs its own agent, an instance of its
// own: the first is the lab's instance and serves the lab's control plane,
// the others join it.
package labnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/podnet"
)

// MaxNodes bounds --nodes: the node instances are the lab's name with
// "n2" … "n9" added, and every node is a whole agent on this machine.
const MaxNodes = 9

// Defaults of a multi-node lab.
var (
	DefaultClusterCIDR  = netip.MustParsePrefix("10.244.0.0/16")
	DefaultUnderlayCIDR = netip.MustParsePrefix("192.168.123.0/24")
)

// externalHost is the outside host's number on the underlay.
const externalHost = 254

// Layout is a multi-node lab: kept in the first node's state directory.
type Layout struct {
	Nodes        []Node `json:"nodes"`
	ClusterCIDR  string `json:"clusterCIDR"`
	UnderlayCIDR string `json:"underlayCIDR"`
	// UnderlayNetns holds the bridge joining the nodes.
	UnderlayNetns string `json:"underlayNetns"`
	// External is a host on the underlay that is no node: what pods reach
	// with masquerade, where `lab exec --external` runs.
	External Host `json:"external"`
	// Routing is how nodes reach each other's pods: tunnel or native.
	Routing string `json:"routing"`
	// NodeGrace is how long a node's agent may go silent before the node
	// is NotReady ("": the control plane's default).
	NodeGrace string `json:"nodeGrace,omitempty"`
}

// Node is one node of the lab.
type Node struct {
	Name     string `json:"name"`     // node-1 …
	Instance string `json:"instance"` // its agent's instance
	Netns    string `json:"netns"`    // its host side
	Addr     string `json:"addr"`     // on the underlay
	PodCIDR  string `json:"podCIDR"`
}

// Host is a network namespace with an address on the underlay.
type Host struct {
	Netns string `json:"netns"`
	Addr  string `json:"addr"`
}

// Plan lays out n nodes for the lab base: node-k is instance base (k=1)
// or base+"n"+k, its pod CIDR the k-th /24 of cluster, its address the
// k-th of the underlay.
func Plan(base instance.Instance, n int, cluster netip.Prefix, routing string) (Layout, error) {
	if n < 2 || n > MaxNodes {
		return Layout{}, fmt.Errorf("--nodes %d: a multi-node lab has 2 to %d nodes (1 is the plain lab)", n, MaxNodes)
	}
	if len(base.Name)+2 > 10 {
		return Layout{}, fmt.Errorf("instance %q: a multi-node lab's nodes are instances %sn2 … and instance names have at most 10 characters: use a name of at most 8", base.Name, base.Name)
	}
	if !cluster.Addr().Is4() || cluster.Bits() > 24-bitsFor(n) {
		return Layout{}, fmt.Errorf("--cluster-cidr %s: give an IPv4 range that holds %d /24 pod CIDRs, e.g. %s", cluster, n, DefaultClusterCIDR)
	}
	ul := DefaultUnderlayCIDR
	l := Layout{ClusterCIDR: cluster.String(), UnderlayCIDR: ul.String(), UnderlayNetns: base.Name + "-underlay",
		External: Host{Netns: base.Name + "-external", Addr: nthAddr(ul, externalHost).String()}, Routing: routing}
	for k := 1; k <= n; k++ {
		inst := base.Name
		if k > 1 {
			inst += "n" + strconv.Itoa(k)
		}
		cidr := netip.PrefixFrom(nthAddr(netip.PrefixFrom(cluster.Masked().Addr(), 24), (k-1)<<8), 24)
		l.Nodes = append(l.Nodes, Node{Name: "node-" + strconv.Itoa(k), Instance: inst, Netns: base.Name + "-node" + strconv.Itoa(k),
			Addr: nthAddr(ul, k).String(), PodCIDR: cidr.String()})
	}
	return l, nil
}

func bitsFor(n int) int {
	b := 0
	for 1<<b < n {
		b++
	}
	return b
}

// nthAddr is the address n after p's first.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func layoutPath(base instance.Instance) string {
	return filepath.Join(base.StateDir(), "lab-nodes.json")
}

// Load reads the lab's layout; nil when base is a lab of one node.
func Load(base instance.Instance) (*Layout, error) {
	data, err := os.ReadFile(layoutPath(base))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var l Layout
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("reading %s: %w (`shunt lab down` removes the lab)", layoutPath(base), err)
	}
	return &l, nil
}

// Save keeps the layout in the first node's state directory.
func (l Layout) Save(base instance.Instance) error {
	if err := os.MkdirAll(base.StateDir(), 0o700); err != nil {
		return err
	}
	_, err := atomicfile.WriteJSON(layoutPath(base), l, nil)
	return err
}

// Node returns the node of that name.
func (l Layout) Node(name string) (Node, bool) {
	for _, n := range l.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// NetnsPath is where a namespace of the layout is mounted.
func NetnsPath(name string) string { return podnet.NetnsPath(name) }

// Create builds the underlay, the nodes' namespaces and the external host;
// what exists already is kept (a second `lab up`).
func (l Layout) Create() error {
	ul, err := ensureNetns(l.UnderlayNetns)
	if err != nil {
		return err
	}
	defer ul.Close()
	uh, err := netlink.NewHandleAt(ul)
	if err != nil {
		return err
	}
	defer uh.Close()
	if err := upLoopback(uh); err != nil {
		return err
	}
	br, err := ensureLink(uh, "br0", func(la netlink.LinkAttrs) netlink.Link { return &netlink.Bridge{LinkAttrs: la} })
	if err != nil {
		return fmt.Errorf("underlay bridge in %s: %w", l.UnderlayNetns, err)
	}
	if err := uh.LinkSetUp(br); err != nil {
		return err
	}
	prefix := netip.MustParsePrefix(l.UnderlayCIDR).Bits()
	hosts := []Host{l.External}
	ports := []string{"ext"}
	for i, n := range l.Nodes {
		hosts = append(hosts, Host{Netns: n.Netns, Addr: n.Addr})
		ports = append(ports, "n"+strconv.Itoa(i+1))
	}
	for i, h := range hosts {
		if err := joinUnderlay(uh, ul, br, h, ports[i], prefix); err != nil {
			return fmt.Errorf("%s on the underlay: %w", h.Netns, err)
		}
	}
	return nil
}

// joinUnderlay gives host h interface ul0 at its address, its peer port on
// the underlay's bridge.
func joinUnderlay(uh *netlink.Handle, ul netns.NsHandle, br netlink.Link, h Host, port string, bits int) error {
	ns, err := ensureNetns(h.Netns)
	if err != nil {
		return err
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer nh.Close()
	if err := upLoopback(nh); err != nil {
		return err
	}
	link, err := ensureLink(nh, "ul0", func(la netlink.LinkAttrs) netlink.Link {
		return &netlink.Veth{LinkAttrs: la, PeerName: port, PeerNamespace: netlink.NsFd(int(ul))}
	})
	if err != nil {
		return fmt.Errorf("veth ul0/%s: %w", port, err)
	}
	addr := netip.MustParseAddr(h.Addr)
	if err := nh.AddrReplace(link, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(bits, 32)}}); err != nil {
		return fmt.Errorf("address %s: %w", addr, err)
	}
	if err := nh.LinkSetUp(link); err != nil {
		return err
	}
	peer, err := uh.LinkByName(port)
	if err != nil {
		return fmt.Errorf("bridge port %s: %w", port, err)
	}
	if err := uh.LinkSetMaster(peer, br); err != nil {
		return err
	}
	return uh.LinkSetUp(peer)
}

// ensureLink returns the link of that name, made with build if there is
// none.
func ensureLink(h *netlink.Handle, name string, build func(netlink.LinkAttrs) netlink.Link) (netlink.Link, error) {
	if l, err := h.LinkByName(name); err == nil {
		return l, nil
	}
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := h.LinkAdd(build(la)); err != nil {
		return nil, err
	}
	return h.LinkByName(name)
}

func upLoopback(h *netlink.Handle) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.LinkSetUp(lo)
}

func ensureNetns(name string) (netns.NsHandle, error) {
	if ns, err := netns.GetFromPath(podnet.NetnsPath(name)); err == nil {
		return ns, nil
	}
	if err := podnet.CreateNetns(name, ""); err != nil {
		return 0, err
	}
	return netns.GetFromPath(podnet.NetnsPath(name))
}

// Remove deletes the namespaces of the layout (the nodes' agents are
// stopped first: their pods and devices are theirs to remove).
func (l Layout) Remove() error {
	var errs []error
	for _, n := range l.Nodes {
		errs = append(errs, podnet.DeleteNetns(n.Netns))
	}
	errs = append(errs, podnet.DeleteNetns(l.External.Netns), podnet.DeleteNetns(l.UnderlayNetns))
	return errors.Join(errs...)
}

// NetnsPaths are the paths of the layout's own namespaces: the nodes', the
// external host's and the underlay's.
func (l Layout) NetnsPaths() []string {
	paths := []string{NetnsPath(l.External.Netns), NetnsPath(l.UnderlayNetns)}
	for _, n := range l.Nodes {
		paths = append(paths, NetnsPath(n.Netns))
	}
	return paths
}
