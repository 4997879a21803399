// Package datapath is the only code in shunt that talks to the kernel's BPF
// subsystem: it loads the programs, pins and adopts maps and links under the
// instance's bpffs directory, attaches programs to pod interfaces, and writes
// map contents computed elsewhere as a diff against what the kernel holds.
package datapath

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// Mode is how traffic between pods of the node is forwarded.
type Mode string

const (
	ModeRedirectPeer Mode = "redirect-peer" // tc + bpf_redirect_peer (default)
	ModeRedirect     Mode = "redirect"      // tc + bpf_redirect
	ModeBridge       Mode = "bridge"        // classic Linux bridge, no BPF: a baseline
	ModeRouted       Mode = "routed"        // host routing over veths, no BPF: a baseline
)

// Modes lists every forwarding mode, the default first.
var Modes = []Mode{ModeRedirectPeer, ModeRedirect, ModeBridge, ModeRouted}

// ParseMode validates a mode name.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown forwarding mode %q: use one of %v", s, Modes)
}

// UsesBPF says whether pod interfaces get shunt's tc programs in this mode.
func (m Mode) UsesBPF() bool { return m == ModeRedirectPeer || m == ModeRedirect }

// Config says where the datapath keeps its pins and how it forwards.
type Config struct {
	PinDir string // e.g. /sys/fs/bpf/shunt
	Mode   Mode
	// FlowBufferBytes sizes the flow event ring buffer (rounded up to a
	// power of two); 0 keeps the built-in 4 MiB.
	FlowBufferBytes int
	// ProxyMark is the SO_MARK layout of L7 proxies' upstream sockets
	// (the zero value: no proxy, nothing is recognised by its mark).
	ProxyMark ProxyMark
	// ProxySteer, when set, gives connections from off the node to local
	// pods' ports with HTTP rules to the node proxy's transparent
	// listener in tc (bpf/lib/steer.h); nil: such connections are dropped
	// (proxy-steer-failed). A load-time constant.
	ProxySteer *ProxySteer
	// TunnelIfindex is the node's collect-metadata VXLAN device
	// (EnsureVXLAN), through which packets for pods of other nodes (ipcache
	// entries with a Tunnel) leave; 0: no overlay, they go to the host
	// stack. It is a load-time constant: changing it means opening again.
	TunnelIfindex int
	// TunnelEndpoint is the overlay's endpoint on this node, the
	// underlay address and UDP port given to EnsureVXLAN (only with
	// TunnelIfindex): the uplink program hands the VXLAN packets that
	// arrive there to the stack at its first look, instead of trying
	// them against its DSR, NodePort and masquerade tables. The zero
	// value: it tries them (what they do with them is the same). A
	// load-time constant.
	TunnelEndpoint netip.AddrPort
	// TunnelUnderlayIfindex is the interface holding TunnelEndpoint's
	// address (UplinkOf): packets for other nodes' pods are encapsulated
	// in BPF, from the endpoint, and leave out of it
	// (bpf/lib/encap.h, encap_in_bpf). 0: the VXLAN device encapsulates
	// them (shuntd --overlay-encap-in-device: the benchmarks' baseline for
	// that path, and a way back should it misbehave on some host). A
	// load-time constant.
	TunnelUnderlayIfindex int
	// NodeIP is the node's address on the pod network (pods' gateway):
	// the source of the ICMP errors the programs answer themselves, as the
	// host stack would (with the overlay: "fragmentation needed" for a
	// packet too big for the tunnel). Required with TunnelIfindex; a
	// load-time constant.
	NodeIP netip.Addr
	// NativeIfindex turns native routing on (no encapsulation): the node's
	// underlay interface (UplinkOf), out of which packets for pods of other
	// nodes leave routed as they are (bpf_fib_lookup over the routes
	// SyncTunnelRoutes installs), and on which the uplink programs
	// (AttachUplink) receive other nodes' pods' packets. 0: off. Never set
	// with TunnelIfindex; a load-time constant.
	NativeIfindex int
	// LayoutFile records the layouts of the pinned maps, to check that a
	// later build reads them alike (layout.go). bpffs holds no regular
	// files, so it lives elsewhere: the agent's state directory. "": none
	// is recorded; pinned maps are checked against the BTF the kernel keeps
	// for them.
	LayoutFile string
	// ConntrackSingleTable puts every connection into shunt_ct at its first
	// packet, as before shunt_ct_new existed: a flood of new connections
	// then evicts established ones. Only a baseline for benchmarks and
	// tests; a load-time constant.
	ConntrackSingleTable bool
	// OverlayDecapInDevice leaves the overlay's packets to the node's
	// VXLAN device alone: the uplink program does not take them off the
	// wire (shunt_from_overlay_wire). The benchmarks' baseline for that
	// path, and a way back should it misbehave on some host.
	OverlayDecapInDevice bool
	// Masquerade, when set, loads the uplink programs (AttachUplink) that
	// give pods' traffic to outside the cluster the node's address; nil:
	// pods' traffic leaves with their own addresses.
	Masquerade *Masquerade
	// NodePort, when set, loads the uplink programs and lets traffic from
	// outside reach the node's external Service frontends (NodePort,
	// externalIPs, load balancer addresses: lib/nodeport.h); nil: they
	// are reached from the node and its pods only (the socket layer).
	NodePort *NodePort
	// MaglevSize is the size M (a prime) of the Maglev table of each
	// external service port (bpf/lib/maglev.h): traffic from outside picks
	// its backend through it, the same on every node. 0: a random backend
	// per new flow. A load-time constant; maglev.DefaultSize is the
	// agent's default.
	MaglevSize int
	// Fallbacks are the older paths to take for kernel features this
	// kernel lacks (ProbeKernel) or that were forced; nil: every newer
	// path (Linux 6.10+).
	Fallbacks dpinfo.Fallbacks
	// ConntrackMax is the entries of each connection table (conntrack,
	// the NodePort, masquerade and tc translations; shunt_ct_new a
	// quarter of it): how many connections the node keeps at once, half
	// as many translated ones (tablesize.go). 0: DefaultConntrackMax.
	// Tables pinned at another size are replaced, entries kept.
	ConntrackMax int
}

