// Package agent is the node agent (shuntd): it keeps the desired state from
// its sources, builds pods in the lab, computes datapath contents and hands
// them to internal/datapath, and serves the CLI over a Unix socket.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/podexec"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/policy"
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

	FlowSampling    datapath.FlowMode // what the datapath reports
	FlowHistory     int               // flows kept in memory (default 8192)
	FlowBufferBytes int               // size of the flow ring buffer (0: 4 MiB)
	MetricsAddr     string            // also serve /metrics over TCP here ("": only on the socket)
}

// Agent is one running shuntd.
type Agent struct {
	cfg        Config
	log        *slog.Logger
	cgroupRoot string
	pool       ipam.Pool // pod addresses
	svcPool    ipam.Pool // ClusterIPs
	node       podnet.Node
	dp         *datapath.Datapath

	mu    sync.Mutex // guards state and store; held for a whole apply
	state *State
	store *model.Store

	// objects persists the desired objects; unsaved are the keys changed
	// since they were last written.
	objects objectLog
	unsaved map[string]bool
	// savedState is state.json as last written: unchanged, it is not
	// written again.
	savedState []byte
	// lastSync is how long the last reconcile spent on each step (logged).
	lastSync struct{ policy, services, persist time.Duration }
	// podsDirty: pods, namespaces or policies changed since pods and
	// policy were last reconciled (true at start: everything is checked).
	podsDirty bool
	// policy is the policy state last written to the datapath.
	policy *policy.Result
	// checkedPolicy was computed for checkedStore by the capacity check of
	// the change being committed.
	checkedPolicy *policy.Result
	checkedStore  *model.Store

	// clusterIPs indexes the ClusterIPs the services hold.
	clusterIPs clusterIPs
	// svcCache holds each service's computed ports; svcDirty names the
	// services (namespace/name) to compute again, so a change to one
	// service of 10 000 computes and writes one.
	svcCache       map[string]*serviceEntry
	svcDirty       map[string]bool
	lastReady      map[string]bool // pod readiness as services last saw it
	svcNames       serviceNames    // for flows
	servicesSynced bool

	flows    *flows.History            // the last flows, for observe
	names    atomic.Pointer[flowNames] // names for flow events
	sampling atomic.Uint32             // current datapath.FlowMode
	metrics  *metrics
	// metricsAddr is where /metrics is served over TCP, once it is.
	metricsAddr atomic.Value
	started     time.Time

	shutdown chan bool // true: uninstall before exiting
}

