// Package agent is the node agent (shuntd). It wires the parts together and
// serves the CLI over a Unix socket:
//
//	source (the lab's emulated control plane: internal/lab; a multi-node
//	        lab's, joined; or a Kubernetes API server: internal/kubesource)
//	  -> objects (internal/model) and local endpoints
//	  -> node reconciler (internal/reconciler: compute with
//	     internal/services and internal/policy, coalescing run loop)
//	  -> datapath (internal/datapath: the only kernel-touching code)
//
// It owns no pods and no maps itself: the lab runs pods, the reconciler
// decides map contents, the datapath writes them.
//
// New starts it in steps, each in its file: settings.go settles the
// node's settings, node.go opens and programs the node, source.go chooses
// the source (chooseSource: the one place that tells lab, lab follower and
// Kubernetes apart) and carries each kind's part of the steps, and
// agent.go wires the reconciler, the source and the API, then starts.
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/reconciler"
	"github.com/shuntnet/shunt/internal/services"
	"github.com/shuntnet/shunt/internal/teardown"
)

// Config is how shuntd was started.
type Config struct {
	Instance    instance.Instance
	Mode        datapath.Mode // empty: as persisted, else redirect-peer
	PodCIDR     string        // empty: as persisted, else instance.DefaultPodCIDR
	ServiceCIDR string        // empty: as persisted, else instance.DefaultServiceCIDR
	BinDir      string        // put first on containers' PATH (where shunt lives)
	ShimExe     string        // executable providing `shim` (shuntd itself)
	Images      lab.Images    // the programs of the images the lab kubelet maps
	DNS         lab.DNS       // what the lab kubelet writes into pods' resolv.conf

	FlowSampling    datapath.FlowMode // what the datapath reports
	FlowHistory     int               // flows kept in memory (default 8192)
	FlowBufferBytes int               // size of the flow ring buffer (0: 4 MiB)
	MetricsAddr     string            // also serve /metrics over TCP here ("": only on the socket)
	// FlowsAddr also serves the node's flows (GET /v1/flows, read only)
	// over TCP, for a relay (`shunt relay`); with FlowsTLSDir by mutual TLS
	// (api.LoadTLS), without it only on loopback.
	FlowsAddr   string
	FlowsTLSDir string
	ProxyPort   int  // the node proxy's port on the node address (0: DefaultProxyPort)
	SocketAccel bool // accelerate TCP between local sockets from the start
	AccelNode   bool // with SocketAccel: the node's own processes too
	// AccelWithoutBackpressure lets acceleration on where the kernel cannot
	// hold a fast writer back (datapath.AccelKernel.Backpressure), where a
	// writer faster than its reader gets ENOMEM: refused without it.
	AccelWithoutBackpressure bool

	// Kubernetes takes objects from an API server instead of the lab:
	// Kubeconfig names it ("" is the in-cluster configuration), NodeName is
	// this node's Node object (its spec.podCIDR is the pod CIDR). Pods are
	// plumbed by the container runtime through shunt-cni.
	Kubernetes bool
	Kubeconfig string
	NodeName   string
	// RunPods (with Kubernetes): the lab plays this node's kubelet and
	// scheduler, running the API's pods in namespaces on this machine
	// (lab.APIKubelet). Off on a real node, whose kubelet runs them.
	RunPods bool
	// NoSchedule (with RunPods): leave pods that name no node to
	// kube-scheduler, which places them by their nodeSelector and
	// affinity, instead of binding them to this node.
	NoSchedule bool
	// NodeLeaseDuration (with RunPods) is the node's Lease duration, as
	// kubelet's --node-lease-duration-seconds: the Lease is renewed every
	// quarter of it. Zero: what the node last ran with, else
	// lab.DefaultNodeLeaseDuration.
	NodeLeaseDuration time.Duration
	// CrashLoopBackOff is the lab kubelet's back-off before a container's
	// second restart, doubled at each next one up to 5 min (or itself, if
	// longer). Zero: kubelet's 10 s.
	CrashLoopBackOff time.Duration

	// Routing is how pods of other nodes are reached (Cilium's
	// routingMode): RoutingTunnel through the overlay, Tunnel naming its
	// protocol ("vxlan": a collect-metadata VXLAN device); RoutingNative
	// without encapsulation, the underlay routing pod CIDRs (routes via
	// each node's underlay address, followed in tc with bpf_fib_lookup);
	// "" leaves their packets to the host stack. --tunnel vxlan alone
	// means the overlay, as before there was a choice. Underlay is this
	// node's address other nodes reach it at (with Kubernetes, default:
	// the Node's InternalIP).
	Routing  string
	Tunnel   string
	Underlay netip.Addr
	// ClusterCIDR holds every node's pod CIDR; pods route it through this
	// node (invalid: only this node's pod CIDR).
	ClusterCIDR netip.Prefix
	// Masquerade gives pods' traffic to outside the cluster the node's
	// address (Underlay), translated in BPF on the interface holding it.
	// MasqueradeExclude lists the destinations pods reach with their own
	// address (nil: the cluster CIDR, the service CIDR and the node's
	// addresses); MasqueradePorts are the source ports flows get (zero:
	// dpinfo.DefaultMasqPorts). The node keeps them, as its tunnel.
	Masquerade        bool
	MasqueradeExclude []netip.Prefix
	MasqueradePorts   datapath.PortRange
	// NodePortMode is how flows from outside reach backends on other
	// nodes: SNAT (the default, ""), DSR or hybrid (dpinfo.NodePortMode).
	NodePortMode dpinfo.NodePortMode
	// ConntrackSingleTable: the baseline conntrack of benchmarks, where new
	// connections can evict established ones (datapath.Config).
	ConntrackSingleTable bool
	// OverlayDecapInDevice: the overlay's packets are decapsulated by the
	// node's VXLAN device only, not taken off the wire in BPF
	// (datapath.Config).
	OverlayDecapInDevice bool
	// OverlayEncapInDevice: packets for other nodes' pods are
	// encapsulated by the node's VXLAN device only, not in BPF
	// (datapath.Config.TunnelUnderlayIfindex left 0).
	OverlayEncapInDevice bool
	// BPFStats turns the kernel's run-time statistics of BPF programs on
	// while the agent runs (status, metrics): tens of nanoseconds per
	// program run.
	BPFStats bool
	// ConntrackMax sizes the connection tables (datapath.Config): 0, the
	// built-in datapath.DefaultConntrackMax entries.
	ConntrackMax int

	// A lab of several nodes (`shunt lab up --nodes N`, internal/lab
	// cluster.go): LabControlPlane serves the other nodes (their Nodes,
	// objects, pod status, identities); LabJoin makes this node one of
	// them, following the control plane of the agent at that socket.
	// NodeName names the node in both. NodeGrace is how long a joining
	// node may go silent before it is NotReady (0: lab.DefaultNodeGrace).
	// The node keeps them, as its source.
	LabControlPlane bool
	LabJoin         string
	NodeGrace       time.Duration

	// DriftCheckPeriod is how often the maps the agent fully determines
	// are compared with the desired state and repaired (drift.go); 0:
	// only on demand (`shunt sync --verify`).
	DriftCheckPeriod time.Duration
	// LoadBalancerPool (with LabControlPlane) is where the lab's
	// LoadBalancer Services get their address; invalid: none.
	LoadBalancerPool netip.Prefix
	// MaglevTableSize is the size M (a prime) of the Maglev table of each
	// Service reached from outside (datapath.Config.MaglevSize): 0 is
	// maglev.DefaultSize, a negative size turns Maglev off (a random
	// backend per new flow). Every node of a cluster must use the same M
	// to pick the same backends.
	MaglevTableSize int
	// NodePortAddresses selects the node addresses NodePorts are served
	// on (--nodeport-addresses, as kube-proxy's); zero: every address of
	// the node but 127.0.0.1.
	NodePortAddresses services.NodePortAddresses
	// KernelFallbacks are older kernel paths to take although the kernel
	// has the newer feature (tests run every fallback on a new kernel);
	// the ones the kernel needs are taken anyway (datapath.ProbeKernel).
	KernelFallbacks dpinfo.Fallbacks
	// RemoveKubeProxyRules (with Kubernetes): kube-proxy's rules found on
	// the node are removed at start instead of refusing it
	// (internal/kubeproxy). kube-proxy must have stopped on this node.
	RemoveKubeProxyRules bool
	// LeaveExternalToKubeProxy (with Kubernetes; Helm
	// kubeProxyReplacement: false): shunt translates ClusterIPs (socket
	// layer and tc fallback) and hostPorts, and leaves NodePorts, load
	// balancer addresses, externalIPs and health check node ports to the
	// kube-proxy running beside it, whose rules are then expected, not
	// refused. A ClusterIP connection shunt translates at the socket
	// never meets kube-proxy's rules, so the two never translate one flow.
	LeaveExternalToKubeProxy bool
}

