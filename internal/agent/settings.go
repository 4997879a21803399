package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/kubeproxy"
	"github.com/shuntnet/shunt/internal/policy"
)

// The first step of New: the node's settings. What was persisted wins over
// the flags (a restarted agent runs its node as before), defaults fill
// what neither gives, and what follows from them is derived; everything is
// checked here, before anything of the node is made.

// startup carries what New's steps settle for the ones after them.
type startup struct {
	src sourceStarter // where the node's objects come from
	// the older kernel paths the datapath takes (datapath.ProbeKernel)
	fallbacks dpinfo.Fallbacks
	masq      *datapath.Masquerade // nil: no masquerade
	// nil: outside clients do not reach the node's Services (no underlay)
	nodePort *datapath.NodePort

	// openNode's
	root           string // the cgroup v2 root
	alloc          policy.Allocations
	proxyCgroup    string
	tunnelIf       int // the overlay device (0: none)
	nativeIf       int // the underlay interface of native routing (0: none)
	tunnelUnderlay int // the overlay's underlay interface, where BPF sends what it encapsulates (0: the device encapsulates)
	// programNode's
	proxyAddr netip.AddrPort
	// wire's: what runs until the agent stops
	ctx context.Context
}

// settleSettings checks the machine and settles a.cfg and a.state: the
// node's mode, source, routing, masquerade, name and addresses.
func (a *Agent) settleSettings() (*startup, error) {
	if err := Preflight(); err != nil {
		return nil, err
	}
	cfg, inst := &a.cfg, a.cfg.Instance
	// On a Kubernetes node shunt replaces kube-proxy: two translators of
	// one Service fight, so kube-proxy's live rules refuse the start,
	// unless told to remove them (the node-by-node migration).
	switch {
	case cfg.Kubernetes && cfg.LeaveExternalToKubeProxy:
		// Beside kube-proxy: its rules are expected; without them nothing
		// serves this node's NodePorts, which the log says.
		found, err := kubeproxy.Detect()
		if err != nil {
			return nil, err
		}
		if found.Live() {
			a.log.Info("kube-proxy serves NodePorts, load balancer addresses and externalIPs on this node; shunt translates ClusterIPs", "kube-proxy", found.String())
		} else {
			a.log.Warn("kube-proxy's rules are not on this node: with --kube-proxy-replacement=false nothing serves its NodePorts, load balancer addresses and externalIPs until kube-proxy runs")
		}
	case cfg.Kubernetes:
		found, err := kubeproxy.Check(cfg.RemoveKubeProxyRules)
		if err != nil {
			return nil, err
		}
		if found.Live() {
			a.log.Warn("removed kube-proxy's rules from the node", "found", found.String())
		}
	}
	// The kernel's features, before anything of the node is made: what
	// it lacks and has a fallback for is taken, what it lacks without one
	// refuses the start, named with the kernel that has it.
	fallbacks, kernel, err := datapath.ProbeKernel(cfg.KernelFallbacks)
	if err != nil {
		return nil, err
	}
	if err := datapath.CheckKernel(fallbacks); err != nil {
		return nil, err
	}
	a.kernel = kernel
	if len(kernel.Taken) > 0 {
		a.log.Info("kernel fallbacks", "kernel", kernel.Line())
	}
	// Before anything is set up: pinned maps of a layout this build would
	// read wrongly are refused with the node left exactly as it is.
	if err := datapath.CheckPinnedLayouts(inst.PinDir(), inst.MapLayoutFile()); err != nil {
		if le := (*datapath.LayoutError)(nil); errors.As(err, &le) {
			le.Uninstall = fmt.Sprintf("shunt --instance %s uninstall", inst.Name)
		}
		return nil, err
	}
	for _, d := range []string{inst.StateDir(), inst.RunDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	state, err := loadState(inst.StateDir())
	if err != nil {
		return nil, err
	}
	a.state = state
	if err := settle(&state.Mode, cfg.Mode, datapath.ModeRedirectPeer, "mode", inst); err != nil {
		return nil, err
	}
	if err := settleSource(state, cfg); err != nil {
		return nil, err
	}
	// The routing is the node's, like its mode: a restart keeps it.
	if err := settleRouting(state, cfg); err != nil {
		return nil, err
	}
	if err := settleMasquerade(state, cfg); err != nil {
		return nil, err
	}
	a.nodeName = inst.Name
	if cfg.NodeName != "" && (cfg.Kubernetes || cfg.LabControlPlane || cfg.LabJoin != "") {
		// A lab of one node is named after its instance, whatever
		// NODE_NAME says: its pods' spec.nodeName is that name.
		a.nodeName = cfg.NodeName
	}
	s := &startup{src: chooseSource(*cfg), fallbacks: fallbacks}
	// The source may know the node's pod CIDR and address (Kubernetes: its
	// Node object).
	if err := s.src.settle(a); err != nil {
		return nil, err
	}
	if err := a.settleAddresses(); err != nil {
		return nil, err
	}
	// Refused before anything of the node is made.
	if s.masq, err = masqueradeOf(*cfg, state.Mode); err != nil {
		return nil, err
	}
	if s.nodePort, err = nodePortOf(*cfg, state.Mode, a.podPool.NodeIP()); err != nil {
		return nil, err
	}
	if s.nodePort != nil && s.fallbacks.Has(dpinfo.FallbackNoGSODecap) {
		// Every node takes DSR packets, whatever its own mode.
		a.log.Warn("GSO packets arriving by DSR are dropped, counted dsr-gso-decap: taking DSR's outer header off them "+
			"needs bpf_skb_adjust_room's BPF_F_ADJ_ROOM_DECAP_L3_IPV4, Linux 6.3 or later (single packets are decapsulated)",
			"kernel", datapath.KernelRelease(), "nodeport-mode", cfg.NodePortMode)
	}
	return s, nil
}

// settleAddresses settles the node's underlay address, pod CIDR and
// service CIDR, and checks that they fit together.
func (a *Agent) settleAddresses() error {
	cfg, state, inst := &a.cfg, a.state, a.cfg.Instance
	if needsUnderlay(*cfg) {
		var flag string
		if cfg.Underlay.IsValid() {
			flag = cfg.Underlay.String()
		}
		if err := settle(&state.Underlay, flag, "", "underlay address", inst); err != nil {
			return err
		}
		var err error
		if cfg.Underlay, err = netip.ParseAddr(state.Underlay); err != nil {
			return fmt.Errorf("%s: give --underlay-addr, this node's address other nodes reach it at", underlayUser(*cfg))
		}
	}
	if err := settle(&state.PodCIDR, cfg.PodCIDR, instance.DefaultPodCIDR, "pod CIDR", inst); err != nil {
		return err
	}
	if err := settle(&state.ServiceCIDR, cfg.ServiceCIDR, instance.DefaultServiceCIDR, "service CIDR", inst); err != nil {
		return err
	}
	podPool, err := ipam.NewPool(state.PodCIDR)
	if err != nil {
		return err
	}
	svcPool, err := ipam.NewPool(state.ServiceCIDR)
	if err != nil {
		return fmt.Errorf("service CIDR: %w", err)
	}
	if c := cfg.ClusterCIDR; c.IsValid() && (!c.Contains(podPool.CIDR.Addr()) || c.Bits() > podPool.CIDR.Bits()) {
		return fmt.Errorf("--cluster-cidr %s does not hold this node's pod CIDR %s", c, podPool.CIDR)
	}
	if c := cfg.ClusterCIDR; c.IsValid() && c.Overlaps(svcPool.CIDR) {
		return fmt.Errorf("--cluster-cidr %s overlaps the service CIDR %s", c, svcPool.CIDR)
	}
	if svcPool.CIDR.Overlaps(podPool.CIDR) {
		return fmt.Errorf("service CIDR %s overlaps pod CIDR %s", svcPool.CIDR, podPool.CIDR)
	}
	a.podPool, a.svcPool = podPool, svcPool
	return nil
}

// settle picks a setting: what was persisted wins, and a flag that asks for
// something else is an error rather than a silent change of a live node.
func settle[T ~string](persisted *T, flag, def T, what string, inst instance.Instance) error {
	switch {
	case *persisted == "" && flag != "":
		*persisted = flag
	case *persisted == "":
		*persisted = def
	case flag != "" && flag != *persisted:
		return fmt.Errorf("instance %q already runs with %s %s; run `shunt --instance %s lab down` first to change it to %s",
			inst.Name, what, *persisted, inst.Name, flag)
	}
	return nil
}

// settleSource keeps where a node takes its objects from across restarts,
// as its mode: an agent of a Kubernetes node started again without
// --kubeconfig (`shunt lab up` after a crash) follows the same API server,
// instead of starting an empty lab that would remove the node's pods.
// Naming another API server or node needs `lab down` first.
func settleSource(state *State, cfg *Config) error {
	if cfg.Kubernetes && (cfg.LabControlPlane || cfg.LabJoin != "") {
		return errors.New("--kubeconfig with --lab-control-plane or --lab-join: a node takes its objects from a Kubernetes API server or from a lab, not both")
	}
	if cfg.LabControlPlane && cfg.LabJoin != "" {
		return errors.New("--lab-control-plane with --lab-join: a node either serves the lab's control plane or joins one")
	}
	was := state.Source
	lab := cfg.LabControlPlane || cfg.LabJoin != ""
	switch {
	case was == nil && cfg.Kubernetes:
		state.Source = &SourceState{Kubeconfig: cfg.Kubeconfig, NodeName: cfg.NodeName, RunPods: cfg.RunPods}
	case was == nil && lab:
		state.Source = &SourceState{NodeName: cfg.NodeName, LabControlPlane: cfg.LabControlPlane, LabJoin: cfg.LabJoin}
	case was == nil:
	case was.LabControlPlane || was.LabJoin != "":
		if cfg.Kubernetes || (lab && (cfg.LabControlPlane != was.LabControlPlane || cfg.LabJoin != was.LabJoin)) ||
			(cfg.NodeName != "" && cfg.NodeName != was.NodeName) {
			return fmt.Errorf("instance %q is node %q of a multi-node lab; run `shunt --instance %s lab down` first to make it another node",
				cfg.Instance.Name, was.NodeName, cfg.Instance.Name)
		}
		cfg.NodeName, cfg.LabControlPlane, cfg.LabJoin = was.NodeName, was.LabControlPlane, was.LabJoin
	case lab:
		return fmt.Errorf("instance %q is node %q of the API server in %s; run `shunt --instance %s lab down` first to make it a lab node",
			cfg.Instance.Name, was.NodeName, orInCluster(was.Kubeconfig), cfg.Instance.Name)
	case !cfg.Kubernetes:
		cfg.Kubernetes, cfg.Kubeconfig, cfg.NodeName, cfg.RunPods = true, was.Kubeconfig, was.NodeName, was.RunPods
	case cfg.Kubeconfig != was.Kubeconfig || (cfg.NodeName != "" && cfg.NodeName != was.NodeName):
		return fmt.Errorf("instance %q is node %q of the API server in %s; run `shunt --instance %s lab down` first to make it another node",
			cfg.Instance.Name, was.NodeName, orInCluster(was.Kubeconfig), cfg.Instance.Name)
	}
	// The heartbeat keeps its pace across restarts (a control plane whose
	// grace period was shortened for it would otherwise see the node
	// flap); a new duration given replaces it.
	if s := state.Source; s != nil {
		if cfg.NodeLeaseDuration == 0 {
			cfg.NodeLeaseDuration = time.Duration(s.NodeLeaseSeconds) * time.Second
		} else {
			s.NodeLeaseSeconds = int32(cfg.NodeLeaseDuration / time.Second)
		}
	}
	return nil
}

func orInCluster(kubeconfig string) string {
	if kubeconfig == "" {
		return "the in-cluster configuration"
	}
	return kubeconfig
}

// settleRouting reads the routing flags (--routing, --tunnel) and keeps
// the node's routing across restarts, as its mode: started again without
// them it routes as before; another routing needs `lab down` first.
func settleRouting(state *State, cfg *Config) error {
	switch cfg.Routing {
	case "":
		if cfg.Tunnel != "" {
			cfg.Routing = RoutingTunnel
		}
	case RoutingTunnel:
		if cfg.Tunnel == "" {
			cfg.Tunnel = TunnelVXLAN
		}
	case RoutingNative:
		if cfg.Tunnel != "" {
			return fmt.Errorf("--routing native with --tunnel %s: native routing has no tunnel; give one of them", cfg.Tunnel)
		}
	default:
		return fmt.Errorf("--routing %q: use %s (encapsulated, with --tunnel), %s (the underlay routes pod CIDRs), or leave it out for none",
			cfg.Routing, RoutingTunnel, RoutingNative)
	}
	if state.Routing == "" && state.Tunnel != "" {
		state.Routing = RoutingTunnel // a state file from before --routing
	}
	if err := settle(&state.Routing, cfg.Routing, "", "routing", cfg.Instance); err != nil {
		return err
	}
	if err := settle(&state.Tunnel, cfg.Tunnel, "", "tunnel", cfg.Instance); err != nil {
		return err
	}
	cfg.Routing, cfg.Tunnel = state.Routing, state.Tunnel
	return nil
}