// New checks the machine, adopts persisted state and pinned datapath, and
// brings the node to the desired state. The caller then calls Serve.
func New(cfg Config, log *slog.Logger) (*Agent, error) {
	if err := Preflight(); err != nil {
		return nil, err
	}
	inst := cfg.Instance
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
	if err := settle(&state.PodCIDR, cfg.PodCIDR, instance.DefaultPodCIDR, "pod CIDR", inst); err != nil {
		return nil, err
	}
	if err := settle(&state.ServiceCIDR, cfg.ServiceCIDR, instance.DefaultServiceCIDR, "service CIDR", inst); err != nil {
		return nil, err
	}
	pool, err := ipam.NewPool(state.PodCIDR)
	if err != nil {
		return nil, err
	}
	svcPool, err := ipam.NewPool(state.ServiceCIDR)
	if err != nil {
		return nil, fmt.Errorf("service CIDR: %w", err)
	}
	if svcPool.CIDR.Overlaps(pool.CIDR) {
		return nil, fmt.Errorf("service CIDR %s overlaps pod CIDR %s", svcPool.CIDR, pool.CIDR)
	}
	root, err := cgroup.Root()
	if err != nil {
		return nil, err
	}
	objLog := objectLog{dir: inst.StateDir()}
	stored, err := objLog.load()
	if err != nil {
		return nil, err
	}
	// Older state.json files held the objects, or the ClusterIPs, themselves.
	legacy := len(state.Objects) > 0 || len(state.ClusterIPs) > 0
	objs, err := decodeObjects(append(state.Objects, stored...))
	if err != nil {
		return nil, fmt.Errorf("persisted state: %w", err)
	}
	for _, o := range objs {
		if s, ok := o.Obj.(*corev1.Service); ok && s.Spec.ClusterIP == "" {
			if ip := state.ClusterIPs[s.Namespace+"/"+s.Name]; ip != "" {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
			}
		}
	}
	store, err := model.NewStore(objs)
	if err != nil {
		return nil, fmt.Errorf("persisted state: %w", err)
	}
	a := &Agent{
		cfg: cfg, log: log, cgroupRoot: root, pool: pool, svcPool: svcPool, state: state, store: store,
		node: podnet.Node{
			Bridge: state.Mode == datapath.ModeBridge, PodCIDR: pool.CIDR,
			NodeIP: pool.NodeIP(), HostIf: inst.NodeIf(), ServiceCIDR: svcPool.CIDR,
		},
		shutdown:   make(chan bool, 1),
		clusterIPs: newClusterIPs(svcPool, store),
		svcCache:   map[string]*serviceEntry{},
		svcDirty:   map[string]bool{},
		lastReady:  map[string]bool{},
		podsDirty:  true,
		started:    time.Now().UTC(),
		objects:    objLog,
		unsaved:    map[string]bool{},
	}
	// Services persisted without an address (older versions) get one now.
	var unassigned []model.Change
	for _, s := range store.Services() {
		if s.Spec.ClusterIP == "" {
			unassigned = append(unassigned, model.Change{Key: "Service/" + s.Namespace + "/" + s.Name, Action: "created"})
		}
	}
	ips, err := a.clusterIPs.assign(store, store, unassigned)
	if err != nil {
		return nil, fmt.Errorf("persisted state: %w", err)
	}
	a.clusterIPs.commit(ips)
	if legacy || len(unassigned) > 0 {
		state.Objects, state.ClusterIPs = nil, nil
		if err := a.objects.snapshot(store); err != nil {
			return nil, err
		}
	}
	if err := podnet.SetupNode(a.node); err != nil {
		return nil, err
	}
	if err := cgroup.Create(filepath.Join(inst.CgroupDir(root), "pods")); err != nil {
		return nil, err
	}
	a.dp, err = datapath.Open(datapath.Config{PinDir: inst.PinDir(), Mode: state.Mode, FlowBufferBytes: cfg.FlowBufferBytes})
	if err != nil {
		return nil, err
	}
	if cfg.FlowHistory <= 0 {
		cfg.FlowHistory = 8192
	}
	a.flows = flows.NewHistory(cfg.FlowHistory)
	a.names.Store(&flowNames{})
	if err := a.dp.SetFlowMode(cfg.FlowSampling); err != nil {
		a.dp.Close()
		return nil, err
	}
	a.sampling.Store(uint32(cfg.FlowSampling))
	a.metrics = newMetrics(a)
	// The cgroup v2 root: pods and the node's own processes reach services.
	if err := a.dp.AttachSocketLB(root); err != nil {
		a.dp.Close()
		return nil, err
	}
	log.Info("datapath loaded", "mode", state.Mode, "podCIDR", pool.CIDR, "nodeIP", pool.NodeIP(),
		"serviceCIDR", svcPool.CIDR, "pins", inst.PinDir())
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.reconcile(); err != nil {
		a.dp.Close()
		return nil, err
	}
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

// Close releases the agent's handles; pinned programs and pods stay.
func (a *Agent) Close() error { return a.dp.Close() }

func podKey(ns, name string) string { return ns + "/" + name }

// reconcile makes pods, programs and maps match the store, doing only what
// the changes since the last call need: pods and policy when pods,
// namespaces or policies changed, the services marked dirty. New pods get
// their plumbing, identity and policy before their containers start, so no
// process ever runs unprotected by the policy that selects it. Called with
// mu held.
func (a *Agent) reconcile() error {
	var errs []error
	t0 := time.Now()
	if a.podsDirty {
		err := a.reconcilePods()
		a.podsDirty = err != nil // retried with the next change
		errs = append(errs, err)
	}
	a.lastSync.policy = time.Since(t0)
	// Persisting (encoding on the other CPUs) and programming the service
	// maps (system calls on this one) share nothing: after a bulk change
	// both take hundreds of milliseconds, so they run side by side.
	persisted := make(chan error, 1)
	go func() {
		start := time.Now()
		err := a.persist()
		a.lastSync.persist = time.Since(start)
		persisted <- err
	}()
	t1 := time.Now()
	errs = append(errs, a.syncServices())
	a.lastSync.services = time.Since(t1)
	errs = append(errs, <-persisted)
	a.metrics.observeSync("policy", a.lastSync.policy)
	a.metrics.observeSync("services", a.lastSync.services)
	a.metrics.observeSync("persist", a.lastSync.persist)
	return errors.Join(errs...)
}

// reconcilePods builds missing pods, removes deleted ones, writes the
// policy and starts the containers of new pods. Called with mu held.
func (a *Agent) reconcilePods() error {
	desired := map[string]*corev1.Pod{}
	for _, p := range a.store.Pods() {
		desired[podKey(p.Namespace, p.Name)] = p
	}
	var errs []error
	for key, rec := range a.state.Pods {
		if _, ok := desired[key]; !ok {
			errs = append(errs, a.deletePod(rec))
			delete(a.state.Pods, key)
		}
	}
	var built []ensured
	for _, key := range slices.Sorted(maps.Keys(desired)) {
		e, err := a.ensurePod(desired[key])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		built = append(built, e)
	}

	pol, err := a.checkedPolicy, error(nil)
	if pol == nil || a.checkedStore != a.store {
		pol, err = a.computePolicy(a.store)
	}
	a.checkedPolicy, a.checkedStore = nil, nil
	if err != nil {
		errs = append(errs, err)
	} else {
		endpoints := make([]datapath.Endpoint, len(built))
		for i, e := range built {
			endpoints[i] = e.endpoint
			ep := pol.Endpoint(podKey(e.Namespace, e.Name))
			endpoints[i].Identity = ep.Identity
			endpoints[i].IngressIsolated, endpoints[i].EgressIsolated = len(ep.IngressIsolatedBy) > 0, len(ep.EgressIsolatedBy) > 0
			endpoints[i].IngressRules, endpoints[i].EgressRules = ep.IngressRules, ep.EgressRules
		}
		if err := a.dp.SyncPolicy(pol.State, endpoints); err != nil {
			errs = append(errs, err)
		} else {
			a.policy, a.state.Policy = pol, pol.Alloc
		}
	}

	for _, e := range built {
		if !e.start {
			continue
		}
		if err := a.startContainers(desired[podKey(e.Namespace, e.Name)], e.PodRecord); err != nil {
			a.deletePod(e.PodRecord)
			delete(a.state.Pods, podKey(e.Namespace, e.Name))
			errs = append(errs, fmt.Errorf("pod %s/%s: %w", e.Namespace, e.Name, err))
			continue
		}
		a.log.Info("pod started", "pod", podKey(e.Namespace, e.Name), "ip", e.IP, "veth", e.HostIf)
	}
	ifaces := map[uint32]string{}
	for _, e := range built {
		ifaces[uint32(e.endpoint.Ifindex)] = e.HostIf
	}
	a.updateFlowNames(ifaces)
	return errors.Join(errs...)
}

// persist records the objects changed since the last persist, then
// state.json. It reads the store and state and writes only the files and
// its own bookkeeping, so it may run beside syncServices.
func (a *Agent) persist() error {
	if err := a.objects.save(a.store, slices.Sorted(maps.Keys(a.unsaved))); err != nil {
		return err
	}
	clear(a.unsaved)
	var err error
	a.savedState, err = a.state.save(a.cfg.Instance.StateDir(), a.savedState)
	return err
}

type ensured struct {
	*PodRecord
	endpoint datapath.Endpoint
	start    bool // new plumbing: its containers must be (re)started
}

// newPodRecord gives a pod its address and names; nothing is built yet.
func (a *Agent) newPodRecord(pod *corev1.Pod) (*PodRecord, error) {
	key := podKey(pod.Namespace, pod.Name)
	ip, err := a.pool.Allocate(a.addressesInUse())
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", key, err)
	}
	inst := a.cfg.Instance
	return &PodRecord{
		Namespace: pod.Namespace, Name: pod.Name, UID: newUID(), IP: ip.String(),
		Netns:   inst.PodNetns(pod.Namespace, pod.Name),
		HostIf:  inst.PodHostIf(pod.Namespace, pod.Name),
		Cgroup:  inst.PodCgroupDir(a.cgroupRoot, pod.Namespace, pod.Name),
		Created: time.Now().UTC(),
	}, nil
}