// Routing modes and tunnels shuntd knows.
const (
	RoutingTunnel = "tunnel"
	RoutingNative = "native"
	TunnelVXLAN   = "vxlan"
	// VXLANPort is IANA's VXLAN port; every node of a cluster must use
	// the same (the device sends to it and listens on it).
	VXLANPort = 4789
)

// Agent is one running shuntd.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	state    *State
	podPool  ipam.Pool
	svcPool  ipam.Pool
	dp       *datapath.Datapath
	rec      *reconciler.Reconciler
	src      source              // the lab's control plane, or a Kubernetes API server
	nodeName string              // this node's name (its Node object's, with Kubernetes)
	objects  func() *model.Store // the objects as they are now (the source's)
	// serviceProblems: the Services' part of problems(), per store.
	serviceProblems  serviceProblemsCache
	hostPortProblems hostPortProblemsCache
	routeProblems    routeProblemsCache

	proxy *nodeProxy // the node L7 proxy
	// steer is the node proxy's steering routing (steer.go; nil before
	// programNode).
	steer    *steerRouting
	flows    *flows.History // the last flows, for observe
	sampling atomic.Uint32  // current datapath.FlowMode
	metrics  *metrics
	// metricsAddr is where /metrics is served over TCP, once it is.
	metricsAddr atomic.Value
	started     time.Time
	kernel      dpinfo.KernelReport // the kernel's features and the fallbacks taken
	accelCaveat string              // what acceleration does differently on this kernel ("": nothing)
	// accelUnsafe is why turning acceleration on is refused here without
	// an override ("": it is not; see Config.AccelWithoutBackpressure).
	accelUnsafe string
	// accelRefused is why acceleration asked for at start is off ("": it
	// was not refused, or has been switched since).
	accelRefused atomic.Value

	podMTU       int                    // pod interfaces' MTU (0: the default, 1500)
	uplink       string                 // the interface the uplink programs are on ("": none)
	masq         *api.MasqueradeStatus  // nil: no masquerade
	nodePortMode dpinfo.NodePortMode    // how outside clients reach other nodes' backends ("": not served here)
	labCP        *lab.ControlPlane      // serving a multi-node lab's other nodes (nil: none)
	clusterIDs   *lab.ClusterIdentities // with labCP: the lab's identity numbers
	cniEndpoints *cniEndpoints          // what shunt-cni reported
	srv          *http.Server           // the API on the instance's socket
	ready        atomic.Bool            // New finished: status answers

	stopReconciler context.CancelFunc
	shutdown       chan bool // true: uninstall before exiting
}