// Datapath holds the loaded programs and maps of one shunt instance.
type Datapath struct {
	cfg     Config
	objs    podtcObjects      // tc programs on pod veths
	overlay overlaytcPrograms // tc program on the node's VXLAN device
	// The socket layer, one object per program kind; their maps are the
	// pod programs' (pinned by name), each object holds its own handles.
	sockAddr sockaddrObjects // cgroup address hooks: service load balancing, L7 redirection
	sockOps  sockopsObjects  // sockops: socket acceleration, proxy origins
	skMsg    skmsgPrograms   // sk_msg on shunt_sockhash: socket acceleration
	sockopt  sockoptPrograms // cgroup getsockopt: SO_ORIGINAL_DST for proxies
	uplink   uplinktcObjects // masquerade on the node's uplink (loaded only with Config.Masquerade)

	masqExclude mirroredMap[podtcIpcacheKey, uplinktcMasqExcludeValue] // destinations never masqueraded
	dsrNodes    mirroredMap[uplinktcDsrNodeKey, uplinktcDsrNodeValue]  // the nodes DSR packets are taken from (dsrnodes.go)

	services    serviceTable  // in-memory mirror of the service maps
	maglev      maglevState   // the Maglev tables (maglev.go)
	maglevInner *ebpf.MapSpec // their arrays' template
	pol         policyMaps    // in-memory mirrors of the endpoint and policy maps
	netns       netnsCookies  // network namespace cookies of pods, by namespace file
	drift       driftState    // what was written to maps without a mirror (drift.go)

	destroyer sockDestroyer // UDP socket iterator, loaded on first use (sockdestroy.go)

	layouts *layoutCheck // how the pinned maps' layouts were checked

	resized []resizedTable // connection tables found pinned at another size (tablesize.go)

	stats io.Closer // the programs' run-time statistics, while on (progstats.go)
}

