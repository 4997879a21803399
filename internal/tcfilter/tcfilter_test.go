package tcfilter

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/netnsrun"
)

func TestOwner(t *testing.T) {
	a, b := OwnerOf("/sys/fs/bpf/a"), OwnerOf("/sys/fs/bpf/b")
	if a.Handle() == b.Handle() || a.Handle() == 0 {
		t.Errorf("handles %#x and %#x: want two distinct, nonzero", a.Handle(), b.Handle())
	}
	filter := func(prio uint16, handle uint32, name string) *netlink.BpfFilter {
		return &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{Priority: prio, Handle: handle}, Name: name}
	}
	cases := []struct {
		f    netlink.Filter
		owns bool
	}{
		{filter(Priority, a.Handle(), a.Name("from-pod")), true},
		{filter(Priority, a.Handle(), b.Name("from-pod")), false}, // another instance's name
		{filter(Priority, b.Handle(), a.Name("from-pod")), false},
		{filter(Priority-1, a.Handle(), a.Name("from-pod")), false},
		{filter(Priority, a.Handle(), "foreign"), false},
		{&netlink.U32{FilterAttrs: netlink.FilterAttrs{Priority: Priority, Handle: a.Handle()}}, false},
	}
	for _, c := range cases {
		if got := a.Owns(c.f); got != c.owns {
			t.Errorf("Owns(%s) = %v, want %v", describe(c.f), got, c.owns)
		}
	}
}

// testNetns makes a network namespace with a veth "dev0" (peer dev1) up,
// removed when the test ends, and returns its path and the device's index.
func testNetns(t *testing.T) (string, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, BPF)")
	}
	name := fmt.Sprintf("shunt-test-tcfilter-%d", os.Getpid())
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "add", "dev0", "type", "veth", "peer", "name", "dev1"},
		{"-n", name, "link", "set", "dev0", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if args[0] == "netns" {
			t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
		}
	}
	path := "/run/netns/" + name
	var ifindex int
	if err := netnsrun.Do(path, func() error {
		l, err := netlink.LinkByName("dev0")
		if err == nil {
			ifindex = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return path, ifindex
}

func passProgram(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestAttachRefusesWhatIsNotShunts: a filter of another tool at shunt's
// priority and handle, another protocol's filter at shunt's priority and
// the older ingress qdisc are refused with an error naming them, and left as
// they were.
func TestAttachRefusesWhatIsNotShunts(t *testing.T) {
	ns, ifindex := testNetns(t)
	prog := passProgram(t)
	o := OwnerOf("/sys/fs/bpf/shunt-test-tcfilter")
	in := func(f func() error) error { return netnsrun.Do(ns, f) }
	foreignAt := func(handle uint32, name string) *netlink.BpfFilter {
		return &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_INGRESS,
			Handle: handle, Priority: Priority, Protocol: unix.ETH_P_ALL}, Fd: prog.FD(), Name: name, DirectAction: true}
	}

	if err := in(func() error {
		return netlink.QdiscAdd(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}})
	}); err != nil {
		t.Fatal(err)
	}
	err := in(func() error { return Attach(ifindex, Ingress, o, "from-pod", prog.FD()) })
	if err == nil || !strings.Contains(err.Error(), "ingress qdisc") {
		t.Errorf("attaching next to an ingress qdisc: %v, want a refusal naming it", err)
	}
	if err := in(func() error {
		if err := netlink.QdiscDel(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}); err != nil {
			return err
		}
		if err := netlink.QdiscAdd(clsact(ifindex)); err != nil {
			return err
		}
		return netlink.FilterAdd(foreignAt(o.Handle(), "foreign"))
	}); err != nil {
		t.Fatal(err)
	}
	err = in(func() error { return Attach(ifindex, Ingress, o, "from-pod", prog.FD()) })
	if err == nil || !strings.Contains(err.Error(), "another tool's") || !strings.Contains(err.Error(), "foreign") {
		t.Errorf("attaching over a foreign filter at shunt's priority and handle: %v, want a refusal naming it", err)
	}
	var fs []netlink.Filter
	in(func() (err error) { fs, err = Filters(ifindex, Ingress); return err })
	if len(fs) != 1 || fs[0].(*netlink.BpfFilter).Name != "foreign" {
		t.Errorf("after the refusal: filters %+v, want the foreign one alone", fs)
	}

	// Another tool's filter of another protocol at shunt's priority: the
	// kernel takes one protocol per priority; the error names what holds it.
	if err := in(func() error {
		if err := netlink.FilterDel(&netlink.BpfFilter{FilterAttrs: *fs[0].Attrs(), Fd: -1}); err != nil {
			return err
		}
		f := foreignAt(7, "foreign-ipv4")
		f.Protocol = unix.ETH_P_IP
		return netlink.FilterAdd(f)
	}); err != nil {
		t.Fatal(err)
	}
	err = in(func() error { return Attach(ifindex, Ingress, o, "from-pod", prog.FD()) })
	if err == nil || !strings.Contains(err.Error(), "another tool's") || !strings.Contains(err.Error(), "foreign-ipv4") {
		t.Errorf("attaching where another protocol's filter holds shunt's priority: %v, want a refusal naming it", err)
	}
}

// TestAttachFindDetach: Attach adds the clsact qdisc and the filter, a
// second Attach replaces the program in place, Find reports it, and
// Detach removes filter and qdisc; RemoveAll takes the owner's filters
// off every interface and leaves another owner's.
func TestAttachFindDetach(t *testing.T) {
	ns, ifindex := testNetns(t)
	first, second := passProgram(t), passProgram(t)
	o, other := OwnerOf("/sys/fs/bpf/shunt-test-tcfilter"), OwnerOf("/sys/fs/bpf/shunt-test-tcfilter-other")
	id := func(p *ebpf.Program) int {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		n, _ := info.ID()
		return int(n)
	}
	err := netnsrun.Do(ns, func() error {
		for _, p := range []*ebpf.Program{first, second} {
			if err := Attach(ifindex, Egress, o, "to-pod", p.FD()); err != nil {
				return err
			}
			got, found, err := Find(ifindex, Egress, o)
			if err != nil {
				return err
			}
			if !found || got != id(p) {
				return fmt.Errorf("Find after attaching program %d: %d, %v", id(p), got, found)
			}
			if fs, err := Filters(ifindex, Egress); err != nil || len(fs) != 1 {
				return fmt.Errorf("egress filters %+v, %v: want shunt's one", fs, err)
			}
		}
		if err := Detach("dev0", Egress, o); err != nil {
			return err
		}
		if _, found, _ := Find(ifindex, Egress, o); found {
			return fmt.Errorf("the filter outlived Detach")
		}
		qs, err := netlink.QdiscList(byIndex(ifindex))
		for _, q := range qs {
			if q.Type() == "clsact" {
				return fmt.Errorf("the clsact qdisc outlived shunt's last filter")
			}
		}
		if err != nil {
			return err
		}
		if err := Detach("nosuchdev", Egress, o); err != nil {
			return fmt.Errorf("detaching from a missing interface: %w", err)
		}
		if err := Attach(ifindex, Ingress, o, "from-pod", first.FD()); err != nil {
			return err
		}
		if err := Attach(ifindex, Ingress, other, "from-pod", second.FD()); err != nil {
			return err
		}
		if err := RemoveAll(o); err != nil {
			return err
		}
		if _, found, _ := Find(ifindex, Ingress, o); found {
			return fmt.Errorf("the owner's filter outlived RemoveAll")
		}
		if _, found, _ := Find(ifindex, Ingress, other); !found {
			return fmt.Errorf("RemoveAll took another owner's filter")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