// New checks the machine, adopts persisted state and pinned datapath, and
// brings the node to the desired state, in steps: settle the settings,
// open and program the node, wire the reconciler, the source and the API,
// then start the source. The caller then calls Run.
func New(cfg Config, log *slog.Logger) (*Agent, error) {
	a := &Agent{cfg: cfg, log: log, shutdown: make(chan bool, 1)}
	s, err := a.settleSettings()
	if err != nil {
		return nil, err
	}
	// Joined first: a node the lab refuses (its pod CIDR or address is
	// another node's) is never half built.
	if err := s.src.join(a); err != nil {
		return nil, err
	}
	if err := a.openNode(s); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	if err := a.programNode(s); err != nil {
		return nil, err
	}
	if err := a.wire(s); err != nil {
		return nil, err
	}
	if err := a.start(s); err != nil {
		return nil, err
	}
	ok = true
	a.ready.Store(true)
	return a, nil
}

// wire starts the reconciler and the node proxy, opens the source and
// serves the API.
func (a *Agent) wire(s *startup) error {
	inst := a.cfg.Instance
	ctx, cancel := context.WithCancel(context.Background())
	a.stopReconciler = cancel
	s.ctx = ctx
	identities, err := s.src.identities(ctx, a, s)
	if err != nil {
		return err
	}
	a.rec = reconciler.New(reconciler.Config{
		NodeName: a.nodeName, NodeAddrs: []netip.Addr{a.podPool.NodeIP()}, HostAddrs: podnet.HostAddresses,
		NodePortAddrs: a.nodePortAddrs(), NodePortAddresses: a.cfg.NodePortAddresses, ExternalByKubeProxy: a.cfg.LeaveExternalToKubeProxy,
		Allocations: s.alloc, SaveAllocations: func(al policy.Allocations) error { return saveAllocations(inst.StateDir(), al) },
		Identities: identities,
		Log:        a.log, ObserveSync: a.metrics.observeSync, UDPDestroyed: func(n int) { a.metrics.udpDestroyed.Add(float64(n)) },
		ProxyAddr: s.proxyAddr, ProxyConfig: a.proxy.Set, SteerRouting: a.setSteerRouting, NativeRouting: s.nativeIf != 0,
		// The source's first Update is complete: the lab hands over every
		// persisted object at once (ControlPlane.Start), the Kubernetes
		// source once its informers synced.
		WaitForObjects: true,
	}, a.dp)
	go a.rec.Run(ctx)
	go a.proxy.Run(ctx)
	// Before any source runs: the first sync (at the source's first
	// Update) must have the local pods' endpoints too, or it would take
	// their datapath away until the next one.
	if err := a.restoreEndpoints(); err != nil {
		return err
	}
	if err := s.src.open(ctx, a, s); err != nil {
		return err
	}
	// The API serves before the pods start: the lab's kubelet plumbs them
	// with shunt-cni, which hands each endpoint to this agent.
	if a.srv, err = a.serveAPI(); err != nil {
		return fmt.Errorf("serving the API on %s: %w", inst.Socket(), err)
	}
	return s.src.serving(ctx, a, s)
}