// ensurePod builds a pod's plumbing when it does not exist yet, or is gone
// (after a reboot, say); a healthy pod is left alone. Containers are
// started by the caller once the datapath knows the pod.
func (a *Agent) ensurePod(pod *corev1.Pod) (ensured, error) {
	key := podKey(pod.Namespace, pod.Name)
	rec := a.state.Pods[key]
	if rec == nil {
		var err error
		if rec, err = a.newPodRecord(pod); err != nil {
			return ensured{}, err
		}
		a.state.Pods[key] = rec
	}
	plumbing := a.podPlumbing(rec)
	links, inspectErr := podnet.Inspect(plumbing)
	if inspectErr != nil {
		var err error
		if links, err = podnet.SetupPod(a.node, plumbing); err != nil {
			return ensured{}, err
		}
		// New plumbing means new processes: old ones (if any) lost their network.
		if err := cgroup.Remove(rec.Cgroup); err != nil {
			return ensured{}, err
		}
	}
	if err := a.dp.AttachPod(rec.HostIf, links.HostIfindex); err != nil {
		return ensured{}, fmt.Errorf("pod %s: %w", key, err)
	}
	return ensured{rec, datapath.Endpoint{
		IP: netip.MustParseAddr(rec.IP), Ifindex: links.HostIfindex,
		PodMAC: links.PodMAC, NodeMAC: links.HostMAC,
	}, inspectErr != nil}, nil
}