// LayoutNotes says, for the log, how the layouts of the maps this datapath
// adopted were checked when they had no recorded layout and which counters
// maps were replaced (notes), and which maps were adopted unchecked
// (warnings); both empty when every pinned map had a recorded layout.
func (d *Datapath) LayoutNotes() (notes, warnings []string) {
	return d.layouts.notes, d.layouts.warnings
}

// Open loads the BPF objects, adopting maps already pinned under cfg.PinDir
// (so a restarted agent keeps every entry the datapath is using) and pinning
// new ones. It never flushes a map.
func Open(cfg Config) (*Datapath, error) { return open(cfg, nil) }

// open is Open with a change to the specs before loading (tests: a map
// small enough to fill), applied to every object alike.
func open(cfg Config, change func(*ebpf.CollectionSpec)) (_ *Datapath, err error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("removing memlock limit: %w", err)
	}
	if err := EnsureBPFFS(filepath.Dir(cfg.PinDir)); err != nil {
		return nil, err
	}
	specs, err := loadSpecs()
	if err != nil {
		return nil, err
	}
	spec := specs.pod
	mode := podtcShuntFwdModeSHUNT_FWD_REDIRECT_PEER
	if cfg.Mode == ModeRedirect {
		mode = podtcShuntFwdModeSHUNT_FWD_REDIRECT
	}
	if err := cfg.ProxyMark.check(); err != nil {
		return nil, err
	}
	if err := CheckConntrackMax(cfg.ConntrackMax); err != nil {
		return nil, err
	}
	if err := checkMaglevSize(cfg.MaglevSize); err != nil {
		return nil, err
	}
	if cfg.TunnelIfindex < 0 {
		return nil, fmt.Errorf("tunnel interface index %d: use the ifindex EnsureVXLAN returns, or 0 for no overlay", cfg.TunnelIfindex)
	}
	if cfg.NativeIfindex < 0 || (cfg.NativeIfindex != 0 && cfg.TunnelIfindex != 0) {
		return nil, fmt.Errorf("native routing interface index %d with tunnel interface index %d: "+
			"give the underlay's ifindex (UplinkOf) for native routing or a tunnel device's for the overlay, not both", cfg.NativeIfindex, cfg.TunnelIfindex)
	}
	if cfg.NodeIP.IsValid() && (!cfg.NodeIP.Is4() || cfg.NodeIP.IsUnspecified()) {
		return nil, fmt.Errorf("node address %s: give the node's IPv4 address on the pod network (pods' gateway)", cfg.NodeIP)
	}
	if cfg.TunnelIfindex != 0 && !cfg.NodeIP.IsValid() {
		return nil, errors.New("the overlay (a tunnel interface index) needs the node's address on the pod network (Config.NodeIP, " +
			"pods' gateway): it is the source of the ICMP \"fragmentation needed\" a packet too big for the tunnel is answered with")
	}
	if cfg.TunnelUnderlayIfindex < 0 || (cfg.TunnelUnderlayIfindex != 0 && !cfg.TunnelEndpoint.IsValid()) {
		return nil, fmt.Errorf("tunnel underlay interface index %d: give the ifindex of the interface holding the tunnel endpoint's address (UplinkOf), "+
			"with the endpoint (Config.TunnelEndpoint), or 0 to leave the encapsulation to the VXLAN device", cfg.TunnelUnderlayIfindex)
	}
	if ep := cfg.TunnelEndpoint; ep.IsValid() {
		if cfg.TunnelIfindex == 0 || !ep.Addr().Is4() || ep.Addr().IsUnspecified() || ep.Port() == 0 {
			return nil, fmt.Errorf("tunnel endpoint %s: give the node's IPv4 underlay address and VXLAN port EnsureVXLAN was given, with the tunnel interface index", ep)
		}
	}
	tcConfig := podtcShuntConfig{
		FwdMode: mode, ProxyMarkMagic: cfg.ProxyMark.Magic, ProxyMarkMask: cfg.ProxyMark.Mask,
		TunnelIfindex: uint32(cfg.TunnelIfindex), NativeIfindex: uint32(cfg.NativeIfindex),
	}
	if cfg.NodeIP.IsValid() {
		tcConfig.NodeIp4 = be32(cfg.NodeIP)
	}
	if ep := cfg.TunnelEndpoint; ep.IsValid() {
		tcConfig.TunnelLocalIp4, tcConfig.TunnelPort = be32(ep.Addr()), be16(ep.Port())
		tcConfig.TunnelUplinkIfindex = uint32(cfg.TunnelUnderlayIfindex)
	}
	if ps := cfg.ProxySteer; ps != nil {
		if err := ps.check(cfg.ProxyMark); err != nil {
			return nil, err
		}
		tcConfig.ProxySteerIp4, tcConfig.ProxySteerPort = be32(ps.Listen.Addr()), be16(ps.Listen.Port())
		tcConfig.ProxySteerMark = ps.Mark
	}
	if np := cfg.NodePort; np != nil {
		if err := np.check(); err != nil {
			return nil, err
		}
		tcConfig.UplinkIfindex, tcConfig.NodeportSnatIp4 = uint32(np.UplinkIfindex), be32(np.SNATAddr)
		tcConfig.NodeportPortMin, tcConfig.NodeportPortMax = np.Ports.Min, np.Ports.Max
		tcConfig.NodeportMode = np.modeValue()
		if np.DSRAddr.IsValid() {
			tcConfig.NodeportDsrIp4 = be32(np.DSRAddr)
		}
		if np.Mode.UsesDSR() && cfg.NativeIfindex == 0 && cfg.TunnelIfindex == 0 {
			return nil, fmt.Errorf("--nodeport-mode %s needs routing between nodes (native or the overlay): DSR sends a flow to its backend's node; "+
				"without either there is no other node's pod to reach, use --nodeport-mode snat", np.Mode)
		}
	}
	if cfg.ConntrackSingleTable {
		tcConfig.CtSingleTable = 1
	}
	if err := spec.Variables[podtcVarCONFIG].Set(tcConfig); err != nil {
		return nil, fmt.Errorf("setting load-time config: %w", err)
	}
	if cfg.FlowBufferBytes > 0 {
		spec.Maps["shunt_flows"].MaxEntries = flowBufferSize(cfg.FlowBufferBytes)
	}
	sizeConnTables(specs.list(true), cfg.ConntrackMax)
	if change != nil {
		for _, s := range specs.list(true) {
			change(s)
		}
	}
	// Before anything is created or pinned: a refusal leaves the node as
	// it was.
	// The uplink's maps exist only with masquerade or native routing (the
	// uplink programs): only then are they checked and recorded as pinned.
	layouts, err := checkLayouts(cfg.PinDir, cfg.LayoutFile, specs.list(cfg.usesUplink())...)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.PinDir, "links"), 0o700); err != nil {
		return nil, fmt.Errorf("creating pin directory: %w", err)
	}
	if err := replaceOldCounters(cfg.PinDir, layouts.replace); err != nil {
		return nil, err
	}
	d := &Datapath{cfg: cfg, layouts: layouts}
	// From here on a failure releases whatever was loaded (Close of an
	// object never loaded is a no-op); pins stay, as they would after Close.
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if d.resized, err = resizePinned(cfg.PinDir, specs.list(cfg.usesUplink())); err != nil {
		return nil, err
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.PinDir}}
	if err := spec.LoadAndAssign(&d.objs, opts); err != nil {
		return nil, explainLoadError(err, cfg.PinDir)
	}
	if err := probeAccel(); err != nil {
		return nil, err
	}
	flowsSize := spec.Maps["shunt_flows"].MaxEntries
	if err := d.loadOverlay(specs.overlay, opts, tcConfig, flowsSize); err != nil {
		return nil, err
	}
	if cfg.usesUplink() {
		if err := d.loadUplink(specs.uplink, opts, tcConfig, flowsSize); err != nil {
			return nil, err
		}
	}
	if err := d.loadSocket(specs, opts, flowsSize); err != nil {
		return nil, err
	}
	if err := layouts.recordLayouts(cfg.LayoutFile); err != nil {
		return nil, err
	}
	d.initPolicyMaps()
	return d, nil
}