// holdSourceEnv, a duration, holds the source back that long at start: a
// test hook that widens the moment a restarted agent serves with its
// endpoints restored but no objects yet (the node proxy must keep the
// configuration it has meanwhile).
const holdSourceEnv = "SHUNT_TEST_HOLD_SOURCE"

// start saves the node's state and starts the source: its first objects
// reach the reconciler, and once a sync covered them the node proxy's
// configuration is complete.
func (a *Agent) start(s *startup) error {
	if err := a.state.save(a.cfg.Instance.StateDir()); err != nil {
		return err
	}
	a.log.Info("datapath loaded", "mode", a.state.Mode, "podCIDR", a.podPool.CIDR, "nodeIP", a.podPool.NodeIP(),
		"serviceCIDR", a.svcPool.CIDR, "pins", a.cfg.Instance.PinDir())
	startCtx, done := context.WithTimeout(context.Background(), 2*time.Minute)
	defer done()
	if hold, err := time.ParseDuration(os.Getenv(holdSourceEnv)); err == nil && hold > 0 {
		a.log.Warn("holding the source back (test hook)", "env", holdSourceEnv, "for", hold)
		time.Sleep(hold)
	}
	if err := s.src.start(s.ctx, startCtx, a); err != nil {
		return err
	}
	// Once a sync has covered everything the source delivered, the proxy
	// configuration is complete and may replace the one the proxy kept
	// across the restart (a failed sync is retried; the proxy keeps its
	// old configuration meanwhile, which is the safer of the two).
	if err := a.rec.WaitCurrent(startCtx); err != nil {
		a.log.Warn("first sync after start", "err", err)
	}
	a.proxy.Synced()
	// The first sync attached this agent's programs on every interface
	// and hook: a connection table resized at Open now takes what the
	// previous agent's programs still wrote to the old one.
	copied, err := a.dp.FinishResize()
	for name, n := range copied {
		a.log.Info("pinned maps", "resized", name, "entries written by the previous programs meanwhile", n)
	}
	if err != nil {
		a.log.Warn("carrying entries over to resized connection tables", "err", err)
	}
	return nil
}

// Close releases the agent's handles; pinned programs and pods stay.
func (a *Agent) Close() error {
	if a.srv != nil {
		a.srv.Close()
	}
	if a.stopReconciler != nil {
		a.stopReconciler()
	}
	return a.dp.Close()
}

// Uninstall tears down everything of this instance.
func (a *Agent) Uninstall() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := a.src.Uninstall(ctx)
	a.Close()
	if terr := teardown.Instance(a.cfg.Instance); terr != nil {
		return terr
	}
	return err
}

// Run serves the API until ctx ends or a client asks for shutdown.
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.MetricsAddr != "" {
		addr, msrv, err := a.metrics.serveTCP(a.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("serving metrics on %s: %w", a.cfg.MetricsAddr, err)
		}
		defer msrv.Close()
		a.metricsAddr.Store(addr.String())
		a.log.Info("serving metrics", "addr", addr.String())
	}
	if a.cfg.FlowsAddr != "" {
		srv, _, err := a.serveFlowsTCP()
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	fr, err := a.dp.Flows()
	if err != nil {
		return err
	}
	defer fr.Close()
	go a.readFlows(fr)
	go returnFreeMemory(ctx)
	go a.runDriftChecks(ctx)
	if !a.cfg.LeaveExternalToKubeProxy {
		// Else kube-proxy serves them (and holds their ports).
		go newHealthChecks(a.nodeName, a.healthCheckAddrs(), a.log.With("component", "healthcheck")).run(ctx, a.objects, 500*time.Millisecond)
	}
	a.log.Info("agent ready", "socket", a.cfg.Instance.Socket(), "pid", os.Getpid())
	var resync <-chan time.Time // nil: never
	if every := a.src.ResyncEvery(); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		resync = t.C
	}
	for {
		select {
		case <-resync:
			if err := a.src.Resync(ctx); err != nil {
				a.log.Error("pod resync failed", "err", err)
			}
		case <-ctx.Done():
			a.log.Info("stopping; pods and datapath keep running")
			return nil
		case uninstall := <-a.shutdown:
			if uninstall {
				a.log.Info("uninstalling")
				return a.Uninstall()
			}
			return nil
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
