package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/shuntnet/shunt/internal/dpinfo"
)

// Masquerade is how pods' traffic to destinations outside the cluster
// leaves the node: from Addr, the node's address on its uplink, and a
// source port of Ports allocated per flow by the uplink programs
// (bpf/uplink_tc.c). Both are load-time constants: changing them means
// opening again.
type Masquerade struct {
	Addr  netip.Addr
	Ports dpinfo.PortRange
}

// EphemeralPorts is the calling thread's network namespace's
// net.ipv4.ip_local_port_range: where the node's own connections take
// their source ports.
func EphemeralPorts() (dpinfo.PortRange, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return dpinfo.PortRange{}, fmt.Errorf("reading the node's ephemeral port range: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return dpinfo.PortRange{}, fmt.Errorf("net.ipv4.ip_local_port_range is %q: want two ports", b)
	}
	return dpinfo.ParsePortRange(f[0] + "-" + f[1])
}

func (m *Masquerade) check() error {
	if !m.Addr.Is4() || m.Addr.IsUnspecified() {
		return fmt.Errorf("masquerade address %s: give the node's IPv4 address on its uplink", m.Addr)
	}
	if m.Ports.Min == 0 || m.Ports.Min > m.Ports.Max {
		return fmt.Errorf("masquerade ports %s: give MIN-MAX, 1 <= MIN <= MAX <= 65535", m.Ports)
	}
	return nil
}

// NodePort is how traffic from outside reaches the node's external
// Service frontends (lib/nodeport.h): it arrives on UplinkIfindex, where
// the replies leave too, and a flow whose backend is on another node
// (externalTrafficPolicy Cluster) gets SNATAddr, the node's address on the
// pod network, and a source port of Ports, or, as Mode says, goes to its
// backend's node by DSR (bpf/lib/dsr.h) in IPIP from DSRAddr, the node's
// underlay address, at which this node also accepts other nodes' DSR
// packets (whatever its own Mode). Load-time constants.
type NodePort struct {
	UplinkIfindex int
	SNATAddr      netip.Addr
	Ports         dpinfo.PortRange
	Mode          dpinfo.NodePortMode
	DSRAddr       netip.Addr
	// UplinkAddr is the node's address on the uplink: the source of its
	// own connections to an outside load balancer address, which that
	// frontend's source ranges judge at the socket layer (invalid: the
	// node's address on the pod network, Config.NodeIP).
	UplinkAddr netip.Addr
}

func (n *NodePort) check() error {
	if n.UplinkIfindex <= 0 {
		return fmt.Errorf("NodePort uplink interface index %d: give the index of the interface holding the node's address (UplinkOf)", n.UplinkIfindex)
	}
	if !n.SNATAddr.Is4() || n.SNATAddr.IsUnspecified() {
		return fmt.Errorf("NodePort SNAT address %s: give the node's IPv4 address on the pod network", n.SNATAddr)
	}
	if n.Ports.Min == 0 || n.Ports.Min > n.Ports.Max {
		return fmt.Errorf("NodePort SNAT ports %s: give MIN-MAX, 1 <= MIN <= MAX <= 65535", n.Ports)
	}
	if _, err := dpinfo.ParseNodePortMode(string(n.Mode)); err != nil {
		return err
	}
	if n.DSRAddr.IsValid() && (!n.DSRAddr.Is4() || n.DSRAddr.IsUnspecified()) {
		return fmt.Errorf("NodePort DSR address %s: give the node's IPv4 underlay address", n.DSRAddr)
	}
	if n.Mode.UsesDSR() && !n.DSRAddr.IsValid() {
		return fmt.Errorf("--nodeport-mode %s needs the node's underlay address (the outer source of DSR's IPIP)", n.Mode)
	}
	return nil
}

// modeValue is n's Mode as the programs' enum nodeport_mode.
func (n *NodePort) modeValue() uint32 {
	switch n.Mode {
	case dpinfo.NodePortDSR:
		return uint32(uplinktcNodeportModeNODEPORT_MODE_DSR)
	case dpinfo.NodePortHybrid:
		return uint32(uplinktcNodeportModeNODEPORT_MODE_HYBRID)
	}
	return uint32(uplinktcNodeportModeNODEPORT_MODE_SNAT)
}

// usesUplink says whether the uplink programs run: they masquerade,
// receive what other nodes route here with native routing, and what
// outside clients send to the node's Services.
func (c Config) usesUplink() bool {
	return c.Masquerade != nil || c.NativeIfindex != 0 || c.NodePort != nil
}