// datapathSpecs are this build's objects, not yet in the kernel: one per
// program kind, as the tc programs' (pod veths, the overlay device, the
// uplink) and the socket layer's (bpf/sock_addr.c, sock_ops.c, sk_msg.c,
// sockopt.c).
type datapathSpecs struct {
	pod, overlay, uplink              *ebpf.CollectionSpec
	sockAddr, sockOps, skMsg, sockopt *ebpf.CollectionSpec
}

// list is the objects, the pod programs' first (they create the maps the
// others share); the uplink's only with uplink.
func (s *datapathSpecs) list(uplink bool) []*ebpf.CollectionSpec {
	out := []*ebpf.CollectionSpec{s.pod, s.overlay, s.sockAddr, s.sockOps, s.skMsg, s.sockopt}
	if uplink {
		out = append(out, s.uplink)
	}
	return out
}

// namedSpec is one object of this build, by the name of its C file's
// generated Go (bpf2go's identifier).
type namedSpec struct {
	name string
	spec *ebpf.CollectionSpec
}

// named is every object, the uplink's included, with its name: for what
// reads them all (the kernel feature check, kernelfeat.go).
func (s *datapathSpecs) named() []namedSpec {
	return []namedSpec{{"podtc", s.pod}, {"overlaytc", s.overlay}, {"uplinktc", s.uplink},
		{"sockaddr", s.sockAddr}, {"sockops", s.sockOps}, {"skmsg", s.skMsg}, {"sockopt", s.sockopt}}
}

