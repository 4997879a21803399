// Package tcfilter attaches shunt's tc programs the way kernels without
// tcx links (Linux < 6.6) take them, as Cilium does on such kernels: a
// clsact qdisc on the interface and, at its ingress or egress, a cls_bpf
// filter in direct-action mode (the program's return code is the verdict),
// all through netlink. It loads no BPF: the datapath hands it a program's
// file descriptor, and the CLI's teardown (which must not link the
// datapath) removes an instance's filters with it.
//
// Which filter is shunt's, and whose:
//
//   - Priority: every shunt filter sits at Priority (0xfff0), behind the
//     priorities tc hands out by default (49152 for a first filter, one
//     less for each filter added in front), so a program another tool
//     attached runs first, as a tcx program attached before shunt's link
//     does: one that returns "continue" (TC_ACT_UNSPEC) sees every packet
//     and shunt's program still decides; one that returns a verdict decides
//     before shunt, on tcx as here. shunt's programs end every packet with
//     a verdict, so a filter behind shunt's never sees a packet.
//   - Handle: one per instance, derived from its pin directory (Owner), so
//     two instances on one interface (labs of one machine) each have their
//     own filter and remove only their own.
//   - Name: "shunt:<hook>:<pin directory>", what `tc filter show` prints;
//     a filter at shunt's priority and handle without that name is another
//     tool's and is never replaced or deleted.
//
// A restarted agent replaces its filter in place (same priority and
// handle): the kernel swaps the program atomically, so the interface is
// never without one, as a tcx link's update does. The clsact qdisc is
// created when missing and removed only by a detach that took shunt's last
// filter off it and left it empty: a qdisc holding another tool's filters
// stays.
package tcfilter

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Priority is the tc priority of every shunt filter (see the package doc).
const Priority = 0xfff0

// Direction is where on the interface a filter runs.
type Direction int

const (
	Ingress Direction = iota // what the interface receives
	Egress                   // what it sends
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

func (d Direction) parent() uint32 {
	if d == Egress {
		return netlink.HANDLE_MIN_EGRESS
	}
	return netlink.HANDLE_MIN_INGRESS
}

var directions = []Direction{Ingress, Egress}

// Owner is one shunt instance's filters: its handle and the name suffix
// they carry, both from its pin directory.
type Owner struct {
	pinDir string
	handle uint32
}

// OwnerOf is the owner of the filters a datapath pinned under pinDir
// attaches.
func OwnerOf(pinDir string) Owner {
	h := fnv.New32a()
	h.Write([]byte(pinDir))
	handle := h.Sum32()
	if handle == 0 {
		handle = 1 // 0 asks the kernel to choose one
	}
	return Owner{pinDir: pinDir, handle: handle}
}

// Handle is the tc handle of the owner's filters.
func (o Owner) Handle() uint32 { return o.handle }

// Name is the name of the owner's filter for hook.
func (o Owner) Name(hook string) string { return "shunt:" + hook + ":" + o.pinDir }

// Owns says whether f is one of the owner's filters.
func (o Owner) Owns(f netlink.Filter) bool {
	b, ok := f.(*netlink.BpfFilter)
	return ok && b.Priority == Priority && b.Handle == o.handle &&
		strings.HasPrefix(b.Name, "shunt:") && strings.HasSuffix(b.Name, ":"+o.pinDir)
}

// Attach makes progFD the program of the owner's filter for hook at dir of
// the interface: the filter there is replaced in place (the kernel swaps
// the program atomically), or created with the clsact qdisc when missing.
// A filter at shunt's priority and handle that is not the owner's is
// refused, never replaced.
func Attach(ifindex int, dir Direction, o Owner, hook string, progFD int) error {
	link := byIndex(ifindex)
	if err := ensureClsact(link); err != nil {
		return err
	}
	current, err := netlink.FilterList(link, dir.parent())
	if err != nil {
		return fmt.Errorf("listing the tc %s filters of ifindex %d: %w", dir, ifindex, err)
	}
	for _, f := range current {
		a := f.Attrs()
		if a.Priority == Priority && a.Handle == o.handle && !o.Owns(f) {
			return fmt.Errorf("tc %s filter priority %d handle %#x on ifindex %d is another tool's (%s), not shunt's: "+
				"remove it or move it to another priority", dir, Priority, o.handle, ifindex, describe(f))
		}
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: dir.parent(), Handle: o.handle,
			Priority: Priority, Protocol: unix.ETH_P_ALL},
		Fd: progFD, Name: o.Name(hook), DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		for _, f := range current {
			if a := f.Attrs(); a.Priority == Priority && (f.Type() != "bpf" || a.Protocol != unix.ETH_P_ALL) {
				return fmt.Errorf("attaching the %s program at tc %s of ifindex %d: priority %d holds another tool's %s: "+
					"move it to another priority: %w", hook, dir, ifindex, Priority, describe(f), err)
			}
		}
		return fmt.Errorf("attaching the %s program at tc %s of ifindex %d (cls_bpf filter priority %d handle %#x): %w",
			hook, dir, ifindex, Priority, o.handle, err)
	}
	return nil
}