// loadUplink loads the uplink programs with the pod programs' forwarding
// configuration and the masquerade's (none: MASQ.addr 0), beside them
// (loadBeside): one conntrack, one endpoint table.
func (d *Datapath) loadUplink(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions, cfg podtcShuntConfig, flowsSize uint32) error {
	if err := spec.Variables[uplinktcVarCONFIG].Set(uplinktcShuntConfig(sideConfig(cfg))); err != nil {
		return fmt.Errorf("setting the uplink programs' load-time config: %w", err)
	}
	if m := d.cfg.Masquerade; m != nil {
		if err := m.check(); err != nil {
			return err
		}
		if err := spec.Variables[uplinktcVarMASQ].Set(uplinktcMasqConfig{Addr: be32(m.Addr), PortMin: m.Ports.Min, PortMax: m.Ports.Max}); err != nil {
			return fmt.Errorf("setting the masquerade's load-time config: %w", err)
		}
	}
	if err := spec.Variables[uplinktcVarMAGLEV_SIZE].Set(uint32(d.cfg.MaglevSize)); err != nil {
		return fmt.Errorf("setting the Maglev table size: %w", err)
	}
	// Before Linux 6.3 a GSO packet arriving by DSR cannot be
	// decapsulated (bpf/lib/dsr.h).
	var noGSODecap uint32
	if d.cfg.Fallbacks.Has(dpinfo.FallbackNoGSODecap) {
		noGSODecap = 1
	}
	if err := spec.Variables[uplinktcVarDSR_NO_GSO_DECAP].Set(noGSODecap); err != nil {
		return fmt.Errorf("setting the uplink programs' load-time DSR_NO_GSO_DECAP: %w", err)
	}
	inner, err := maglevInnerSpec(spec)
	if err != nil {
		return err
	}
	d.maglevInner = inner
	if err := d.loadBeside(spec, opts, flowsSize, &d.uplink); err != nil {
		return err
	}
	// The overlay program that takes VXLAN off the wire, for the uplink
	// program's tail call (shunt_overlay_wire in bpf/uplink_tc.c): the
	// overlay program is loaded with every datapath, and the uplink
	// program calls it only for the overlay's packets (a tunnel endpoint
	// configured). Left empty, the call returns and the VXLAN device
	// decapsulates (Config.OverlayDecapInDevice).
	if !d.cfg.OverlayDecapInDevice {
		if err := d.uplink.ShuntOverlayWire.Put(uint32(0), d.overlay.ShuntFromOverlayWire); err != nil {
			return fmt.Errorf("giving the uplink program the overlay's program for VXLAN off the wire (shunt_overlay_wire): %w", err)
		}
	}
	d.masqExclude = mirroredMap[podtcIpcacheKey, uplinktcMasqExcludeValue]{m: d.uplink.ShuntMasqExclude, name: "shunt_masq_exclude"}
	d.dsrNodes = mirroredMap[uplinktcDsrNodeKey, uplinktcDsrNodeValue]{m: d.uplink.ShuntDsrNodes, name: "shunt_dsr_nodes"}
	return nil
}

// The programs on the node's uplink: to-uplink at egress (what leaves the
// node: pods' flows to outside get the node's address), from-uplink at
// ingress (their replies get the pod's back).
const (
	toUplinkHook   = "to-uplink"
	fromUplinkHook = "from-uplink"
)

// AttachUplink attaches the uplink programs (masquerade, native routing's
// receiving end) at tc egress and ingress of the node's uplink, the
// interface holding the node's underlay address, adopting existing
// attachments as AttachPod does. Call it in the network namespace
// the interface is in.
func (d *Datapath) AttachUplink(ifname string, ifindex int) error {
	if !d.cfg.usesUplink() {
		return fmt.Errorf("attaching the uplink programs to %s: the datapath was opened without masquerade (Config.Masquerade), "+
			"native routing (Config.NativeIfindex) or NodePort (Config.NodePort)", ifname)
	}
	if np := d.cfg.NodePort; np != nil && ifindex != np.UplinkIfindex {
		return fmt.Errorf("attaching the uplink programs to %s (ifindex %d): NodePort was opened on ifindex %d; "+
			"the uplink is the interface holding the node's address", ifname, ifindex, np.UplinkIfindex)
	}
	if d.cfg.NativeIfindex != 0 && ifindex != d.cfg.NativeIfindex {
		return fmt.Errorf("attaching the uplink programs to %s (ifindex %d): native routing was opened on ifindex %d; "+
			"the uplink is the underlay interface", ifname, ifindex, d.cfg.NativeIfindex)
	}
	if !d.cfg.Mode.UsesBPF() {
		return fmt.Errorf("attaching the uplink programs to %s: forwarding mode %s runs no BPF program; "+
			"use %s or %s for masquerade or native routing", ifname, d.cfg.Mode, ModeRedirectPeer, ModeRedirect)
	}
	if err := d.attachTC(toUplinkHook, ifname, ifindex, d.uplink.ShuntToUplink, ebpf.AttachTCXEgress); err != nil {
		return err
	}
	return d.attachTC(fromUplinkHook, ifname, ifindex, d.uplink.ShuntFromUplink, ebpf.AttachTCXIngress)
}

// DetachUplink removes the masquerade programs from the uplink (a no-op
// when none).
func (d *Datapath) DetachUplink(ifname string) error {
	return errors.Join(d.detachTC(toUplinkHook, ifname, ebpf.AttachTCXEgress), d.detachTC(fromUplinkHook, ifname, ebpf.AttachTCXIngress))
}

