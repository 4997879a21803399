// Package agent is the node agent (shuntd). It wires the parts together and
// serves the CLI over a Unix socket:
//
//	source (the lab's emulated control plane: internal/lab)
//	  -> objects (internal/model) and local endpoints
//	  -> node reconciler (internal/reconciler: compute with
//	     internal/services and internal/policy, coalescing run loop)
//	  -> datapath (internal/datapath: the only kernel-touching code)
//
// It owns no pods and no maps itself: the lab runs pods, the reconciler
// decides map contents, the datapath writes them.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/kubesource"
	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/reconciler"
	"github.com/shuntnet/shunt/internal/teardown"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Config is how shuntd was started.
type Config struct {
	Instance    instance.Instance
	Mode        datapath.Mode // empty: as persisted, else redirect-peer
	PodCIDR     string        // empty: as persisted, else instance.DefaultPodCIDR
	ServiceCIDR string        // empty: as persisted, else instance.DefaultServiceCIDR
	BinDir      string        // put first on containers' PATH (where shunt lives)
	ShimExe     string        // executable providing `shim` (shuntd itself)

	FlowSampling    datapath.FlowMode // what the datapath reports
	FlowHistory     int               // flows kept in memory (default 8192)
	FlowBufferBytes int               // size of the flow ring buffer (0: 4 MiB)
	MetricsAddr     string            // also serve /metrics over TCP here ("": only on the socket)
	ProxyPort       int               // the node proxy's port on the node address (0: DefaultProxyPort)
	SocketAccel     bool              // accelerate TCP between local sockets from the start
	AccelNode       bool              // with SocketAccel: the node's own processes too

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
	// NodeLeaseDuration (with RunPods) is the node's Lease duration, as
	// kubelet's --node-lease-duration-seconds: the Lease is renewed every
	// quarter of it. Zero: what the node last ran with, else
	// lab.DefaultNodeLeaseDuration.
	NodeLeaseDuration time.Duration

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
	// datapath.DefaultMasqPorts). The node keeps them, as its tunnel.
	Masquerade        bool
	MasqueradeExclude []netip.Prefix
	MasqueradePorts   datapath.PortRange
	// ConntrackSingleTable: the baseline conntrack of benchmarks, where new
	// connections can evict established ones (datapath.Config).
	ConntrackSingleTable bool

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
	serviceProblems serviceProblemsCache

	proxy    *nodeProxy     // the node L7 proxy
	flows    *flows.History // the last flows, for observe
	sampling atomic.Uint32  // current datapath.FlowMode
	metrics  *metrics
	// metricsAddr is where /metrics is served over TCP, once it is.
	metricsAddr atomic.Value
	started     time.Time

	podMTU       int                    // pod interfaces' MTU (0: the default, 1500)
	uplink       string                 // the interface the uplink programs are on ("": none)
	masq         *api.MasqueradeStatus  // nil: no masquerade
	labCP        *lab.ControlPlane      // serving a multi-node lab's other nodes (nil: none)
	clusterIDs   *lab.ClusterIdentities // with labCP: the lab's identity numbers
	cniEndpoints *cniEndpoints          // what shunt-cni reported
	srv          *http.Server           // the API on the instance's socket
	ready        atomic.Bool            // New finished: status answers

	stopReconciler context.CancelFunc
	shutdown       chan bool // true: uninstall before exiting
}

