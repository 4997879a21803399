package dpinfo

import (
	"fmt"
	"slices"
	"strings"
)

// The kernel features shunt uses, the first Linux release that has each,
// and what shunt does on a kernel without it. The floor is Linux 5.15
// (Ubuntu 22.04); Debian 12, Amazon Linux 2023, Bottlerocket and COS run
// 6.1. Features newer than the floor have a fallback (Fallbacks); the rest
// are required and checked before anything is attached (the agent's
// preflight). docs/kernels.md is this table for people, and
// internal/datapath's TestObjectsUseOnlyTabledFeatures checks every helper,
// kfunc, program and attach type of the compiled objects against it.

// KernelFloor is the oldest kernel shunt runs on.
const KernelFloor = "5.15"

// A Fallback names one kernel feature newer than the floor for which
// shunt has an older path.
type Fallback string

const (
	// tcx links (6.6) → tc clsact qdisc with cls_bpf filters through
	// netlink, at shunt's own priority and handle.
	FallbackTC Fallback = "tc"
	// sk_msg attached with a sockmap link (6.10) → BPF_PROG_ATTACH to the
	// sockhash.
	FallbackSkMsgAttach Fallback = "skmsg-attach"
	// bpf_sock_destroy over the iter/udp socket iterator (6.5) →
	// SOCK_DESTROY over sock_diag netlink, as Cilium does on such kernels.
	FallbackSockDiag Fallback = "sock-diag"
	// bpf_set_retval in cgroup hooks (5.18) → the hooks' return code and
	// ctx->retval: connect to a service without backends fails with EPERM
	// instead of ECONNREFUSED.
	FallbackNoSetRetval Fallback = "no-set-retval"
	// bpf_skb_adjust_room's BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (6.3) → the
	// outer header of a single DSR packet taken off without it; a GSO
	// packet arriving by DSR (between virtual devices: a NIC's GRO never
	// merges IPIP with IP options) is dropped, counted dsr-gso-decap.
	FallbackNoGSODecap Fallback = "dsr-no-gso-decap"
)

// AllFallbacks lists every fallback, in the order the table
// (KernelFeatures) gives them.
var AllFallbacks = func() []Fallback {
	var out []Fallback
	for _, f := range KernelFeatures {
		out = append(out, f.Fallback)
	}
	return out
}()

// Fallbacks is the set of older paths the datapath takes, because the
// kernel lacks the newer feature or because they were forced (tests, and
// a user who wants the older path). The zero value takes every newer path.
type Fallbacks map[Fallback]bool

// Has says whether the fallback is taken.
func (f Fallbacks) Has(x Fallback) bool { return f[x] }

// List is the fallbacks taken, in table order.
func (f Fallbacks) List() []Fallback {
	var out []Fallback
	for _, x := range AllFallbacks {
		if f[x] {
			out = append(out, x)
		}
	}
	return out
}

// ParseFallbacks reads a comma-separated list of fallbacks to force
// ("all" is every one; "" none), as shuntd's --kernel-fallbacks and
// SHUNT_KERNEL_FALLBACKS give it.
func ParseFallbacks(s string) (Fallbacks, error) {
	out := Fallbacks{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		switch {
		case part == "":
		case part == "all":
			for _, x := range AllFallbacks {
				out[x] = true
			}
		case slices.Contains(AllFallbacks, Fallback(part)):
			out[Fallback(part)] = true
		default:
			return nil, fmt.Errorf("unknown kernel fallback %q: use all or a list of %v", part, AllFallbacks)
		}
	}
	return out, nil
}

// KernelFeature is one row of the table.
type KernelFeature struct {
	// Name is the short name status prints ("tcx").
	Name string
	// What the feature is, for an error or the docs.
	What string
	// Since is the first Linux release that has it.
	Since string
	// Fallback is the older path ("" when the feature is required).
	Fallback Fallback
	// Instead says what shunt does with the fallback ("tc clsact").
	Instead string
}

// KernelFeatures is the table of features with a fallback. The required
// ones are the agent's preflight checks.
var KernelFeatures = []KernelFeature{
	{Name: "tcx", What: "tcx links for the tc programs", Since: "6.6",
		Fallback: FallbackTC, Instead: "tc clsact"},
	{Name: "sockmap link", What: "sk_msg attached to the sockhash with a BPF link", Since: "6.10",
		Fallback: FallbackSkMsgAttach, Instead: "BPF_PROG_ATTACH"},
	{Name: "sock_destroy", What: "the bpf_sock_destroy kfunc over the iter/udp socket iterator", Since: "6.5",
		Fallback: FallbackSockDiag, Instead: "sock_diag destroy"},
	{Name: "set_retval", What: "the bpf_set_retval helper in cgroup hooks", Since: "5.18",
		Fallback: FallbackNoSetRetval, Instead: "EPERM for refused connects"},
	{Name: "DSR GSO decap", What: "bpf_skb_adjust_room's BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (DSR's IPIP header off GSO packets)", Since: "6.3",
		Fallback: FallbackNoGSODecap, Instead: "GSO packets arriving by DSR dropped (dsr-gso-decap)"},
}

// KernelReport is what status says of the kernel: its release, and for
// each feature of the table whether the datapath uses it or its fallback
// (and whether the fallback was forced).
type KernelReport struct {
	Release string   `json:"release"`
	Taken   []string `json:"fallbacks,omitempty"` // the Fallback names taken
	Forced  []string `json:"forced,omitempty"`    // of those, the ones forced although the kernel has the feature
}

// Line is the report in one line: "6.1; tcx: no → tc clsact; sockmap
// link: yes; ...".
func (r KernelReport) Line() string {
	parts := []string{r.Release}
	for _, f := range KernelFeatures {
		switch {
		case slices.Contains(r.Forced, string(f.Fallback)):
			parts = append(parts, fmt.Sprintf("%s: forced off → %s", f.Name, f.Instead))
		case slices.Contains(r.Taken, string(f.Fallback)):
			parts = append(parts, fmt.Sprintf("%s: no → %s", f.Name, f.Instead))
		default:
			parts = append(parts, f.Name+": yes")
		}
	}
	return strings.Join(parts, "; ")
}