// loadSpecs loads this build's objects, not yet in the kernel.
func loadSpecs() (*datapathSpecs, error) {
	var s datapathSpecs
	for _, l := range []struct {
		into **ebpf.CollectionSpec
		load func() (*ebpf.CollectionSpec, error)
	}{
		{&s.pod, loadPodtc}, {&s.overlay, loadOverlaytc}, {&s.uplink, loadUplinktc},
		{&s.sockAddr, loadSockaddr}, {&s.sockOps, loadSockops}, {&s.skMsg, loadSkmsg}, {&s.sockopt, loadSockopt},
	} {
		spec, err := l.load()
		if err != nil {
			return nil, err
		}
		*l.into = spec
	}
	return &s, nil
}

// loadSocket loads the socket layer's objects beside the pod programs
// (loadBeside): the cgroup address hooks (service load balancing, L7
// redirection), sockops (acceleration, proxy origins), sk_msg
// (acceleration) and the cgroup getsockopt program (SO_ORIGINAL_DST). Each
// object is loaded on its own (so a kind a kernel lacks can later be left
// out alone), all of them on one copy of every map.
func (d *Datapath) loadSocket(s *datapathSpecs, opts *ebpf.CollectionOptions, flowsSize uint32) error {
	// Of the load-time configuration the socket programs read only the
	// proxy's mark and whether routing is native (sockops then has the
	// proxy's SYNs to other nodes' pods carry their client's identity,
	// bpf/lib/carried_identity.h).
	cfg := podtcShuntConfig{ProxyMarkMagic: d.cfg.ProxyMark.Magic, ProxyMarkMask: d.cfg.ProxyMark.Mask,
		NativeIfindex: uint32(d.cfg.NativeIfindex)}
	for _, v := range []*ebpf.VariableSpec{s.sockAddr.Variables[sockaddrVarCONFIG], s.sockOps.Variables[sockopsVarCONFIG]} {
		if err := v.Set(cfg); err != nil {
			return fmt.Errorf("setting the socket programs' load-time config: %w", err)
		}
	}
	// Without bpf_set_retval (Linux 5.18) a refused connect or sendmsg
	// fails with EPERM, not ECONNREFUSED or ENOBUFS (bpf/lib/set_retval.h).
	var noSetRetval uint32
	if d.cfg.Fallbacks.Has(dpinfo.FallbackNoSetRetval) {
		noSetRetval = 1
	}
	// The node's own unbound sockets meet a load balancer's source
	// ranges with the address their route would pick (bpf/sock_addr.c).
	nodeSource := d.cfg.NodeIP
	if np := d.cfg.NodePort; np != nil && np.UplinkAddr.Is4() {
		nodeSource = np.UplinkAddr
	}
	var nodeSourceBE uint32
	if nodeSource.Is4() {
		nodeSourceBE = be32(nodeSource)
	}
	if err := s.sockAddr.Variables[sockaddrVarNODE_SOURCE_IP4].Set(nodeSourceBE); err != nil {
		return fmt.Errorf("setting the socket hooks' load-time NODE_SOURCE_IP4: %w", err)
	}
	if err := s.sockAddr.Variables[sockaddrVarNO_SET_RETVAL].Set(noSetRetval); err != nil {
		return fmt.Errorf("setting the socket hooks' load-time NO_SET_RETVAL: %w", err)
	}
	for _, o := range []struct {
		spec *ebpf.CollectionSpec
		into any
	}{
		{s.sockAddr, &d.sockAddr}, {s.sockOps, &d.sockOps}, {s.skMsg, &d.skMsg}, {s.sockopt, &d.sockopt},
	} {
		if err := d.loadBeside(o.spec, opts, flowsSize, o.into); err != nil {
			return err
		}
	}
	return nil
}