// ensureClsact adds the clsact qdisc unless the interface has it; another
// qdisc at its place (the older ingress qdisc) is another tool's, and
// refused rather than replaced.
func ensureClsact(link netlink.Link) error {
	qdiscs, err := netlink.QdiscList(link)
	if err != nil {
		return fmt.Errorf("listing the qdiscs of ifindex %d: %w", link.Attrs().Index, err)
	}
	for _, q := range qdiscs {
		if q.Attrs().Parent != netlink.HANDLE_CLSACT {
			continue
		}
		if q.Type() == "clsact" {
			return nil
		}
		return fmt.Errorf("ifindex %d has the %s qdisc (another tool's) where shunt needs clsact: remove it "+
			"(tc qdisc del dev DEV ingress) or move its filters to a clsact qdisc", link.Attrs().Index, q.Type())
	}
	err = netlink.QdiscAdd(clsact(link.Attrs().Index))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding a clsact qdisc to ifindex %d: %w", link.Attrs().Index, err)
	}
	return nil
}

func clsact(ifindex int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
}

// Find is the id of the program the owner's filter at dir of the
// interface runs (found false: none).
func Find(ifindex int, dir Direction, o Owner) (progID int, found bool, err error) {
	filters, err := netlink.FilterList(byIndex(ifindex), dir.parent())
	if err != nil {
		return 0, false, fmt.Errorf("listing the tc %s filters of ifindex %d: %w", dir, ifindex, err)
	}
	for _, f := range filters {
		if o.Owns(f) {
			return f.(*netlink.BpfFilter).Id, true, nil
		}
	}
	return 0, false, nil
}

// Detach removes the owner's filter at dir of the named interface (a
// no-op when the interface or the filter is gone), and the clsact qdisc
// when that was the last filter on it.
func Detach(ifname string, dir Direction, o Owner) error {
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil // the interface went, and its filters with it
		}
		return fmt.Errorf("finding %s to remove shunt's tc filter: %w", ifname, err)
	}
	_, err = detach(link, []Direction{dir}, o)
	return err
}

// detach removes the owner's filters at dirs of the interface, then the
// clsact qdisc if one was removed and none is left in either direction. It
// says how many it removed.
func detach(link netlink.Link, dirs []Direction, o Owner) (int, error) {
	ifindex := link.Attrs().Index
	removed := 0
	for _, dir := range dirs {
		filters, err := netlink.FilterList(link, dir.parent())
		if err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue // no clsact: nothing of shunt's
			}
			return removed, fmt.Errorf("listing the tc %s filters of ifindex %d: %w", dir, ifindex, err)
		}
		for _, f := range filters {
			if !o.Owns(f) {
				continue
			}
			// Only the filter's address is read: no program descriptor.
			del := &netlink.BpfFilter{FilterAttrs: *f.Attrs(), Fd: -1}
			if err := netlink.FilterDel(del); err != nil && !errors.Is(err, unix.ENOENT) {
				return removed, fmt.Errorf("removing shunt's tc %s filter from ifindex %d: %w", dir, ifindex, err)
			}
			removed++
		}
	}
	if removed == 0 {
		return 0, nil
	}
	for _, dir := range directions {
		left, err := netlink.FilterList(link, dir.parent())
		if err != nil || len(left) > 0 {
			return removed, nil // another tool's filters: the qdisc stays
		}
	}
	if err := netlink.QdiscDel(clsact(ifindex)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return removed, fmt.Errorf("removing the emptied clsact qdisc of ifindex %d: %w", ifindex, err)
	}
	return removed, nil
}

// RemoveAll removes the owner's filters from every interface of the
// calling thread's network namespace (uninstall: the uplink's and the
// tunnel device's, which outlive the agent; pod veths go with their pods).
func RemoveAll(o Owner) error {
	qdiscs, err := netlink.QdiscList(nil)
	if err != nil {
		return fmt.Errorf("listing the qdiscs to remove shunt's tc filters: %w", err)
	}
	var errs []error
	for _, q := range qdiscs {
		if q.Type() != "clsact" {
			continue
		}
		if _, err := detach(byIndex(q.Attrs().LinkIndex), directions, o); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Filters lists the filters at dir of the interface, for tests and
// diagnostics.
func Filters(ifindex int, dir Direction) ([]netlink.Filter, error) {
	return netlink.FilterList(byIndex(ifindex), dir.parent())
}

// byIndex is a netlink.Link of which only the index is read.
func byIndex(ifindex int) netlink.Link {
	la := netlink.NewLinkAttrs()
	la.Index = ifindex
	return &netlink.Dummy{LinkAttrs: la}
}

func describe(f netlink.Filter) string {
	a := f.Attrs()
	s := fmt.Sprintf("%s filter priority %d handle %#x protocol %#x", f.Type(), a.Priority, a.Handle, a.Protocol)
	if b, ok := f.(*netlink.BpfFilter); ok && b.Name != "" {
		s += " " + b.Name
	}
	return s
}
