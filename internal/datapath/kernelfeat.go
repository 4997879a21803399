package datapath

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// What the compiled objects ask of the kernel, and the first release that
// has each. Helper releases are bcc's docs/kernel-versions.md (iovisor/bcc
// 6d0a964, "Helpers" table, with the commit of each); program, attach and
// map types are the same document's "Main features" and "Tables" rows or
// the kernel commit named. TestObjectsUseOnlyTabledFeatures reads every
// helper call, kfunc, program, attach and map type out of the objects and
// fails on one missing here or newer than dpinfo.KernelFloor without a
// fallback guarding it; CheckKernel probes the same pairs on the running
// kernel before anything is attached.

// helperSince is the first kernel of each helper the objects call.
var helperSince = map[asm.BuiltinFunc]string{
	asm.FnMapLookupElem:      "3.19",
	asm.FnMapUpdateElem:      "3.19",
	asm.FnMapDeleteElem:      "3.19",
	asm.FnKtimeGetNs:         "4.1",
	asm.FnGetPrandomU32:      "4.1",
	asm.FnSkbStoreBytes:      "4.1",
	asm.FnL3CsumReplace:      "4.1",
	asm.FnL4CsumReplace:      "4.1",
	asm.FnTailCall:           "4.2", // from a program with BPF-to-BPF calls: 5.10 on x86-64 (docs/kernels.md)
	asm.FnSkbGetTunnelKey:    "4.3",
	asm.FnSkbSetTunnelKey:    "4.3",
	asm.FnRedirect:           "4.4",
	asm.FnSkbLoadBytes:       "4.5",
	asm.FnSetHashInvalid:     "4.9",
	asm.FnGetHashRecalc:      "4.8",
	asm.FnCsumDiff:           "4.6",
	asm.FnSkbChangeType:      "4.8",
	asm.FnSkbChangeTail:      "4.9",
	asm.FnSkbPullData:        "4.9",
	asm.FnGetSocketCookie:    "4.12",
	asm.FnSockOpsCbFlagsSet:  "4.16",
	asm.FnSkbAdjustRoom:      "4.13", // DSR (lib/dsr.h); ENCAP_L3_IPV4 is 5.2, DECAP_L3_IPV4 6.3 (before, non-GSO packets only), ENCAP_L2_ETH 5.13 (the overlay's encapsulation; before, the device's)
	asm.FnFibLookup:          "4.18",
	asm.FnGetCurrentCgroupId: "4.18",
	asm.FnSockHashUpdate:     "4.18",
	asm.FnMsgRedirectHash:    "4.18",
	asm.FnMsgApplyBytes:      "4.17",
	// GPL-only; in sk_msg programs through the base helpers, for a loader
	// with CAP_PERFMON, refused under lockdown=confidentiality (CheckKernel
	// probes the pair on the running kernel).
	asm.FnProbeReadKernel:  "5.5",
	asm.FnSkRelease:        "4.20",
	asm.FnSkcLookupTcp:     "5.2",
	asm.FnSkAssign:         "5.7", // tc programs (bpf/lib/steer.h)
	asm.FnSkStorageGet:     "5.2",
	asm.FnSkStorageDelete:  "5.2",
	asm.FnGetNetnsCookie:   "5.7",
	asm.FnSeqWrite:         "5.7",
	asm.FnRingbufReserve:   "5.8",
	asm.FnRingbufSubmit:    "5.8",
	asm.FnRingbufQuery:     "5.8",
	asm.FnReserveHdrOpt:    "5.10", // sockops: the proxy's SYN carries its client's identity (bpf/lib/carried_identity.h)
	asm.FnStoreHdrOpt:      "5.10",
	asm.FnRedirectNeigh:    "5.10",
	asm.FnRedirectPeer:     "5.10",
	asm.FnKtimeGetCoarseNs: "5.11", // conntrack's clock (lib/conntrack.h, ct_now)
	asm.FnCheckMtu:         "5.12",
	asm.FnSetRetval:        "5.18",
}

