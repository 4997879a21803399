package datapath

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/tcfilter"
	"github.com/shuntnet/shunt/internal/teardown"
)

var tcFallback = dpinfo.Fallbacks{dpinfo.FallbackTC: true}

// tcNode is a node namespace with one pod, for the tc attach tests:
//
//	pod 10.244.7.10 ── veth (pod-tc on the node) ── node 10.244.7.1
type tcNode struct {
	t      *testing.T
	ns     string // the node's namespace (path)
	pod    podnet.Pod
	ep     Endpoint
	pinDir string
}

func newTCNode(t *testing.T) *tcNode {
	t.Helper()
	requireBPF(t)
	n := &tcNode{t: t, ns: testNetns(t), pinDir: filepath.Join("/sys/fs/bpf", testName("shunt-test-tcattach"))}
	node := podnet.Node{PodCIDR: netip.MustParsePrefix("10.244.7.0/24"), NodeIP: netip.MustParseAddr("10.244.7.1"), HostIf: "shunt_host"}
	n.pod = podnet.Pod{Netns: testName("shunt-test-tcpod"), HostIf: "pod-tc", PodIP: netip.MustParseAddr("10.244.7.10")}
	t.Cleanup(func() {
		if err := podnet.DeleteNetns(n.pod.Netns); err != nil {
			t.Error(err)
		}
		if err := teardown.Pins(n.pinDir); err != nil {
			t.Error(err)
		}
	})
	n.do(func() error {
		if err := podnet.SetupNode(node); err != nil {
			return err
		}
		links, err := podnet.SetupPod(node, n.pod)
		n.ep = Endpoint{IP: n.pod.PodIP, Ifindex: links.HostIfindex, PodMAC: links.PodMAC, NodeMAC: links.HostMAC, Identity: 300}
		return err
	})
	return n
}

// do runs f in the node's namespace and fails the test on its error.
func (n *tcNode) do(f func() error) {
	n.t.Helper()
	if err := netnsrun.Do(n.ns, f); err != nil {
		n.t.Fatal(err)
	}
}

// open opens a datapath (an agent's start) on the node's pins, with or
// without the tc fallback, and attaches the pod's programs.
func (n *tcNode) open(fallbacks dpinfo.Fallbacks) *Datapath {
	n.t.Helper()
	d, err := Open(thisKernel(n.t, Config{PinDir: n.pinDir, Mode: ModeRedirectPeer, Fallbacks: fallbacks}))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { d.Close() })
	if err := d.SyncPolicy(policy.State{IPCache: []policy.PrefixIdentity{{Prefix: netip.PrefixFrom(n.pod.PodIP, 32), Identity: 300}}},
		[]Endpoint{n.ep}); err != nil {
		n.t.Fatal(err)
	}
	n.do(func() error { return d.AttachPod(n.pod.HostIf, n.ep.Ifindex) })
	return d
}

// filters lists the filters at dir of the pod's host-side veth.
func (n *tcNode) filters(dir tcfilter.Direction) []netlink.Filter {
	n.t.Helper()
	var fs []netlink.Filter
	n.do(func() (err error) { fs, err = tcfilter.Filters(n.ep.Ifindex, dir); return err })
	return fs
}

// shuntFilters are the filters at shunt's priority at dir of the veth.
func (n *tcNode) shuntFilters(dir tcfilter.Direction) []*netlink.BpfFilter {
	var out []*netlink.BpfFilter
	for _, f := range n.filters(dir) {
		if f.Attrs().Priority == tcfilter.Priority {
			b, _ := f.(*netlink.BpfFilter)
			out = append(out, b)
		}
	}
	return out
}

// checkShuntRuns checks that shunt's one filter at dir runs prog and is
// recorded under the hook's pin.
func (n *tcNode) checkShuntRuns(d *Datapath, dir tcfilter.Direction, hook string, prog *ebpf.Program) {
	n.t.Helper()
	want := programID(n.t, prog)
	fs := n.shuntFilters(dir)
	if len(fs) != 1 || fs[0] == nil {
		n.t.Fatalf("%s: %d filters at shunt's priority %d, want shunt's one: %+v", dir, len(fs), tcfilter.Priority, fs)
	}
	f := fs[0]
	if f.Handle != d.tcOwner().Handle() || !f.DirectAction || f.Name != d.tcOwner().Name(hook) || ebpf.ProgramID(f.Id) != want {
		n.t.Errorf("%s filter: handle %#x, direct-action %v, name %q, program %d; want handle %#x, direct-action, %q, program %d",
			dir, f.Handle, f.DirectAction, f.Name, f.Id, d.tcOwner().Handle(), d.tcOwner().Name(hook), want)
	}
	rec, err := ebpf.LoadPinnedProgram(d.linkPin(hook, n.pod.HostIf), nil)
	if err != nil {
		n.t.Fatalf("the %s filter's record: %v", hook, err)
	}
	defer rec.Close()
	if got := programID(n.t, rec); got != want {
		n.t.Errorf("the %s filter's record pins program %d, want %d", hook, got, want)
	}
}