// New checks the machine, adopts persisted state and pinned datapath, and
// brings the node to the desired state. The caller then calls Run.
func New(cfg Config, log *slog.Logger) (*Agent, error) {
	if err := Preflight(); err != nil {
		return nil, err
	}
	inst := cfg.Instance
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
	if err := settle(&state.Mode, cfg.Mode, datapath.ModeRedirectPeer, "mode", inst); err != nil {
		return nil, err
	}
	if err := settleSource(state, &cfg); err != nil {
		return nil, err
	}
	// The routing is the node's, like its mode: a restart keeps it.
	if err := settleRouting(state, &cfg); err != nil {
		return nil, err
	}
	if err := settleMasquerade(state, &cfg); err != nil {
		return nil, err
	}
	nodeName := inst.Name
	if cfg.NodeName != "" && (cfg.Kubernetes || cfg.LabControlPlane || cfg.LabJoin != "") {
		// A lab of one node is named after its instance, whatever
		// NODE_NAME says: its pods' spec.nodeName is that name.
		nodeName = cfg.NodeName
	}
	var kube *kubeClient // the API server, loaded once (Kubernetes mode)
	if cfg.Kubernetes {
		if kube, err = newKubeClient(cfg.Kubeconfig); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		own, err := kube.ownNode(ctx, nodeName)
		cancel()
		if err != nil {
			return nil, err
		}
		cidr := own.Spec.PodCIDR
		if needsUnderlay(cfg) && !cfg.Underlay.IsValid() && state.Underlay == "" {
			// Other nodes reach this one's pods where the Node says, and
			// pods' traffic to outside leaves from there.
			if cfg.Underlay = policy.NodeTunnel(own); !cfg.Underlay.IsValid() {
				return nil, fmt.Errorf("%s: node %s has no IPv4 InternalIP or ExternalIP in status.addresses: give --underlay-addr", underlayUser(cfg), nodeName)
			}
		}
		if cfg.PodCIDR != "" && cfg.PodCIDR != cidr {
			return nil, fmt.Errorf("--pod-cidr %s, but node %s has spec.podCIDR %s: leave --pod-cidr out with --kubeconfig", cfg.PodCIDR, nodeName, cidr)
		}
		cfg.PodCIDR = cidr
	}
	if needsUnderlay(cfg) {
		var flag string
		if cfg.Underlay.IsValid() {
			flag = cfg.Underlay.String()
		}
		if err := settle(&state.Underlay, flag, "", "underlay address", inst); err != nil {
			return nil, err
		}
		if cfg.Underlay, err = netip.ParseAddr(state.Underlay); err != nil {
			return nil, fmt.Errorf("%s: give --underlay-addr, this node's address other nodes reach it at", underlayUser(cfg))
		}
	}
	if err := settle(&state.PodCIDR, cfg.PodCIDR, instance.DefaultPodCIDR, "pod CIDR", inst); err != nil {
		return nil, err
	}
	if err := settle(&state.ServiceCIDR, cfg.ServiceCIDR, instance.DefaultServiceCIDR, "service CIDR", inst); err != nil {
		return nil, err
	}
	podPool, err := ipam.NewPool(state.PodCIDR)
	if err != nil {
		return nil, err
	}
	svcPool, err := ipam.NewPool(state.ServiceCIDR)
	if err != nil {
		return nil, fmt.Errorf("service CIDR: %w", err)
	}
	if c := cfg.ClusterCIDR; c.IsValid() && (!c.Contains(podPool.CIDR.Addr()) || c.Bits() > podPool.CIDR.Bits()) {
		return nil, fmt.Errorf("--cluster-cidr %s does not hold this node's pod CIDR %s", c, podPool.CIDR)
	}
	if c := cfg.ClusterCIDR; c.IsValid() && c.Overlaps(svcPool.CIDR) {
		return nil, fmt.Errorf("--cluster-cidr %s overlaps the service CIDR %s", c, svcPool.CIDR)
	}
	if svcPool.CIDR.Overlaps(podPool.CIDR) {
		return nil, fmt.Errorf("service CIDR %s overlaps pod CIDR %s", svcPool.CIDR, podPool.CIDR)
	}
	// Refused before anything of the node is made.
	masq, err := masqueradeOf(cfg, state.Mode)
	if err != nil {
		return nil, err
	}
	var follower *lab.Follower // this node joined a multi-node lab
	if cfg.LabJoin != "" {
		// Joined first: a node the lab refuses (its pod CIDR or address
		// is another node's) is never half built.
		follower = lab.NewFollower(cfg.LabJoin, nodeName, log)
		join, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := follower.Register(join, newNodeObject(nodeName, podPool.CIDR, cfg.Underlay, time.Now().UTC()))
		cancel()
		if err != nil {
			return nil, err
		}
	}
	root, err := cgroup.Root()
	if err != nil {
		return nil, err
	}
	alloc, err := loadAllocations(inst.StateDir(), state.Policy)
	if err != nil {
		return nil, err
	}
	eps, err := loadEndpoints(inst.StateDir())
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: log, state: state, podPool: podPool, svcPool: svcPool, cniEndpoints: eps,
		shutdown: make(chan bool, 1), started: time.Now().UTC()}

	node := podnet.Node{
		Bridge: state.Mode == datapath.ModeBridge, PodCIDR: podPool.CIDR,
		NodeIP: podPool.NodeIP(), HostIf: inst.NodeIf(), ServiceCIDR: svcPool.CIDR,
	}
	if err := podnet.SetupNode(node); err != nil {
		return nil, err
	}
	if err := cgroup.Create(filepath.Join(inst.CgroupDir(root), "pods")); err != nil {
		return nil, err
	}
	proxyCgroup := filepath.Join(inst.CgroupDir(root), "proxy")
	if err := cgroup.Create(proxyCgroup); err != nil {
		return nil, err
	}
	mark := DefaultProxyMark
	tunnelIf, err := ensureTunnel(cfg, state.Mode)
	if err != nil {
		return nil, err
	}
	nativeIf, err := nativeUnderlay(cfg, state.Mode)
	if err != nil {
		return nil, err
	}
	a.dp, err = datapath.Open(datapath.Config{PinDir: inst.PinDir(), Mode: state.Mode, FlowBufferBytes: cfg.FlowBufferBytes,
		ProxyMark: datapath.ProxyMark{Magic: mark.Magic, Mask: mark.Mask}, TunnelIfindex: tunnelIf, NativeIfindex: nativeIf, Masquerade: masq,
		NodeIP: podPool.NodeIP(), LayoutFile: inst.MapLayoutFile(), ConntrackSingleTable: cfg.ConntrackSingleTable})
	if err != nil {
		return nil, err
	}
	notes, warnings := a.dp.LayoutNotes()
	for _, n := range notes {
		log.Info("pinned maps", "layout", n)
	}
	for _, w := range warnings {
		log.Warn("pinned maps", "layout", w)
	}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	if cfg.FlowHistory <= 0 {
		cfg.FlowHistory = 8192
	}
	a.flows = flows.NewHistory(cfg.FlowHistory)
	if err := a.dp.SetFlowMode(cfg.FlowSampling); err != nil {
		return nil, err
	}
	a.sampling.Store(uint32(cfg.FlowSampling))
	a.metrics = newMetrics(a)
	if tunnelIf != 0 {
		if err := a.dp.AttachOverlay(inst.TunnelIf(), tunnelIf); err != nil {
			return nil, err
		}
		// Pods' packets to other nodes get the encapsulation added: their
		// interfaces leave room for it, so nothing is fragmented.
		mtu, err := datapath.UnderlayMTU(cfg.Underlay)
		if err != nil {
			return nil, err
		}
		if a.podMTU = mtu - datapath.VXLANOverhead; a.podMTU < 576 {
			return nil, fmt.Errorf("--tunnel %s: the underlay interface's MTU %d leaves pods %d bytes, less than the 576 bytes every IPv4 host must accept: raise the underlay MTU",
				cfg.Tunnel, mtu, a.podMTU)
		}
	}
	if nativeIf != 0 {
		// Pods' packets leave the underlay as they are: pods get its MTU.
		if a.podMTU, err = datapath.UnderlayMTU(cfg.Underlay); err != nil {
			return nil, err
		}
	}
	if masq != nil || nativeIf != 0 {
		// One program per hook: masquerade and native routing's
		// receiving end share the uplink's.
		if a.uplink, err = a.attachUplink(); err != nil {
			return nil, err
		}
	}
	if masq != nil {
		if err := a.startMasquerade(podPool, svcPool); err != nil {
			return nil, err
		}
	}
	// The cgroup v2 root: pods and the node's own processes reach services.
	if err := a.dp.AttachSocketLB(root); err != nil {
		return nil, err
	}
	if err := a.dp.AttachSocketAccel(); err != nil {
		return nil, err
	}
	if err := a.dp.SetAccel(datapath.AccelConfig{On: cfg.SocketAccel, NodeProcesses: cfg.AccelNode}); err != nil {
		return nil, err
	}
	// SO_ORIGINAL_DST is answered only to the node proxy's cgroup.
	if err := a.dp.AttachProxy("node", proxyCgroup); err != nil {
		return nil, err
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = DefaultProxyPort
	}
	proxyAddr := netip.AddrPortFrom(podPool.NodeIP(), uint16(cfg.ProxyPort))
	a.proxy = newNodeProxy(log, filepath.Join(cfg.BinDir, "shunt-proxy"), inst.RunDir(), proxyCgroup, proxyAddr, mark, a.addProxyFlow)
	a.metrics.proxy = a.proxy

	ctx, cancel := context.WithCancel(context.Background())
	a.stopReconciler = cancel
	var identities reconciler.IdentityResolver
	a.nodeName = nodeName
	switch {
	case cfg.Kubernetes:
		// Every node of the cluster must number identities alike.
		ids, err := kube.startIdentities(ctx, log)
		if err != nil {
			return nil, err
		}
		identities = ids
		go a.collectIdentities(ctx, ids, 2*time.Minute)
	case cfg.LabControlPlane:
		// The numbers this node gave so far stay theirs.
		if a.clusterIDs, err = lab.NewClusterIdentities(inst.StateDir(), alloc.Identities); err != nil {
			return nil, err
		}
		identities = a.clusterIDs
	case follower != nil:
		identities = follower
	}
	a.rec = reconciler.New(reconciler.Config{
		NodeName: nodeName, NodeAddrs: []netip.Addr{podPool.NodeIP()}, HostAddrs: podnet.HostAddresses,
		Allocations: alloc, SaveAllocations: func(al policy.Allocations) error { return saveAllocations(inst.StateDir(), al) },
		Identities: identities,
		Log:        log, ObserveSync: a.metrics.observeSync, UDPDestroyed: func(n int) { a.metrics.udpDestroyed.Add(float64(n)) },
		ProxyAddr: proxyAddr, ProxyConfig: a.proxy.Set,
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
		return nil, err
	}

	var labCP *lab.ControlPlane
	switch {
	case follower != nil:
		a.src = followerSource{Follower: follower}
		a.objects = follower.Store
	case cfg.Kubernetes:
		ks, err := kubesource.New(kubesource.Config{REST: kube.rest, Resync: 10 * time.Minute, Log: log}, a.rec)
		if err != nil {
			return nil, err
		}
		a.src = kubeSource{Source: ks, server: kube.rest.Host}
		// Before anything that reads the objects starts: the problem
		// events and status writers below run at once (a nil a.objects
		// crashed one agent start in 14 of the cross-node benchmark).
		a.objects = ks.Store
		if err := ks.Run(ctx); err != nil {
			return nil, err
		}
		events, err := newProblemEvents(kube.api, nodeName, ks.Store, a.problems, log)
		if err != nil {
			return nil, err
		}
		go events.run(ctx, time.Second)
		// Status of the cluster's objects that only this agent can write:
		// its entry in each ShuntNetworkPolicy, the mesh's HTTPRoutes.
		go wait.UntilWithContext(ctx, newPolicyStatus(kube.dyn, nodeName, ks.Store, a.problems, a.rec.Settled, log).write, time.Second)
		go wait.UntilWithContext(ctx, newRouteStatus(kube.dyn, ks.Store, a.rec.Settled, log).write, time.Second)
	default:
		labCP, err = lab.New(lab.Config{
			Instance: inst, NodeName: nodeName, NodeIP: podPool.NodeIP(), PodPool: podPool, ServicePool: svcPool,
			CgroupRoot: root, BinDir: cfg.BinDir, ShimExe: cfg.ShimExe, Log: log, LegacyPods: state.Pods, NodeGrace: cfg.NodeGrace,
		}, a.rec)
		if err != nil {
			return nil, err
		}
		a.src = labSource{labCP}
		a.objects = labCP.Store
		if cfg.LabControlPlane {
			a.labCP = labCP
		}
	}
	// The API serves before the pods start: the lab's kubelet plumbs them
	// with shunt-cni, which hands each endpoint to this agent.
	if a.srv, err = a.serveAPI(); err != nil {
		return nil, fmt.Errorf("serving the API on %s: %w", inst.Socket(), err)
	}
	if cfg.Kubernetes && cfg.RunPods {
		kl, err := lab.NewAPIKubelet(lab.Config{
			Instance: inst, NodeName: nodeName, NodeIP: podPool.NodeIP(), PodPool: podPool,
			CgroupRoot: root, BinDir: cfg.BinDir, ShimExe: cfg.ShimExe, Log: log, NodeLeaseDuration: cfg.NodeLeaseDuration,
		}, kube.api, true, a.podsProgrammed)
		if err != nil {
			return nil, err
		}
		if err := kl.Run(ctx); err != nil {
			return nil, err
		}
		a.src = kubeSource{Source: a.src.(kubeSource).Source, server: kube.rest.Host, pods: kl}
	}
	if follower != nil {
		kl, err := follower.Kubelet(lab.Config{
			Instance: inst, NodeName: nodeName, NodeIP: podPool.NodeIP(), PodPool: podPool,
			CgroupRoot: root, BinDir: cfg.BinDir, ShimExe: cfg.ShimExe, Log: log,
		}, a.podsProgrammed)
		if err != nil {
			return nil, err
		}
		a.src = followerSource{Follower: follower, pods: kl}
	}
	if labCP != nil && (len(state.Objects) > 0 || len(state.ClusterIPs) > 0 || state.Pods != nil) {
		// Older versions kept objects, ClusterIPs and pods in state.json.
		if err := labCP.Migrate(state.Objects, state.ClusterIPs); err != nil {
			return nil, err
		}
		state.Objects, state.ClusterIPs, state.Pods = nil, nil, nil
	}
	if err := state.save(inst.StateDir()); err != nil {
		return nil, err
	}
	log.Info("datapath loaded", "mode", state.Mode, "podCIDR", podPool.CIDR, "nodeIP", podPool.NodeIP(),
		"serviceCIDR", svcPool.CIDR, "pins", inst.PinDir())
	startCtx, done := context.WithTimeout(context.Background(), 2*time.Minute)
	defer done()
	switch {
	case follower != nil:
		if err := follower.Run(ctx, startCtx, a.rec); err != nil {
			return nil, err
		}
		if err := a.src.(followerSource).pods.Run(ctx); err != nil {
			return nil, err
		}
	case labCP != nil:
		if err := labCP.Start(startCtx); err != nil {
			return nil, err
		}
		if cfg.LabControlPlane {
			// The control plane's own node is one of the lab's.
			if err := labCP.RegisterNode(startCtx, a.nodeObject()); err != nil {
				return nil, err
			}
			go labCP.RunNodeLifecycle(ctx)
		}
	default:
		if err := a.src.(kubeSource).WaitSynced(startCtx); err != nil {
			return nil, err
		}
	}
	// Once a sync has covered everything the source delivered, the proxy
	// configuration is complete and may replace the one the proxy kept
	// across the restart (a failed sync is retried; the proxy keeps its
	// old configuration meanwhile, which is the safer of the two).
	if err := a.rec.WaitCurrent(startCtx); err != nil {
		log.Warn("first sync after start", "err", err)
	}
	a.proxy.Synced()
	ok = true
	a.ready.Store(true)
	return a, nil
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
	fr, err := a.dp.Flows()
	if err != nil {
		return err
	}
	defer fr.Close()
	go a.readFlows(fr)
	go returnFreeMemory(ctx)
	go a.runDriftChecks(ctx)
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