// helperGuard is the fallback under which a helper newer than the floor
// is never reached: the objects branch on a load-time constant around it,
// and the verifier, which walks only reachable code, never checks it.
var helperGuard = map[asm.BuiltinFunc]dpinfo.Fallback{
	asm.FnSetRetval: dpinfo.FallbackNoSetRetval,
}

// kfuncSince is the first kernel of each kfunc, and objectGuard the
// fallback under which an object is never loaded.
var kfuncSince = map[string]string{
	"bpf_sock_destroy":  "6.5",
	"bpf_skb_ct_lookup": "5.18", // tc's, with nf_conntrack (a module on many distributions)
	"bpf_ct_release":    "5.18",
}

// kfuncWeak are kfuncs the objects declare __weak and test for before the
// call: an object loads on a kernel without them (the loader resolves the
// symbol to 0), and only the feature they serve is missing there. Each
// says what.
var kfuncWeak = map[string]string{
	"bpf_skb_ct_lookup": "lib/ct_stack.h: kube-proxy's established NodePort connections are not kept across a migration",
	"bpf_ct_release":    "lib/ct_stack.h: with bpf_skb_ct_lookup",
}

var objectGuard = map[string]dpinfo.Fallback{
	"sockdestroy": dpinfo.FallbackSockDiag, // the iterator calling bpf_sock_destroy
}

// programSince is the first kernel of each program and attach type.
var programSince = map[ebpf.ProgramType]map[ebpf.AttachType]string{
	ebpf.SchedCLS: {ebpf.AttachNone: "4.5"}, // cls_bpf in a clsact qdisc, direct action; tcx links: dpinfo.FallbackTC
	ebpf.CGroupSockAddr: {
		ebpf.AttachCGroupInet4Connect:     "4.17",
		ebpf.AttachCGroupInet6Connect:     "4.17",
		ebpf.AttachCGroupUDP4Sendmsg:      "4.18",
		ebpf.AttachCGroupUDP6Sendmsg:      "4.18",
		ebpf.AttachCGroupUDP4Recvmsg:      "5.2",
		ebpf.AttachCGroupUDP6Recvmsg:      "5.2",
		ebpf.AttachCgroupInet4GetPeername: "5.8",
		ebpf.AttachCgroupInet6GetPeername: "5.8",
	},
	ebpf.SockOps:       {ebpf.AttachCGroupSockOps: "4.13"},
	ebpf.SkMsg:         {ebpf.AttachSkMsgVerdict: "4.17"}, // through a link: dpinfo.FallbackSkMsgAttach
	ebpf.CGroupSockopt: {ebpf.AttachCGroupGetsockopt: "5.3"},
	ebpf.Tracing:       {ebpf.AttachTraceIter: "5.9"}, // iter/udp
}

// mapSince is the first kernel of each map type.
var mapSince = map[ebpf.MapType]string{
	ebpf.Hash:         "3.19",
	ebpf.Array:        "3.19",
	ebpf.ProgramArray: "4.2",
	ebpf.PerCPUArray:  "4.6",
	ebpf.LRUHash:      "4.10",
	ebpf.LPMTrie:      "4.11",
	ebpf.HashOfMaps:   "4.12", // shunt_maglev; its arrays' BPF_F_INNER_MAP is 5.10
	ebpf.SockHash:     "4.18",
	ebpf.SkStorage:    "5.2",
	ebpf.RingBuf:      "5.8",
}

// objectUse is what one compiled object asks of the kernel.
type objectUse struct {
	object   string
	programs map[string]programUse
	maps     map[string]ebpf.MapType
}

type programUse struct {
	typ     ebpf.ProgramType
	attach  ebpf.AttachType
	helpers []asm.BuiltinFunc
	kfuncs  []string
}