// loadOverlay loads the overlay device's program with the pod programs'
// configuration, beside them (loadBeside): both sides of a connection see
// one conntrack table and one ipcache.
func (d *Datapath) loadOverlay(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions, cfg podtcShuntConfig, flowsSize uint32) error {
	if err := spec.Variables[overlaytcVarCONFIG].Set(sideConfig(cfg)); err != nil {
		return fmt.Errorf("setting the overlay program's load-time config: %w", err)
	}
	return d.loadBeside(spec, opts, flowsSize, &d.overlay)
}

// sideConfig is the pod programs' load-time configuration for the programs
// beside them (overlay, uplink), whose generated types are their own: the
// same C struct (struct shunt_config), so the bytes carry over whole
// (TestSideConfigIsTheSameStruct checks the two types agree field by
// field), and a field added to the struct reaches every program without
// a copy here to forget it.
func sideConfig(cfg podtcShuntConfig) overlaytcShuntConfig {
	return *(*overlaytcShuntConfig)(unsafe.Pointer(&cfg))
}

// loadBeside loads an object of programs beside the pod programs into
// into: on their maps, the pinned ones by name and, when the object emits
// flow events, the ring buffer of flowsSize bytes handed over (one ring
// buffer for every program; it is not pinned, as a restarted agent may size
// it differently).
func (d *Datapath) loadBeside(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions, flowsSize uint32, into any) error {
	o := *opts
	if flows, ok := spec.Maps["shunt_flows"]; ok {
		flows.MaxEntries = flowsSize
		o.MapReplacements = map[string]*ebpf.Map{"shunt_flows": d.objs.ShuntFlows}
	}
	if err := spec.LoadAndAssign(into, &o); err != nil {
		return explainLoadError(err, d.cfg.PinDir)
	}
	return nil
}