func programID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// tcxPrograms counts the tcx programs at the veth's ingress and egress.
func (n *tcNode) tcxPrograms() int {
	n.t.Helper()
	// A kernel without tcx has none, and refuses the query (EINVAL).
	if take, _ := probedFallbacks(); take.Has(dpinfo.FallbackTC) {
		return 0
	}
	total := 0
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		n.do(func() error { // the ifindex is the node namespace's
			r, err := link.QueryPrograms(link.QueryOptions{Target: n.ep.Ifindex, Attach: at})
			if err == nil {
				total += len(r.Programs)
			}
			return err
		})
	}
	return total
}

// pingNode pings the node from the pod: through from-pod at the veth's
// ingress (to the stack) and to-pod at its egress (the reply delivered).
func (n *tcNode) pingNode() {
	n.t.Helper()
	if err := ping(n.pod, netip.MustParseAddr("10.244.7.1")); err != nil {
		n.t.Fatalf("ping from the pod to the node: %v", err)
	}
}

// foreignCounter is another tool's tc program: it counts the packets it
// sees in a map and returns TC_ACT_UNSPEC, so the next filter decides.
type foreignCounter struct {
	prog  *ebpf.Program
	count *ebpf.Map
}

func newForeignCounter(t *testing.T) *foreignCounter {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, -1).WithSymbol("out"), // TC_ACT_UNSPEC
		asm.Return(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return &foreignCounter{prog: prog, count: m}
}

func (c *foreignCounter) packets(t *testing.T) uint64 {
	t.Helper()
	var n uint64
	if err := c.count.Lookup(uint32(0), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// attach attaches it as `tc filter add dev DEV ingress bpf da` does: on a
// clsact qdisc, at the priority the kernel chooses (49152 for the first).
func (c *foreignCounter) attach(t *testing.T, n *tcNode) netlink.Filter {
	t.Helper()
	n.do(func() error {
		q := &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{LinkIndex: n.ep.Ifindex,
			Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
		if err := netlink.QdiscAdd(q); err != nil {
			return err
		}
		return netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: n.ep.Ifindex,
			Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Protocol: unix.ETH_P_ALL},
			Fd: c.prog.FD(), Name: "foreign-counter", DirectAction: true})
	})
	fs := n.filters(tcfilter.Ingress)
	if len(fs) != 1 {
		t.Fatalf("after attaching the foreign counter: %d ingress filters, want 1", len(fs))
	}
	return fs[0]
}

// checkForeignStays checks that the foreign filter is where it was,
// running its program, and counts the packets of a ping.
func (c *foreignCounter) checkStays(t *testing.T, n *tcNode, was netlink.Filter, when string) {
	t.Helper()
	var found bool
	for _, f := range n.filters(tcfilter.Ingress) {
		if b, ok := f.(*netlink.BpfFilter); ok && b.Priority == was.Attrs().Priority && b.Handle == was.Attrs().Handle {
			found = b.Id == was.(*netlink.BpfFilter).Id && b.Name == "foreign-counter"
		}
	}
	if !found {
		t.Fatalf("%s: the foreign filter (priority %d handle %d) is gone or changed: %+v", when, was.Attrs().Priority, was.Attrs().Handle, n.filters(tcfilter.Ingress))
	}
	before := c.packets(t)
	n.pingNode()
	if after := c.packets(t); after <= before {
		t.Errorf("%s: the foreign program counted %d packets before a ping and %d after: it no longer runs", when, before, after)
	}
}

// TestClsBPFFallback: with the tc fallback the pod programs attach as
// cls_bpf filters at shunt's priority and handle, next to a foreign
// filter attached first (which keeps counting: it runs first and lets
// shunt's decide); packets pass through shunt's programs; a restarted
// agent replaces its filters in place (new program ids, never two); detach
// removes shunt's filters and records and leaves the foreign one and its
// qdisc.
func TestClsBPFFallback(t *testing.T) {
	n := newTCNode(t)
	foreign := newForeignCounter(t)
	was := foreign.attach(t, n)

	d := n.open(tcFallback)
	n.checkShuntRuns(d, tcfilter.Ingress, "from-pod", d.objs.ShuntFromPod)
	n.checkShuntRuns(d, tcfilter.Egress, "to-pod", d.objs.ShuntToPod)
	if hooks, err := d.Hooks(); err != nil || hooks["from-pod"] != 1 || hooks["to-pod"] != 1 {
		t.Errorf("hooks %v, %v; want from-pod and to-pod once", hooks, err)
	}
	if got := n.tcxPrograms(); got != 0 {
		t.Errorf("%d tcx programs on the veth with the tc fallback, want 0", got)
	}
	before := counts(t, d)
	foreign.checkStays(t, n, was, "after shunt attached")
	counterDelta(t, d, before, nil, "to-stack/from-pod")

	// A restart: the same filters, the new agent's programs.
	oldFrom := programID(t, d.objs.ShuntFromPod)
	d.Close()
	d2 := n.open(tcFallback)
	if programID(t, d2.objs.ShuntFromPod) == oldFrom {
		t.Fatal("the restarted datapath loaded no new from-pod program")
	}
	n.checkShuntRuns(d2, tcfilter.Ingress, "from-pod", d2.objs.ShuntFromPod)
	n.checkShuntRuns(d2, tcfilter.Egress, "to-pod", d2.objs.ShuntToPod)
	before = counts(t, d2)
	foreign.checkStays(t, n, was, "after a restart")
	counterDelta(t, d2, before, nil, "to-stack/from-pod")

	n.do(func() error { return d2.DetachPod(n.pod.HostIf) })
	for _, dir := range []tcfilter.Direction{tcfilter.Ingress, tcfilter.Egress} {
		if fs := n.shuntFilters(dir); len(fs) != 0 {
			t.Errorf("after detach: shunt's %s filters left: %+v", dir, fs)
		}
	}
	if hooks, _ := d2.Hooks(); len(hooks) != 0 {
		t.Errorf("after detach: hooks %v, want none", hooks)
	}
	foreign.checkStays(t, n, was, "after shunt detached")
}

