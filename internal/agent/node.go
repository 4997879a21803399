package agent

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/maglev"
	"github.com/shuntnet/shunt/internal/podnet"
)

// The second step of New: the node itself. openNode builds what the
// datapath needs in place (the node's interface and routes, cgroups, the
// tunnel device) and opens the datapath, adopting what is pinned;
// programNode attaches and configures it.

// openNode makes the node's plumbing and opens its datapath. Nothing of it
// needs closing until it returns without an error.
func (a *Agent) openNode(s *startup) error {
	cfg, state, inst := a.cfg, a.state, a.cfg.Instance
	var err error
	if s.root, err = cgroup.Root(); err != nil {
		return err
	}
	if s.alloc, err = loadAllocations(inst.StateDir(), state.Policy); err != nil {
		return err
	}
	if a.cniEndpoints, err = loadEndpoints(inst.StateDir()); err != nil {
		return err
	}
	a.started = time.Now().UTC()
	node := podnet.Node{
		Bridge: state.Mode == datapath.ModeBridge, PodCIDR: a.podPool.CIDR,
		NodeIP: a.podPool.NodeIP(), HostIf: inst.NodeIf(), ServiceCIDR: a.svcPool.CIDR,
	}
	if err := podnet.SetupNode(node); err != nil {
		return err
	}
	if err := cgroup.Create(filepath.Join(inst.CgroupDir(s.root), "pods")); err != nil {
		return err
	}
	s.proxyCgroup = filepath.Join(inst.CgroupDir(s.root), "proxy")
	if err := cgroup.Create(s.proxyCgroup); err != nil {
		return err
	}
	if s.tunnelIf, err = ensureTunnel(cfg, state.Mode); err != nil {
		return err
	}
	if s.nativeIf, err = nativeUnderlay(cfg, state.Mode); err != nil {
		return err
	}
	if s.tunnelUnderlay, err = tunnelUnderlay(cfg); err != nil {
		return err
	}
	mark := DefaultProxyMark
	a.dp, err = datapath.Open(datapath.Config{PinDir: inst.PinDir(), Mode: state.Mode, FlowBufferBytes: cfg.FlowBufferBytes,
		ProxyMark: datapath.ProxyMark{Magic: mark.Magic, Mask: mark.Mask}, ProxySteer: proxySteer(a.podPool.NodeIP()), TunnelIfindex: s.tunnelIf, TunnelEndpoint: tunnelEndpoint(cfg), TunnelUnderlayIfindex: s.tunnelUnderlay, NativeIfindex: s.nativeIf, Masquerade: s.masq,
		NodePort: s.nodePort, MaglevSize: maglevSize(cfg.MaglevTableSize),
		NodeIP: a.podPool.NodeIP(), LayoutFile: inst.MapLayoutFile(), ConntrackSingleTable: cfg.ConntrackSingleTable, ConntrackMax: cfg.ConntrackMax,
		OverlayDecapInDevice: cfg.OverlayDecapInDevice,
		Fallbacks:            s.fallbacks})
	if err != nil {
		return err
	}
	notes, warnings := a.dp.LayoutNotes()
	for _, n := range notes {
		a.log.Info("pinned maps", "layout", n)
	}
	for _, w := range warnings {
		a.log.Warn("pinned maps", "layout", w)
	}
	for _, n := range a.dp.ResizeNotes() {
		a.log.Info("pinned maps", "resized", n)
	}
	return nil
}