// UplinkOf is the interface of the calling thread's network namespace that
// holds addr: where the uplink programs go, and native routing's underlay.
func UplinkOf(addr netip.Addr) (name string, ifindex int, err error) {
	l, err := underlayLink(addr)
	if err != nil {
		return "", 0, fmt.Errorf("the node's uplink: %w", err)
	}
	return l.Attrs().Name, l.Attrs().Index, nil
}

// SyncMasqExclude makes shunt_masq_exclude hold exactly these prefixes:
// destinations pods reach with their own address (the cluster's pods,
// services and nodes, and whatever else the operator lists). Addresses the
// ipcache knows (pods, node addresses) are never masqueraded anyway. A list
// that does not fit is refused before any write.
func (d *Datapath) SyncMasqExclude(prefixes []netip.Prefix) error {
	if d.cfg.Masquerade == nil {
		return nil
	}
	want := map[podtcIpcacheKey]uplinktcMasqExcludeValue{}
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			return fmt.Errorf("masquerade exclusion %s: only IPv4 prefixes are supported", p)
		}
		want[ipcacheKey(p)] = uplinktcMasqExcludeValue{}
	}
	return replaceMirrored(d, &d.masqExclude, want)
}

// replaceMirrored makes a mirrored map the agent alone writes hold exactly
// want: refused before any write when it does not fit (checkFits), the
// new and changed entries written before the stale ones go, so an entry
// that stays is never missing.
func replaceMirrored[K comparable, V comparable](d *Datapath, mm *mirroredMap[K, V], want map[K]V) error {
	if err := d.checkFits(mm.name, len(want)); err != nil {
		return err
	}
	stale, err := mm.write(want, nil)
	if err != nil {
		return err
	}
	return mm.prune(stale)
}

// masqDirNames name enum masq_dir in dumps.
var masqDirNames = [...]string{
	uplinktcMasqDirMASQ_OUT: "out",
	uplinktcMasqDirMASQ_IN:  "in",
}

// masqFlagNames name enum masq_flags, one per bit.
var masqFlagNames = map[uplinktcMasqFlags]string{
	uplinktcMasqFlagsMASQ_F_REPLY_SEEN: "reply-seen",
	uplinktcMasqFlagsMASQ_F_FIN_OUT:    "fin-out",
	uplinktcMasqFlagsMASQ_F_FIN_IN:     "fin-in",
	uplinktcMasqFlagsMASQ_F_RST:        "rst",
}

// masqRows decodes shunt_masq_nat: each entry with the flow's three
// places (the pod, the outside end, the node's address and port), whichever
// direction it is keyed by.
func (d *Datapath) masqRows() ([]Row, error) {
	now := monotonicNow()
	return dump(d.uplink.ShuntMasqNat, func(k uplinktcMasqKey, v uplinktcMasqValue) Row {
		at := func(a uint32, p uint16) string { return fmt.Sprintf("%s:%d", fromBe32(a), fromBe16(p)) }
		r := Row{"direction": name(masqDirNames[:], k.Dir), "protocol": dpinfo.ProtoName(k.Proto),
			"flags": flagsText(v.Flags, masqFlagNames), "ageSeconds": secondsSince(now, v.CreatedNs),
			"idleSeconds": secondsSince(now, v.LastSeenNs)}
		if k.Dir == uint8(uplinktcMasqDirMASQ_OUT) {
			r["pod"], r["outside"], r["node"] = at(k.Saddr, k.Sport), at(k.Daddr, k.Dport), at(v.Addr, v.Port)
		} else {
			r["outside"], r["node"], r["pod"] = at(k.Saddr, k.Sport), at(k.Daddr, k.Dport), at(v.Addr, v.Port)
		}
		return r
	})
}

// nodePortRows decodes shunt_nodeport_nat: each entry's tuple as it
// arrives and the tuple written over it; a reply's goes back out to the
// client.
func (d *Datapath) nodePortRows() ([]Row, error) {
	now := monotonicNow()
	return dump(d.objs.ShuntNodeportNat, func(k podtcTcNatKey, v uplinktcNodeportNatValue) Row {
		at := func(a uint32, p uint16) string { return fmt.Sprintf("%s:%d", fromBe32(a), fromBe16(p)) }
		dir := "to-backend"
		switch {
		case v.Reply != 0:
			dir = "reply"
		case v.Dsr != 0:
			dir = "to-backend-dsr" // its reply leaves from the backend's node
		}
		return Row{"direction": dir, "protocol": dpinfo.ProtoName(k.Proto), "from": at(k.Saddr, k.Sport), "to": at(k.Daddr, k.Dport),
			"newFrom": at(v.Saddr, v.Sport), "newTo": at(v.Daddr, v.Dport),
			"flags": flagsText(v.Flags, masqFlagNames), "idleSeconds": secondsSince(now, v.LastSeenNs)}
	})
}