// objectUses reads every object of this build (the socket destroyer's
// too), without loading anything.
func objectUses() ([]objectUse, error) {
	specs, err := loadSpecs()
	if err != nil {
		return nil, err
	}
	destroy, err := loadSockdestroy()
	if err != nil {
		return nil, fmt.Errorf("reading object sockdestroy: %w", err)
	}
	var out []objectUse
	for _, o := range append(specs.named(), namedSpec{"sockdestroy", destroy}) {
		spec := o.spec
		use := objectUse{object: o.name, programs: map[string]programUse{}, maps: map[string]ebpf.MapType{}}
		for name, p := range spec.Programs {
			pu := programUse{typ: p.Type, attach: p.AttachType}
			for _, ins := range p.Instructions {
				switch {
				case ins.IsBuiltinCall():
					fn := asm.BuiltinFunc(ins.Constant)
					if !slices.Contains(pu.helpers, fn) {
						pu.helpers = append(pu.helpers, fn)
					}
				case ins.IsKfuncCall():
					if !slices.Contains(pu.kfuncs, ins.Reference()) {
						pu.kfuncs = append(pu.kfuncs, ins.Reference())
					}
				}
			}
			slices.Sort(pu.helpers)
			use.programs[name] = pu
		}
		for name, m := range spec.Maps {
			if strings.HasPrefix(name, ".") { // .rodata and the like: arrays
				continue
			}
			use.maps[name] = m.Type
		}
		out = append(out, use)
	}
	return out, nil
}

// newerThanFloor says whether a release is newer than dpinfo.KernelFloor.
func newerThanFloor(release string) bool { return compareRelease(release, dpinfo.KernelFloor) > 0 }

// compareRelease compares "major.minor" releases.
func compareRelease(a, b string) int {
	pa, pb := strings.SplitN(a, ".", 2), strings.SplitN(b, ".", 2)
	for i := range 2 {
		x, _ := strconv.Atoi(pa[min(i, len(pa)-1)])
		y, _ := strconv.Atoi(pb[min(i, len(pb)-1)])
		if x != y {
			return x - y
		}
	}
	return 0
}

// The probes CheckKernel runs (a test replaces them with a kernel that
// lacks something).
var (
	haveProgramType   = features.HaveProgramType
	haveProgramHelper = features.HaveProgramHelper
	haveMapType       = features.HaveMapType
)

// CheckKernel probes, before anything is attached, every program type and
// every helper each program of this build calls, on this kernel, except
// what the fallbacks taken leave unused; a missing one is named with the
// first kernel that has it. Helpers are probed per program type
// (features.HaveProgramHelper): a kernel may have a helper for one type of
// program and not yet for another.
func CheckKernel(fallbacks dpinfo.Fallbacks) error {
	uses, err := objectUses()
	if err != nil {
		return err
	}
	var missing []string
	seen := map[string]bool{}
	note := func(what, since string, err error) {
		if seen[what] {
			return
		}
		seen[what] = true
		if errors.Is(err, ebpf.ErrNotSupported) {
			missing = append(missing, fmt.Sprintf("%s (Linux %s)", what, since))
		}
	}
	for _, o := range uses {
		if g, ok := objectGuard[o.object]; ok && fallbacks.Has(g) {
			continue
		}
		for _, p := range o.programs {
			note("BPF programs of type "+p.typ.String(), programSince[p.typ][p.attach], haveProgramType(p.typ))
			for _, h := range p.helpers {
				if g, ok := helperGuard[h]; ok && fallbacks.Has(g) {
					continue
				}
				err := haveProgramHelper(p.typ, h)
				if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
					continue // no way to probe this pair here: loading tells
				}
				note(fmt.Sprintf("the %s helper in %s programs", helperName(h), p.typ), helperSince[h], err)
			}
		}
		for _, t := range o.maps {
			note("BPF maps of type "+t.String(), mapSince[t], haveMapType(t))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("this kernel (%s) lacks what shunt needs and has no fallback for: %s; shunt runs on Linux %s and later (docs/kernels.md)",
			KernelRelease(), strings.Join(missing, ", "), dpinfo.KernelFloor)
	}
	return nil
}

// helperName is the C name of a helper ("bpf_redirect_peer").
func helperName(h asm.BuiltinFunc) string {
	s := strings.TrimPrefix(h.String(), "Fn")
	var b strings.Builder
	b.WriteString("bpf")
	for _, r := range s {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