// programNode attaches the datapath's programs and sets it up: flows,
// metrics, routing to other nodes, masquerade, the socket hooks and the
// node proxy.
func (a *Agent) programNode(s *startup) error {
	cfg := &a.cfg
	if cfg.FlowHistory <= 0 {
		cfg.FlowHistory = 8192
	}
	a.flows = flows.NewHistory(cfg.FlowHistory)
	if err := a.dp.SetFlowMode(cfg.FlowSampling); err != nil {
		return err
	}
	if cfg.BPFStats {
		if err := a.dp.EnableProgramStats(); err != nil {
			return err
		}
	}
	a.sampling.Store(uint32(cfg.FlowSampling))
	a.metrics = newMetrics(a)
	if err := a.programRouting(s); err != nil {
		return err
	}
	// The cgroup v2 root: pods and the node's own processes reach services.
	if err := a.dp.AttachSocketLB(s.root); err != nil {
		return err
	}
	if err := a.dp.AttachSocketAccel(); err != nil {
		return err
	}
	if k, err := datapath.ProbeAccelKernel(); err != nil {
		// Unknown is treated as absent: refused unless overridden.
		a.accelCaveat = err.Error()
		a.accelUnsafe = fmt.Sprintf("cannot tell whether this kernel gives accelerated sockets backpressure (%v)", err)
	} else {
		if caveats := k.Caveats(); len(caveats) > 0 {
			a.accelCaveat = "on this kernel " + strings.Join(caveats, "; ")
		}
		a.accelUnsafe = k.NoBackpressure()
	}
	accel, refused := accelAtStart(*cfg, a.accelUnsafe)
	if refused != "" {
		a.log.Error("socket acceleration stays off", "reason", refused)
		a.accelRefused.Store(refused)
	} else if accel.On && a.accelCaveat != "" {
		a.log.Warn("socket acceleration", "caveat", a.accelCaveat)
	}
	if err := a.dp.SetAccel(accel); err != nil {
		return err
	}
	// SO_ORIGINAL_DST is answered only to the node proxy's cgroup.
	if err := a.dp.AttachProxy("node", s.proxyCgroup); err != nil {
		return err
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = DefaultProxyPort
	}
	s.proxyAddr = netip.AddrPortFrom(a.podPool.NodeIP(), uint16(cfg.ProxyPort))
	a.proxy = newNodeProxy(a.log, filepath.Join(cfg.BinDir, "shunt-proxy"), cfg.Instance.RunDir(), s.proxyCgroup, s.proxyAddr, DefaultProxyMark, a.addProxyFlow)
	// Connections from off the node to local pods' ports with HTTP rules
	// reach the proxy in tc (bpf/lib/steer.h), through its transparent
	// listener and the routing that delivers them to the node's stack,
	// claimed while some port's connections go to the proxy (steer.go).
	steer := proxySteer(a.podPool.NodeIP())
	a.steer = &steerRouting{routing: steer.Routing}
	a.proxy.steer = steer.Listen
	a.metrics.proxy = a.proxy
	return nil
}

// programRouting attaches the overlay or native routing and the
// masquerade, and sizes pod interfaces for them.
func (a *Agent) programRouting(s *startup) error {
	cfg := a.cfg
	if s.tunnelIf != 0 {
		if err := a.dp.AttachOverlay(cfg.Instance.TunnelIf(), s.tunnelIf); err != nil {
			return err
		}
		// Pods' packets to other nodes get the encapsulation added: their
		// interfaces leave room for it, so nothing is fragmented.
		mtu, err := datapath.UnderlayMTU(cfg.Underlay)
		if err != nil {
			return err
		}
		if a.podMTU = mtu - datapath.VXLANOverhead; a.podMTU < 576 {
			return fmt.Errorf("--tunnel %s: the underlay interface's MTU %d leaves pods %d bytes, less than the 576 bytes every IPv4 host must accept: raise the underlay MTU",
				cfg.Tunnel, mtu, a.podMTU)
		}
	}
	var err error
	if s.nativeIf != 0 {
		// Pods' packets leave the underlay as they are: pods get its MTU.
		if a.podMTU, err = datapath.UnderlayMTU(cfg.Underlay); err != nil {
			return err
		}
	}
	if s.masq != nil || s.nativeIf != 0 || s.nodePort != nil {
		// One program per hook: masquerade, native routing's receiving
		// end and NodePort share the uplink's.
		if a.uplink, err = a.attachUplink(); err != nil {
			return err
		}
	}
	if s.nodePort != nil {
		if err := enableUplinkForwarding(a.uplink, "NodePort"); err != nil {
			return err
		}
		if a.nodePortMode = s.nodePort.Mode; a.nodePortMode == "" {
			a.nodePortMode = dpinfo.NodePortSNAT
		}
	}
	if s.masq != nil {
		return a.startMasquerade(a.podPool, a.svcPool)
	}
	return nil
}

