package datapath

import (
	"errors"
	"fmt"
	"math"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// ProbeKernel finds which features of dpinfo.KernelFeatures this kernel
// lacks, adds the fallbacks forced (tests; a user who wants the older
// path), and returns the fallbacks the datapath must take with the report
// status shows. It attaches nothing: each probe loads a trivial program or
// reads the kernel's BTF, as cilium/ebpf's features package does.
func ProbeKernel(forced dpinfo.Fallbacks) (dpinfo.Fallbacks, dpinfo.KernelReport, error) {
	take := dpinfo.Fallbacks{}
	rep := dpinfo.KernelReport{Release: KernelRelease()}
	for _, f := range dpinfo.KernelFeatures {
		have, err := kernelHas(f.Fallback)
		if err != nil {
			return nil, rep, fmt.Errorf("probing the kernel for %s (Linux %s+): %w", f.What, f.Since, err)
		}
		switch {
		case !have:
			take[f.Fallback] = true
			rep.Taken = append(rep.Taken, string(f.Fallback))
		case forced.Has(f.Fallback):
			take[f.Fallback] = true
			rep.Taken = append(rep.Taken, string(f.Fallback))
			rep.Forced = append(rep.Forced, string(f.Fallback))
		}
	}
	return take, rep, nil
}

// KernelRelease is uname -r.
func KernelRelease() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(uts.Release[:])
}

// kernelHas probes for the newer feature a fallback replaces: false with a
// nil error when the kernel lacks it, an error when the probe itself failed.
func kernelHas(f dpinfo.Fallback) (bool, error) {
	var err error
	switch f {
	case dpinfo.FallbackTC:
		err = probeTCX()
	case dpinfo.FallbackSkMsgAttach:
		err = probeSockmapLink()
	case dpinfo.FallbackSockDiag:
		err = probeSockDestroy()
	case dpinfo.FallbackNoSetRetval:
		err = features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSetRetval)
	case dpinfo.FallbackNoGSODecap:
		err = probeAdjustRoomDecapL3()
	default:
		return false, fmt.Errorf("no probe for fallback %q", f)
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return false, nil
	}
	return err == nil, err
}

// trivialProgram returns 0 (tc: TC_ACT_OK; sk_msg: SK_DROP, never run).
func trivialProgram(t ebpf.ProgramType, at ebpf.AttachType) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: t, AttachType: at, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
}

// probeTCX asks for a tcx link on an interface that cannot exist: a kernel
// with tcx answers ENODEV, cilium/ebpf then reports ErrNotSupported only
// when tcx itself is missing.
func probeTCX() error {
	prog, err := trivialProgram(ebpf.SchedCLS, ebpf.AttachNone)
	if err != nil {
		return err
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close()
		return errors.New("a tcx link on a missing interface was created")
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	return nil // ENODEV: tcx is there
}

// probeSockmapLink attaches a trivial sk_msg program to a fresh sockhash
// through a link (Linux 6.10+), and detaches it at once.
func probeSockmapLink() error {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		return fmt.Errorf("creating a sockhash: %w", err)
	}
	defer m.Close()
	prog, err := trivialProgram(ebpf.SkMsg, ebpf.AttachSkMsgVerdict)
	if err != nil {
		return fmt.Errorf("loading an sk_msg program: %w", err)
	}
	defer prog.Close()
	l, err := link.AttachRawLink(link.RawLinkOptions{Target: m.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict})
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, ebpf.ErrNotSupported) {
			return ebpf.ErrNotSupported
		}
		return err
	}
	return l.Close()
}

// probeSockDestroy looks for the bpf_sock_destroy kfunc (6.5) in the
// kernel's BTF; the iter/udp iterator it runs in is older (5.9).
func probeSockDestroy() error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("reading the kernel's BTF: %w", err)
	}
	has, err := kernelHasFunc(spec, "bpf_sock_destroy")
	if err != nil {
		return err
	}
	if !has {
		return ebpf.ErrNotSupported
	}
	return nil
}

// kernelHasFunc says whether the kernel's BTF (spec) lists the function
// name: a kfunc, or a kernel function a feature comes with.
func kernelHasFunc(spec *btf.Spec, name string) (bool, error) {
	var fn *btf.Func
	err := spec.TypeByName(name, &fn)
	if errors.Is(err, btf.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// adjRoomDecapL3IPv4 is bpf_skb_adjust_room's BPF_F_ADJ_ROOM_DECAP_L3_IPV4
// (Linux 6.3), bpf/lib/dsr.h's DSR_ADJ_ROOM_DECAP_L3_IPV4.
const adjRoomDecapL3IPv4 = 1 << 7

// probeAdjustRoomDecapL3 runs, on an IPIP packet, a tc program that takes
// the outer IPv4 header off with BPF_F_ADJ_ROOM_DECAP_L3_IPV4, as DSR's
// decapsulation does: a kernel before 6.3 refuses the flag (EINVAL, the
// program's return value).
func probeAdjustRoomDecapL3() error { return probeAdjustRoomShrink(adjRoomDecapL3IPv4) }

// probeAdjustRoomShrink says whether bpf_skb_adjust_room takes flags when
// it removes an IPIP packet's outer header: nil, or ErrNotSupported when
// the kernel refuses them (EINVAL).
func probeAdjustRoomShrink(flags uint64) error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			// r1 is the skb already.
			asm.Mov.Imm(asm.R2, -20), // len_diff: one IPv4 header less
			asm.Mov.Imm(asm.R3, 1),   // BPF_ADJ_ROOM_MAC
			asm.LoadImm(asm.R4, int64(flags), asm.DWord),
			asm.FnSkbAdjustRoom.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		return fmt.Errorf("loading the adjust_room probe: %w", err)
	}
	defer prog.Close()
	ret, _, err := prog.Test(ipipProbePacket())
	if err != nil {
		return fmt.Errorf("running the adjust_room probe: %w", err)
	}
	switch int32(ret) {
	case 0:
		return nil
	case -int32(unix.EINVAL):
		return ebpf.ErrNotSupported
	}
	return fmt.Errorf("the adjust_room probe returned %d", int32(ret))
}

// ipipProbePacket is Ethernet, an outer IPv4 header (protocol IPIP) and an
// inner IPv4 + UDP datagram: what probeAdjustRoomDecapL3 decapsulates.
func ipipProbePacket() []byte {
	inner := []byte{
		0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 192, 0, 2, 1, 192, 0, 2, 2, // IPv4, UDP
		0x30, 0x39, 0x00, 0x35, 0, 8, 0, 0, // UDP 12345 → 53, no checksum
	}
	outer := []byte{0x45, 0, 0, byte(20 + len(inner)), 0, 0, 0x40, 0, 64, 4, 0, 0, 192, 0, 2, 3, 192, 0, 2, 4}
	eth := []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00}
	return append(append(eth, outer...), inner...)
}