// TestTCXAndClsBPFSwitch: a node moving from tcx to the tc fallback and
// back across restarts has one attachment per hook at each step, and the
// clsact qdisc shunt added goes with its last filter.
func TestTCXAndClsBPFSwitch(t *testing.T) {
	requireKernelFeature(t, dpinfo.FallbackTC)
	n := newTCNode(t)
	check := func(when string, tcx, filters int, pinWant string) {
		t.Helper()
		if got := n.tcxPrograms(); got != tcx {
			t.Errorf("%s: %d tcx programs, want %d", when, got, tcx)
		}
		got := len(n.shuntFilters(tcfilter.Ingress)) + len(n.shuntFilters(tcfilter.Egress))
		if got != filters {
			t.Errorf("%s: %d shunt filters, want %d", when, got, filters)
		}
		for _, hook := range []string{"from-pod", "to-pod"} {
			pin := filepath.Join(n.pinDir, "links", hook+"-"+n.pod.HostIf)
			pinIs := "none"
			if l, err := link.LoadPinnedLink(pin, nil); err == nil {
				l.Close()
				pinIs = "link"
			} else if isProgramRecord(pin) {
				pinIs = "record"
			}
			if pinIs != pinWant {
				t.Errorf("%s: pin %s holds %s, want %s", when, pin, pinIs, pinWant)
			}
		}
		n.pingNode()
	}
	d := n.open(nil)
	check("tcx", 2, 0, "link")
	d.Close()
	d = n.open(tcFallback)
	check("tcx, then the tc fallback", 0, 2, "record")
	d.Close()
	d = n.open(nil)
	check("the tc fallback, then tcx", 2, 0, "link")
	var qdiscs []netlink.Qdisc
	n.do(func() (err error) {
		l, err := netlink.LinkByIndex(n.ep.Ifindex)
		if err == nil {
			qdiscs, err = netlink.QdiscList(l)
		}
		return err
	})
	for _, q := range qdiscs {
		if q.Type() == "clsact" {
			t.Errorf("the clsact qdisc shunt added outlived its last filter")
		}
	}
	d.Close()
	d = n.open(tcFallback)
	n.do(func() error { return d.DetachPod(n.pod.HostIf) })
	check("detached", 0, 0, "none")
}

// TestTeardownRemovesClsBPFFilters: uninstall (teardown.Instance, which
// links no BPF library) removes the instance's filters from the interfaces
// of its network namespace, and leaves another tool's and another
// instance's on the same interface.
func TestTeardownRemovesClsBPFFilters(t *testing.T) {
	n := newTCNode(t)
	inst, err := instance.New(fmt.Sprintf("tcft%06d", rand.IntN(1000000)))
	if err != nil {
		t.Fatal(err)
	}
	n.pinDir = inst.PinDir()
	foreign := newForeignCounter(t)
	was := foreign.attach(t, n)
	other := tcfilter.OwnerOf("/sys/fs/bpf/another-instance")
	n.do(func() error {
		return tcfilter.Attach(n.ep.Ifindex, tcfilter.Egress, other, "to-pod", foreign.prog.FD())
	})
	d := n.open(tcFallback)
	n.checkShuntRuns(d, tcfilter.Ingress, "from-pod", d.objs.ShuntFromPod)

	n.do(func() error { return teardown.Instance(inst) })
	if fs := n.shuntFilters(tcfilter.Ingress); len(fs) != 0 {
		t.Errorf("after teardown: filters at shunt's priority at ingress: %+v", fs)
	}
	fs := n.shuntFilters(tcfilter.Egress)
	if len(fs) != 1 || fs[0].Handle != other.Handle() {
		t.Errorf("after teardown: egress filters at shunt's priority %+v, want only the other instance's (handle %#x)", fs, other.Handle())
	}
	if _, err := os.Stat(inst.PinDir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after teardown: the pin directory: %v", err)
	}
	foreign.checkStays(t, n, was, "after teardown")
}