// ensureTunnel makes the node's overlay device when one is asked for and
// returns its ifindex (0: none). The pod programs read it at load time, so
// it exists before the datapath opens.
func ensureTunnel(cfg Config, mode datapath.Mode) (int, error) {
	switch cfg.Tunnel {
	case "":
		return 0, nil
	case TunnelVXLAN:
	default:
		return 0, fmt.Errorf("--tunnel %q: use %s, or leave it out for none", cfg.Tunnel, TunnelVXLAN)
	}
	if !mode.UsesBPF() {
		return 0, fmt.Errorf("--tunnel %s needs a BPF forwarding mode (%s or %s), not %s: the tc programs encapsulate", cfg.Tunnel,
			datapath.ModeRedirectPeer, datapath.ModeRedirect, mode)
	}
	if !cfg.Underlay.IsValid() {
		return 0, fmt.Errorf("--tunnel %s: give --underlay-addr, this node's address other nodes reach it at", cfg.Tunnel)
	}
	return datapath.EnsureVXLAN(cfg.Instance.TunnelIf(), cfg.Underlay, VXLANPort)
}

// tunnelEndpoint is where other nodes' VXLAN packets reach this node
// (the zero value without the overlay): ensureTunnel's address and port,
// on a node it let start.
func tunnelEndpoint(cfg Config) netip.AddrPort {
	if cfg.Tunnel != TunnelVXLAN || !cfg.Underlay.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(cfg.Underlay, VXLANPort)
}

// tunnelUnderlay is the interface holding the overlay's endpoint, out of
// which the datapath sends what it encapsulates itself
// (datapath.Config.TunnelUnderlayIfindex); 0 without the overlay, or
// with --overlay-encap-in-device (the VXLAN device encapsulates). The
// interface forwards (enableUplinkForwarding).
func tunnelUnderlay(cfg Config) (int, error) {
	ep := tunnelEndpoint(cfg)
	if !ep.IsValid() || cfg.OverlayEncapInDevice {
		return 0, nil
	}
	name, ifindex, err := datapath.UplinkOf(ep.Addr())
	if err != nil {
		return 0, fmt.Errorf("the overlay's underlay interface (--underlay %s): %w", ep.Addr(), err)
	}
	return ifindex, enableUplinkForwarding(name, "the overlay's encapsulation in BPF")
}

// maglevSize is the datapath's Maglev table size for the agent's setting
// (Config.MaglevTableSize).
func maglevSize(configured int) int {
	switch {
	case configured == 0:
		return maglev.DefaultSize
	case configured < 0:
		return 0
	}
	return configured
}

// accelAtStart is the acceleration the agent starts with: what cfg asks,
// unless the kernel cannot hold a fast writer back (unsafe says why) and
// cfg does not accept that. Then acceleration stays off, refused says why
// and what turns it on: issue 31 wants a writer to block, never to get
// ENOMEM, and every connection keeps the normal path. The node runs
// either way, so a DaemonSet over nodes of mixed kernels does not fail on
// the older ones.
func accelAtStart(cfg Config, unsafe string) (accel datapath.AccelConfig, refused string) {
	accel = datapath.AccelConfig{On: cfg.SocketAccel, NodeProcesses: cfg.AccelNode}
	if accelRefusedHere(accel.On, unsafe, cfg.AccelWithoutBackpressure) {
		return datapath.AccelConfig{}, unsafe + "; shuntd --accelerate-without-backpressure turns it on anyway"
	}
	return accel, ""
}

// accelRefusedHere says whether acceleration asked for (on) is refused:
// the kernel cannot hold a fast writer back (unsafe says why, "" where it
// can) and nobody accepted ENOMEM (accepted). At start and at `shunt accel
// on` alike.
func accelRefusedHere(on bool, unsafe string, accepted bool) bool {
	return on && unsafe != "" && !accepted
}
