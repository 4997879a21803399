package datapath

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/tcfilter"
)

// The tc programs (pod veths, the VXLAN device, the uplink) attach in one
// of two ways, chosen by Config.Fallbacks:
//
//   - tcx links (Linux 6.6+), pinned under <pinDir>/links/<hook>-<ifname>;
//   - with dpinfo.FallbackTC, a cls_bpf filter on a clsact qdisc at
//     shunt's own priority and this instance's handle (internal/tcfilter).
//     A filter is no BPF object and cannot be pinned, so the program it runs
//     is pinned in the link's place as its record: Hooks() counts it as it
//     counts links, uninstall's teardown.Pins removes it with the links,
//     `bpftool prog show pinned` shows what runs, and a restart or a switch
//     between the two ways finds it by name. A record file in the agent's
//     state directory would say the same but live apart from the links it
//     stands beside, and the datapath knows no state directory.
//
// A switch across a restart never leaves both attached and never none: the
// new attachment goes in first, then the other way's is removed.

// attachTC makes prog the program of hook at the interface's tc ingress or
// egress (at: AttachTCXIngress or AttachTCXEgress), whichever way the
// kernel takes it.
func (d *Datapath) attachTC(hook, ifname string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) error {
	if d.cfg.Fallbacks.Has(dpinfo.FallbackTC) {
		return d.attachClsBPF(hook, ifname, ifindex, prog, at)
	}
	return d.attachTCX(hook, ifname, ifindex, prog, at)
}

// attachTCX makes prog the program of hook (named in its pin) at tcx
// attach point at of the interface, through a pinned link: one still
// attached there is adopted and switched to prog (attachPinned). A record
// of the tc fallback in its place (an earlier start with it) is replaced
// once the link is in: then the filter goes.
func (d *Datapath) attachTCX(hook, ifname string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) error {
	onThisInterface := func(l link.Link) bool {
		info, err := l.Info()
		return err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex &&
			ebpf.AttachType(info.TCX().AttachType) == at
	}
	attach := func() (link.Link, error) {
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
		if err != nil {
			return nil, fmt.Errorf("attaching %s program to %s (tcx needs Linux 6.6+; older kernels take the tc fallback): %w", hook, ifname, err)
		}
		return l, nil
	}
	pin := d.linkPin(hook, ifname)
	if !isProgramRecord(pin) {
		return attachPinned(pin, prog, onThisInterface, attach)
	}
	l, err := attach()
	if err != nil {
		return err
	}
	defer l.Close() // unpinned on a failure below: the link goes, the filter stays
	if err := tcfilter.Detach(ifname, tcDirection(at), d.tcOwner()); err != nil {
		return fmt.Errorf("removing the tc fallback's %s filter from %s after attaching its tcx link: %w", hook, ifname, err)
	}
	if err := os.Remove(pin); err != nil {
		return fmt.Errorf("removing the tc fallback's record %s: %w", pin, err)
	}
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pinning link %s: %w", pin, err)
	}
	return nil
}

// attachClsBPF makes prog the program of hook at the interface's tc
// ingress or egress through shunt's cls_bpf filter: an existing one (a
// restarted agent's) is replaced in place, atomically. Then a tcx link of a
// start without the fallback is released and the program pinned as the
// filter's record.
func (d *Datapath) attachClsBPF(hook, ifname string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) error {
	if err := tcfilter.Attach(ifindex, tcDirection(at), d.tcOwner(), hook, prog.FD()); err != nil {
		return fmt.Errorf("%s: %w", ifname, err)
	}
	pin := d.linkPin(hook, ifname)
	// The tcx link or the previous agent's record: either goes now.
	if err := unpinLink(pin); err != nil {
		return err
	}
	// Pinned through a clone: Pin on the program itself would move its
	// earlier pin (another interface's record) here.
	rec, err := prog.Clone()
	if err != nil {
		return fmt.Errorf("recording the %s filter of %s: %w", hook, ifname, err)
	}
	defer rec.Close()
	if err := rec.Pin(pin); err != nil {
		return fmt.Errorf("recording the %s filter of %s at %s: %w", hook, ifname, pin, err)
	}
	return nil
}

// detachTC removes hook's program from the interface, whichever way it is
// attached: the tcx link's pin, or the tc fallback's filter and record.
func (d *Datapath) detachTC(hook, ifname string, at ebpf.AttachType) error {
	pin := d.linkPin(hook, ifname)
	if d.cfg.Fallbacks.Has(dpinfo.FallbackTC) || isProgramRecord(pin) {
		if err := tcfilter.Detach(ifname, tcDirection(at), d.tcOwner()); err != nil {
			return err // the record stays: it names what is still attached
		}
	}
	return unpinLink(pin)
}

// isProgramRecord says whether pin holds a program (the tc fallback's
// record of a filter) rather than a link.
func isProgramRecord(pin string) bool {
	p, err := ebpf.LoadPinnedProgram(pin, nil)
	if err != nil {
		return false
	}
	p.Close()
	return true
}

// tcOwner is this datapath's filters' owner: their handle and name come
// from the pin directory, so instances sharing an interface keep apart.
func (d *Datapath) tcOwner() tcfilter.Owner { return tcfilter.OwnerOf(d.cfg.PinDir) }

func tcDirection(at ebpf.AttachType) tcfilter.Direction {
	if at == ebpf.AttachTCXEgress {
		return tcfilter.Egress
	}
	return tcfilter.Ingress
}