// replaceOldCounters unpins the counters maps checkLayouts found of another
// layout (an older shunt's), so that new ones are created, instead of
// refusing to start as for any other incompatible map: they hold counts, no
// state traffic needs, and they start again from zero. Programs still using
// an old map keep it until their links switch to the new programs.
func replaceOldCounters(pinDir string, names []string) error {
	for _, name := range names {
		if err := os.Remove(filepath.Join(pinDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("replacing %s of an older layout: %w", name, err)
		}
	}
	return nil
}

// explainLoadError turns the loader's errors into ones that say what to do.
func explainLoadError(err error, pinDir string) error {
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		return fmt.Errorf("the kernel verifier rejected a shunt program (verifier log tail below):\n%+v", verr)
	}
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("a map pinned under %s was created by an incompatible shunt version: %w; "+
			"run `shunt uninstall` to remove the old datapath, then start again", pinDir, err)
	}
	return fmt.Errorf("loading BPF objects: %w", err)
}

// Close releases this process's handles. Pinned maps and links stay, so the
// datapath keeps forwarding while no agent runs.
func (d *Datapath) Close() error {
	closeResized(d.resized)
	d.resized = nil
	if d.stats != nil {
		d.stats.Close()
		d.stats = nil
	}
	return errors.Join(d.destroyer.close(), d.objs.Close(), d.overlay.Close(), d.uplink.Close(),
		d.sockAddr.Close(), d.sockOps.Close(), d.skMsg.Close(), d.sockopt.Close())
}

// podHooks are the programs on a pod's host-side veth: from-pod at ingress
// (what the pod sends), to-pod at egress (what the host delivers to it).
type podHook struct {
	name   string
	prog   *ebpf.Program
	attach ebpf.AttachType
}

func (d *Datapath) podHooks() []podHook {
	return []podHook{
		{"from-pod", d.objs.ShuntFromPod, ebpf.AttachTCXIngress},
		{"to-pod", d.objs.ShuntToPod, ebpf.AttachTCXEgress},
	}
}

func (d *Datapath) linkPin(hook, ifname string) string {
	return filepath.Join(d.cfg.PinDir, "links", hook+"-"+ifname)
}

// AttachPod attaches the pod programs at tc ingress and egress of a pod's
// host-side veth (attachTC: tcx links, pinned, or with the tc fallback
// cls_bpf filters). An existing attachment on the same interface is adopted
// and atomically switched to this agent's program, so a restart never
// leaves the interface without a program.
func (d *Datapath) AttachPod(ifname string, ifindex int) error {
	if !d.cfg.Mode.UsesBPF() {
		return nil
	}
	for _, h := range d.podHooks() {
		if err := d.attachTC(h.name, ifname, ifindex, h.prog, h.attach); err != nil {
			return err
		}
	}
	return nil
}

// attachPinned makes the link pinned at pin run prog. A pinned link that
// still attaches where it should (valid) is adopted and switched to prog
// atomically, so a restarted agent never leaves a hook without a program;
// a stale one is unpinned; otherwise attach creates the link, which is pinned.
func attachPinned(pin string, prog *ebpf.Program, valid func(link.Link) bool, attach func() (link.Link, error)) error {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer l.Close()
		if valid(l) {
			if err := l.Update(prog); err != nil {
				return fmt.Errorf("switching pinned link %s to the new program: %w", pin, err)
			}
			return nil
		}
		l.Unpin()
	}
	l, err := attach()
	if err != nil {
		return err
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pinning link %s: %w", pin, err)
	}
	return nil
}

// The programs on the node's VXLAN device: from-overlay at ingress (what
// other nodes' pods send to this node, decapsulated), to-overlay at egress
// (the node's own traffic to other nodes' pods: the node proxy's carries its
// client's identity).
const (
	overlayHook   = "from-overlay"
	toOverlayHook = "to-overlay"
)