func (a *Agent) podPlumbing(rec *PodRecord) podnet.Pod {
	return podnet.Pod{
		Netns: rec.Netns, HostIf: rec.HostIf, PodIP: netip.MustParseAddr(rec.IP),
		Alias: a.cfg.Instance.PodLinkAlias(rec.Namespace, rec.Name),
	}
}

func (a *Agent) addressesInUse() map[netip.Addr]bool {
	used := map[netip.Addr]bool{}
	for _, r := range a.state.Pods {
		used[netip.MustParseAddr(r.IP)] = true
	}
	return used
}

func newUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (a *Agent) podDir(rec *PodRecord) string {
	return filepath.Join(a.cfg.Instance.StateDir(), "pods", rec.Namespace+"_"+rec.Name)
}

// startContainers runs each container's command under a shim in the pod's
// cgroup; the shim enters the pod's network namespace for the command.
func (a *Agent) startContainers(pod *corev1.Pod, rec *PodRecord) error {
	dir := a.podDir(rec)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := cgroup.Create(rec.Cgroup); err != nil {
		return err
	}
	rec.Containers = nil
	for _, c := range pod.Spec.Containers {
		cr := ContainerRecord{
			Name: c.Name, LogFile: filepath.Join(dir, c.Name+".log"),
			ExitFile: filepath.Join(dir, c.Name+".exit"), Started: time.Now().UTC(),
		}
		logf, err := os.OpenFile(cr.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		argv := append(slices.Clone(c.Command), c.Args...)
		shim := exec.Command(a.cfg.ShimExe, append([]string{"shim", "--netns", podnet.NetnsPath(rec.Netns), "--exit-file", cr.ExitFile, "--"}, argv...)...)
		shim.Stdout, shim.Stderr = logf, logf
		shim.Dir = c.WorkingDir
		if shim.Dir == "" {
			shim.Dir = "/"
		}
		shim.Env = a.containerEnv(pod, rec, c)
		// Its own session: the container survives the agent's exit and its
		// terminal signals.
		shim.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		err = podexec.Start(podexec.Target{CgroupPath: rec.Cgroup}, shim)
		logf.Close()
		if err != nil {
			return fmt.Errorf("container %s: starting %q: %w", c.Name, argv, err)
		}
		cr.ShimPID = shim.Process.Pid
		go shim.Wait() // reap it while this agent lives; init does after
		rec.Containers = append(rec.Containers, cr)
	}
	return nil
}

func (a *Agent) containerEnv(pod *corev1.Pod, rec *PodRecord, c corev1.Container) []string {
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	if a.cfg.BinDir != "" {
		path = a.cfg.BinDir + ":" + path
	}
	env := []string{
		"PATH=" + path, "HOME=/root", "HOSTNAME=" + pod.Name,
		"SHUNT_POD_NAME=" + pod.Name, "SHUNT_POD_NAMESPACE=" + pod.Namespace, "SHUNT_POD_IP=" + rec.IP,
		"SHUNT_INSTANCE=" + a.cfg.Instance.Name,
	}
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	return env
}

// deletePod kills the pod's processes and removes its plumbing and programs.
func (a *Agent) deletePod(rec *PodRecord) error {
	errs := []error{
		cgroup.Remove(rec.Cgroup),
		a.dp.DetachPod(rec.HostIf),
		podnet.TeardownPod(a.podPlumbing(rec)),
		os.RemoveAll(a.podDir(rec)),
	}
	a.log.Info("pod deleted", "pod", podKey(rec.Namespace, rec.Name))
	return errors.Join(errs...)
}

// Apply validates and applies objects all or nothing, then reconciles.
func (a *Agent) Apply(objs []manifest.Object) ([]model.Change, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := time.Now()
	next, changes, err := a.store.Apply(objs)
	if err != nil {
		return nil, err
	}
	if err := a.checkCapacity(next); err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(changes, func(c model.Change) bool { return c.Action != "unchanged" }) {
		return changes, nil // nothing to do, nothing to write
	}
	return changes, a.commit("apply", start, next, changes, len(objs))
}

// Delete removes objects all or nothing, then reconciles.
func (a *Agent) Delete(objs []manifest.Object) ([]model.Change, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := time.Now()
	next, changes, err := a.store.Delete(objs)
	if err != nil {
		return nil, err
	}
	return changes, a.commit("delete", start, next, changes, len(objs))
}

// commit makes next the desired state: ClusterIPs and policy capacity
// first (the last checks that can refuse the change as a whole), then the
// node is reconciled. Called with mu held.
func (a *Agent) commit(op string, start time.Time, next *model.Store, changes []model.Change, objects int) error {
	ips, err := a.clusterIPs.assign(a.store, next, changes)
	if err != nil {
		return err
	}
	podsOrPolicy := slices.ContainsFunc(changes, func(c model.Change) bool {
		kind, _, _ := strings.Cut(c.Key, "/")
		return c.Action != "unchanged" && policyInput[kind]
	})
	if podsOrPolicy {
		if err := a.checkPolicyFits(next); err != nil {
			return err
		}
		a.podsDirty = true
	}
	a.clusterIPs.commit(ips)
	for _, c := range changes {
		if c.Action != "unchanged" {
			a.unsaved[c.Key] = true
			a.servicesTouched(a.store, next, c.Key)
		}
	}
	a.store = next
	checked := time.Now()
	err = a.reconcile()
	a.log.Info(op, "objects", objects, "checkMs", ms(checked.Sub(start)), "policyMs", ms(a.lastSync.policy),
		"servicesMs", ms(a.lastSync.services), "persistMs", ms(a.lastSync.persist),
		"totalMs", ms(time.Since(start)), "err", err)
	return err
}

// policyInput are the kinds pods and policy are computed from; a change
// of only services and slices leaves both alone.
var policyInput = map[string]bool{"Pod": true, "Namespace": true, "NetworkPolicy": true, "ShuntNetworkPolicy": true}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// checkCapacity refuses an apply the pod CIDR cannot hold, before anything
// is built, so an apply never stops half way for want of addresses.
func (a *Agent) checkCapacity(next *model.Store) error {
	if n := len(next.Pods()); n > a.pool.Size() {
		return fmt.Errorf("nothing applied: %d pods do not fit in pod CIDR %s (%d addresses): use a larger --pod-cidr",
			n, a.pool.CIDR, a.pool.Size())
	}
	return nil
}

// Uninstall tears down everything of this instance. Called with no apply running.
func (a *Agent) Uninstall() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	for key, rec := range a.state.Pods {
		errs = append(errs, a.deletePod(rec))
		delete(a.state.Pods, key)
	}
	a.dp.Close()
	errs = append(errs, teardown.Instance(a.cfg.Instance))
	return errors.Join(errs...)
}

// Run serves the API until ctx ends or a client asks for shutdown.
func (a *Agent) Run(ctx context.Context) error {
	srv, err := a.serveAPI()
	if err != nil {
		return err
	}
	defer srv.Close()
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
	a.log.Info("agent ready", "socket", a.cfg.Instance.Socket(), "pid", os.Getpid())
	// Containers start and exit on their own: follow their readiness into
	// the service endpoints, as the endpoint controller does.
	resync := time.NewTicker(500 * time.Millisecond)
	defer resync.Stop()
	for {
		select {
		case <-resync.C:
			a.mu.Lock()
			if a.readinessChanged() || !a.servicesSynced {
				if err := a.syncServices(); err != nil {
					a.log.Error("service sync failed", "err", err)
				}
			}
			a.mu.Unlock()
			continue
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