// AttachOverlay attaches the overlay programs at tc ingress and egress of
// the node's collect-metadata VXLAN device (EnsureVXLAN), adopting an
// existing attachment as AttachPod does, so a restart never leaves the device
// without a program. Call it in the network namespace the device is in.
func (d *Datapath) AttachOverlay(ifname string, ifindex int) error {
	if !d.cfg.Mode.UsesBPF() {
		return fmt.Errorf("attaching the overlay program to %s: forwarding mode %s runs no BPF program; "+
			"use %s or %s for an overlay", ifname, d.cfg.Mode, ModeRedirectPeer, ModeRedirect)
	}
	if err := d.attachTC(overlayHook, ifname, ifindex, d.overlay.ShuntFromOverlay, ebpf.AttachTCXIngress); err != nil {
		return err
	}
	return d.attachTC(toOverlayHook, ifname, ifindex, d.overlay.ShuntToOverlay, ebpf.AttachTCXEgress)
}

// DetachOverlay removes the overlay programs from the VXLAN device (a
// no-op when none).
func (d *Datapath) DetachOverlay(ifname string) error {
	return errors.Join(d.detachTC(overlayHook, ifname, ebpf.AttachTCXIngress), d.detachTC(toOverlayHook, ifname, ebpf.AttachTCXEgress))
}

// DetachPod removes the program from a pod interface (a no-op when none).
func (d *Datapath) DetachPod(ifname string) error {
	var errs []error
	for _, h := range d.podHooks() {
		errs = append(errs, d.detachTC(h.name, ifname, h.attach))
	}
	return errors.Join(errs...)
}

func unpinLink(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Not loadable as a link: remove the file anyway.
		return os.Remove(pin)
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpinning %s: %w", pin, err)
	}
	return nil
}

// Hooks counts the pinned program attachments by hook: from-pod (tc
// ingress of pod veths), to-pod (tc egress), from-overlay (tc ingress of
// the VXLAN device), to-uplink and from-uplink (masquerade), sock-connect4, ...
// With the tc fallback a tc hook's pin is its record (attachClsBPF), named
// as its link would be, so it counts alike.
func (d *Datapath) Hooks() (map[string]int, error) {
	pins, err := filepath.Glob(filepath.Join(d.cfg.PinDir, "links", "*"))
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, p := range pins {
		out[d.hookOf(filepath.Base(p))]++
	}
	return out, nil
}

// hookOf names the hook of a link's pin: the pin's name, less the
// interface of a hook on many (from-pod-IFNAME: from-pod).
func (d *Datapath) hookOf(pin string) string {
	for _, h := range d.podHooks() {
		if strings.HasPrefix(pin, h.name+"-") {
			return h.name
		}
	}
	for _, h := range []string{overlayHook, toOverlayHook, toUplinkHook, fromUplinkHook} {
		if strings.HasPrefix(pin, h+"-") {
			return h
		}
	}
	return pin
}

// Features are the kernel features this datapath uses, for status.
func (d *Datapath) Features() []string {
	f := []string{"cgroup sock_addr hooks (connect/sendmsg/recvmsg/getpeername)", "sk_storage", "LPM tries", "LRU hash (conntrack)", "ring buffer (flows)",
		"sockops + sk_msg + sockhash"}
	if d.cfg.Mode.UsesBPF() {
		if d.cfg.Fallbacks.Has(dpinfo.FallbackTC) {
			f = append([]string{"tc clsact + cls_bpf"}, f...)
		} else {
			f = append([]string{"tcx links (6.6+)"}, f...)
		}
		if d.cfg.Mode == ModeRedirectPeer {
			f = append(f, "bpf_redirect_peer")
		} else {
			f = append(f, "bpf_redirect")
		}
		if d.cfg.TunnelIfindex != 0 {
			f = append(f, "collect-metadata VXLAN (bpf_skb_set_tunnel_key)")
		}
		if d.cfg.NativeIfindex != 0 {
			f = append(f, "native routing (bpf_fib_lookup + bpf_redirect_neigh)")
		}
		if d.cfg.Masquerade != nil {
			f = append(f, "masquerade (tc programs on the uplink, BPF NAT table)")
		}
	}
	return f
}
