// Package reconciler is the node reconciler: it turns the objects of the
// cluster (from whatever source: the lab's emulated API server, a real one
// through informers) and the records of the pods that run on this node into
// datapath state. It computes services and policy with the pure compute
// packages and writes through the Datapath interface, in a coalescing run
// loop: a burst of changes becomes one sync.
//
// It never starts processes, reads process IDs or builds network
// namespaces: pods are plumbed by the lab's kubelet or a CNI plugin, which
// report each local pod's interface as a model.Endpoint.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/l7"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/proxyapi"
	"github.com/shuntnet/shunt/internal/services"
)

// Datapath is what the reconciler writes to the kernel. *datapath.Datapath
// implements it; tests use a fake that records the writes.
type Datapath interface {
	AttachPod(ifname string, ifindex int) error
	DetachPod(ifname string) error
	PolicyFits(state policy.State, endpoints int) error
	SyncPolicy(state policy.State, endpoints []datapath.Endpoint) error
	// SyncTunnelRoutes routes the node's own traffic for other nodes'
	// pods through the overlay or the underlay, from src (a no-op without
	// either); with native routing it returns the routes whose node is
	// not a next hop this node reaches directly, and installs the others.
	SyncTunnelRoutes(src netip.Addr, routes []datapath.TunnelRoute) (unreachable []datapath.TunnelRoute, err error)
	// SyncDSRNodes sets the other nodes' underlay addresses, the only
	// outer sources DSR packets are taken from (a no-op without DSR).
	SyncDSRNodes(addrs []netip.Addr) error
	SyncServices(all []services.Port) (goneUDP []netip.AddrPort, err error)
	UpdateServices(upsert []services.Port, remove []services.Frontend) (goneUDP []netip.AddrPort, err error)
	DestroyUDPSockets(netnsPaths []string, gone []netip.AddrPort) (destroyed int, err error)
	SyncL7Redirects(want []datapath.L7Redirect) error
	AttachProxy(name, cgroupPath string) error
	DetachProxy(name string) error
}

// IdentityResolver gives identity keys their cluster-wide numbers
// (internal/kubeidentity).
type IdentityResolver interface {
	Resolve(ctx context.Context, keys []policy.IdentityKey) (map[string]uint32, error)
}

// Config is the node the reconciler runs for.
type Config struct {
	NodeName string // pods whose spec.nodeName is this run here
	// NodeAddrs are the node's addresses on the pod network; HostAddrs, if
	// set, lists the machine's other addresses, read at each policy
	// computation. Both are the host identity.
	NodeAddrs []netip.Addr
	HostAddrs func() ([]netip.Addr, error)
	// NodePortAddrs are the node's addresses (its primary one first);
	// NodePortAddresses selects those serving NodePorts (default: all).
	NodePortAddrs     []netip.Addr
	NodePortAddresses services.NodePortAddresses
	// ExternalByKubeProxy: the node's NodePorts, load balancer addresses
	// and externalIPs are kube-proxy's (services.Node).
	ExternalByKubeProxy bool
	// Allocations are the identity, CIDR and rule numbers handed out
	// before (persisted by the caller), so they survive restarts.
	Allocations policy.Allocations
	// Identities numbers pod identities cluster-wide (every node must give
	// the same pods the same number); nil: this node numbers them itself.
	// A sync whose identities cannot be resolved fails, and the previous
	// policy stays in force until a retry succeeds.
	Identities IdentityResolver
	// MinSyncInterval spaces syncs; 0 syncs as soon as a change arrives
	// (changes that arrive during a sync still coalesce into one).
	MinSyncInterval time.Duration
	// RetryAfter is when a failed sync is tried again without a new change.
	RetryAfter time.Duration
	Log        *slog.Logger
	// SaveAllocations persists the policy numbers when a sync changed
	// them; nil to keep them in memory only.
	SaveAllocations func(policy.Allocations) error
	// ProxyAddr is where the node proxy listens: the socket hooks send the
	// connections that need L7 there. Invalid: no proxy, nothing is
	// redirected.
	ProxyAddr netip.AddrPort
	// NativeRouting: other nodes' pods are routed to without the overlay.
	// The client's node then leaves other nodes' pods' ports with HTTP
	// rules alone (l7.Input.NativeRouting): the server's node gives the
	// client's own connection to its proxy in tc (bpf/lib/steer.h), where
	// the client's address names it. Its proxy still judges by their
	// rules the requests it sends there itself (a route, a service with a
	// local L7 backend): its SYN carries the client's identity in a TCP
	// option (bpf/lib/carried_identity.h), and that node does not steer it.
	NativeRouting bool
	// ProxyConfig receives every new proxy configuration (without version,
	// listener and mark); it must not block. nil: none is sent. A
	// configuration computed before the first Update has Complete false.
	ProxyConfig func(proxyapi.Config)
	// SteerRouting, when set, is told whether connections go to the node
	// proxy: true before redirections to it are written, false after the
	// last one was removed. The routing that delivers the connections tc
	// steers to the proxy is held only meanwhile (internal/steerroute).
	SteerRouting func(needed bool) error
	// Hooks for metrics; nil to ignore.
	ObserveSync  func(step string, d time.Duration)
	UDPDestroyed func(n int)
	// WaitForObjects: no sync runs before the first Update. A restarted
	// agent finds the datapath its predecessor programmed; until the
	// source has delivered the objects, the desired state is unknown, and
	// a sync of the empty store would withdraw every service and policy
	// (new connections time out until the objects arrive).
	WaitForObjects bool
}

// Reconciler is one node's reconciler.
type Reconciler struct {
	cfg Config
	dp  Datapath
	run *runner

	mu   sync.Mutex // guards everything below up to results
	cond *sync.Cond // signalled when a sync ends
	// Inputs, as the last Update/SetEndpoint left them.
	store     *model.Store
	endpoints map[string]model.Endpoint // local pods by namespace/name
	gen       uint64                    // bumped by every input change
	// What the next sync must do.
	svc          *services.Tracker
	policyDirty  bool
	l7Dirty      bool                      // routes, services or policy changed what the proxy serves
	podProxies   map[string]bool           // pods whose own proxy has SO_ORIGINAL_DST attached (used by sync only)
	attach       map[string]model.Endpoint // interfaces to attach (by pod)
	detach       map[string]string         // interfaces to detach (by pod)
	checked      *checkedPolicy
	synced       uint64             // the generation the last sync covered
	syncErr      error              // and how it ended
	policyErr    error              // why the last policy sync failed (nil: it did not)
	unreachable  []policy.NodeRoute // other nodes native routing cannot reach from here (setUnreachable)
	alloc        policy.Allocations
	servicesSeen bool // a full service sync has succeeded
	haveObjects  bool // an Update came (see Config.WaitForObjects)

	// Results, published after each sync for readers (API, flows).
	policy atomic.Pointer[policy.Result]
	// clusterL7 is the last policy sync's policy.ClusterL7: the L7 ports
	// of other nodes' pods (nil: none).
	clusterL7 atomic.Pointer[policy.Result]
	names     atomic.Pointer[Names]
	svcNames  serviceNames
	lastSync  struct{ policy, services time.Duration }
}

// checkedPolicy is a policy computed by Admit for a store about to be
// committed: the sync that follows reuses it when nothing else changed.
type checkedPolicy struct {
	store  *model.Store
	result *policy.Result
}

// New returns a reconciler over an empty store; Run starts syncing.
func New(cfg Config, dp Datapath) *Reconciler {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = time.Second
	}
	r := &Reconciler{
		cfg: cfg, dp: dp, store: model.New(), endpoints: map[string]model.Endpoint{},
		svc: services.NewTrackerFor(services.Node{Name: cfg.NodeName, NodePortAddrs: cfg.NodePortAddrs, NodePortAddresses: cfg.NodePortAddresses, ExternalByKubeProxy: cfg.ExternalByKubeProxy}), policyDirty: true, alloc: cfg.Allocations,
		attach: map[string]model.Endpoint{}, detach: map[string]string{},
	}
	r.cond = sync.NewCond(&r.mu)
	r.run = newRunner(r.sync, cfg.MinSyncInterval, cfg.RetryAfter)
	r.names.Store(&Names{})
	return r
}

// Run syncs until ctx ends.
func (r *Reconciler) Run(ctx context.Context) {
	r.run.trigger() // the first sync adopts and repairs what the kernel holds
	r.run.loop(ctx)
}

// Update gives the reconciler the objects after a change; changes say what
// changed from the store it had. It returns the generation to Wait for.
func (r *Reconciler) Update(next *model.Store, changes []model.Change) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.svc.Touch(r.store, next, changes)
	if r.policyTouched(next, changes) {
		r.policyDirty = true
	}
	if slices.ContainsFunc(changes, func(c model.Change) bool {
		return c.Changed() && (c.Key.Kind == manifest.KindHTTPRoute || c.Key.Kind == manifest.KindGRPCRoute || c.Key.Kind == manifest.KindReferenceGrant)
	}) {
		r.l7Dirty = true
	}
	r.store = next
	r.haveObjects = true
	return r.bump()
}

// SetEndpoint records a local pod's interface (new, or changed after its
// plumbing was rebuilt).
func (r *Reconciler) SetEndpoint(ep model.Endpoint) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.endpoints[ep.Pod]; ok && reflect.DeepEqual(old, ep) {
		return r.bump()
	}
	r.endpoints[ep.Pod] = ep
	r.attach[ep.Pod] = ep
	delete(r.detach, ep.Pod)
	r.policyDirty = true
	return r.bump()
}

// RemoveEndpoint forgets a local pod's interface (the pod is gone).
func (r *Reconciler) RemoveEndpoint(pod string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ep, ok := r.endpoints[pod]; ok {
		delete(r.endpoints, pod)
		delete(r.attach, pod)
		r.detach[pod] = ep.Ifname
		r.policyDirty = true
	}
	return r.bump()
}

// EndpointCount is the number of local endpoints (pods of this node).
func (r *Reconciler) EndpointCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.endpoints)
}

func (r *Reconciler) bump() uint64 {
	r.gen++
	r.run.trigger()
	return r.gen
}

// Wait blocks until a sync has covered generation gen and returns how that
// sync ended. A failed sync is retried in the background; Wait reports the
// failure rather than waiting for a success that may need the user.
func (r *Reconciler) Wait(ctx context.Context, gen uint64) error {
	stop := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.synced < gen {
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for the datapath: %w", ctx.Err())
		}
		r.cond.Wait()
	}
	return r.syncErr
}

// Settled says a sync covered every update given so far and succeeded:
// the datapath is what the objects say.
func (r *Reconciler) Settled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced == r.gen && r.syncErr == nil
}

// WaitCurrent blocks until a sync has covered every update given so far.
func (r *Reconciler) WaitCurrent(ctx context.Context) error {
	r.mu.Lock()
	gen := r.gen
	r.mu.Unlock()
	return r.Wait(ctx, gen)
}

// policyTouched reports whether changes can change the policy state: a
// namespace or policy changed, a pod appeared or went, or a pod changed
// what policy reads of it (labels, address, node, named ports). Status
// changes that only say a container started do not.
func (r *Reconciler) policyTouched(next *model.Store, changes []model.Change) bool {
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		switch c.Key.Kind {
		case manifest.KindNamespace, manifest.KindNetworkPolicy, manifest.KindShuntNetworkPolicy:
			return true
		case manifest.KindNode:
			// A Node's address is the tunnel endpoint of its pods' ipcache
			// entries, its pod CIDR routed through the overlay; its status
			// changes for many other reasons.
			before, _ := r.store.Get(c.Key)
			after, _ := next.Get(c.Key)
			if nodeView(before) != nodeView(after) {
				return true
			}
		case manifest.KindPod:
			before, ok1 := r.store.Pod(c.Key.Namespace, c.Key.Name)
			after, ok2 := next.Pod(c.Key.Namespace, c.Key.Name)
			if ok1 != ok2 || !ok1 || !samePolicyView(before, after) {
				return true
			}
		}
	}
	return false
}

func samePolicyView(a, b *corev1.Pod) bool {
	return a.Status.PodIP == b.Status.PodIP && a.Spec.NodeName == b.Spec.NodeName &&
		maps.Equal(a.Labels, b.Labels) && reflect.DeepEqual(a.Spec.Containers, b.Spec.Containers)
}

// policyInput describes store for policy; with placeholders, local pods
// that have no address yet get a distinct made-up one, so that counting
// the entries of a change (Admit) includes the pods it creates.
//
// A local pod whose object does not carry its address yet takes the one
// its endpoint record (the CNI ADD) reported: a kubelet writes status.podIP
// only after the runtime's ADD returned, and the ADD returns only once the
// pod is programmed, policy included.
func (r *Reconciler) policyInput(store *model.Store, placeholders bool, endpoints []model.Endpoint) (policy.Input, error) {
	in := policy.Input{
		Namespaces: store.Namespaces(), NetworkPolicies: store.NetworkPolicies(), ShuntPolicies: store.ShuntPolicies(),
		HostAddrs: slices.Clone(r.cfg.NodeAddrs), Nodes: store.Nodes(), Node: r.cfg.NodeName,
	}
	if r.cfg.HostAddrs != nil {
		hosts, err := r.cfg.HostAddrs()
		if err != nil {
			return policy.Input{}, fmt.Errorf("listing the node's addresses: %w", err)
		}
		in.HostAddrs = append(in.HostAddrs, hosts...)
	}
	placeholder := netip.MustParseAddr("240.0.0.0") // reserved: never a pod's
	reported := make(map[string]netip.Addr, len(endpoints))
	for _, ep := range endpoints {
		reported[ep.Pod] = ep.IP
	}
	for _, p := range store.Pods() {
		if p.Spec.HostNetwork {
			continue // the node's address, the host identity: not a pod's
		}
		pod := policy.Pod{Pod: p, Local: p.Spec.NodeName == r.cfg.NodeName}
		if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			pod.IP = ip
		} else if ip, ok := reported[p.Namespace+"/"+p.Name]; ok && pod.Local {
			pod.IP = ip
		} else if placeholders && pod.Local {
			placeholder = placeholder.Next()
			pod.IP = placeholder
		}
		in.Pods = append(in.Pods, pod)
	}
	return in, nil
}

// nodeView is what policy reads of a stored Node: its tunnel address and
// pod CIDR (zero when absent).
func nodeView(o manifest.Object) (v struct {
	tunnel  netip.Addr
	podCIDR string
}) {
	if n, ok := o.Obj.(*corev1.Node); ok {
		v.tunnel, v.podCIDR = policy.NodeTunnel(n), n.Spec.PodCIDR
	}
	return v
}

// Admit refuses a store whose policy would not fit the datapath's maps,
// before it is committed: a change is refused whole rather than half
// programmed. The computation is kept for the sync that follows.
func (r *Reconciler) Admit(next *model.Store) error {
	r.mu.Lock()
	alloc := r.alloc
	endpoints := slices.Collect(maps.Values(r.endpoints))
	r.mu.Unlock()
	in, err := r.policyInput(next, true, endpoints)
	if err != nil {
		return err
	}
	local := 0
	for _, p := range in.Pods {
		if p.Local {
			local++
		}
	}
	if alloc, err = r.clusterIdentities(in, alloc); err != nil {
		return fmt.Errorf("nothing applied: %w", err)
	}
	res := policy.Compute(in, alloc)
	if err := r.dp.PolicyFits(res.State, local); err != nil {
		return fmt.Errorf("nothing applied: %w", err)
	}
	if !slices.ContainsFunc(in.Pods, func(p policy.Pod) bool {
		return p.Local && p.IP.IsValid() && p.Pod.Status.PodIP == ""
	}) {
		r.mu.Lock()
		r.checked = &checkedPolicy{store: next, result: res}
		r.mu.Unlock()
	}
	return nil
}

// work is what one sync does, taken from the inputs under the lock.
type work struct {
	gen       uint64
	store     *model.Store
	complete  bool // store holds the source's first Update (or a later one)
	endpoints []model.Endpoint
	attach    []model.Endpoint
	detach    []string
	policy    bool
	l7        bool
	checked   *policy.Result
	services  services.Delta
	alloc     policy.Allocations
}

func (r *Reconciler) take() work {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := work{gen: r.gen, store: r.store, complete: r.haveObjects, policy: r.policyDirty, l7: r.l7Dirty, alloc: r.alloc}
	for _, key := range slices.Sorted(maps.Keys(r.endpoints)) {
		w.endpoints = append(w.endpoints, r.endpoints[key])
	}
	for _, key := range slices.Sorted(maps.Keys(r.attach)) {
		w.attach = append(w.attach, r.attach[key])
	}
	for _, key := range slices.Sorted(maps.Keys(r.detach)) {
		w.detach = append(w.detach, r.detach[key])
	}
	clear(r.attach)
	clear(r.detach)
	r.policyDirty = false
	r.l7Dirty = false
	if r.checked != nil && r.checked.store == r.store {
		w.checked = r.checked.result
	}
	r.checked = nil
	w.services = r.svc.Compute(r.store)
	return w
}

// sync makes the datapath match the inputs as they are now.
func (r *Reconciler) sync() error {
	r.mu.Lock()
	hold := r.cfg.WaitForObjects && !r.haveObjects
	r.mu.Unlock()
	if hold {
		return nil // the first Update triggers the sync, with everything given until then
	}
	w := r.take()
	var errs []error
	for _, ifname := range w.detach {
		errs = append(errs, r.dp.DetachPod(ifname))
	}
	var failedAttach []model.Endpoint
	for _, ep := range w.attach {
		if err := r.dp.AttachPod(ep.Ifname, ep.Ifindex); err != nil {
			failedAttach = append(failedAttach, ep)
			errs = append(errs, fmt.Errorf("pod %s: %w", ep.Pod, err))
		}
	}
	t0 := time.Now()
	var pol *policy.Result
	policyErr := error(nil)
	if w.policy {
		if pol, policyErr = r.syncPolicy(w); policyErr != nil {
			errs = append(errs, policyErr)
		}
	}
	policyTime := time.Since(t0)
	t1 := time.Now()
	gone, svcErr := r.syncServices(w)
	errs = append(errs, svcErr)
	servicesTime := time.Since(t1)
	r.observe("policy", policyTime)
	r.observe("services", servicesTime)
	r.closeStaleUDPSockets(w.endpoints, gone)
	l7Err := error(nil)
	if w.l7 || w.policy || !w.services.Empty() {
		l7Err = r.syncL7(w, pol)
		errs = append(errs, l7Err)
	}

	err := errors.Join(errs...)
	r.mu.Lock()
	for _, ep := range failedAttach {
		if _, ok := r.endpoints[ep.Pod]; ok {
			r.attach[ep.Pod] = ep // retried
		}
	}
	if policyErr != nil {
		r.policyDirty = true
	}
	if w.policy {
		r.policyErr = policyErr
	}
	allocChanged := false
	if pol != nil {
		allocChanged = !reflect.DeepEqual(r.alloc, pol.Alloc)
		r.alloc = pol.Alloc
		r.policy.Store(pol)
	}
	if svcErr != nil {
		r.svc.Reset()
	}
	if l7Err != nil {
		r.l7Dirty = true
	}
	r.mu.Unlock()
	// Names first: whoever waits for this sync reads them. What they name
	// (pod addresses, interfaces, identities, rules) changes only with
	// what makes policy dirty; service names follow each service write.
	if w.policy {
		r.publishNames(w)
	}
	if allocChanged && r.cfg.SaveAllocations != nil {
		if serr := r.cfg.SaveAllocations(pol.Alloc); serr != nil {
			r.cfg.Log.Error("saving policy allocations", "err", serr)
		}
	}
	r.mu.Lock()
	r.synced, r.syncErr = w.gen, err
	r.lastSync.policy, r.lastSync.services = policyTime, servicesTime
	r.cond.Broadcast()
	r.mu.Unlock()
	if err != nil {
		r.cfg.Log.Error("datapath sync failed; retrying", "err", err)
	}
	return err
}

func (r *Reconciler) observe(step string, d time.Duration) {
	if r.cfg.ObserveSync != nil {
		r.cfg.ObserveSync(step, d)
	}
}

// clusterIdentities takes the pods' identity numbers from the cluster-wide
// resolver, when there is one: Compute keeps numbers it is given.
func (r *Reconciler) clusterIdentities(in policy.Input, alloc policy.Allocations) (policy.Allocations, error) {
	if r.cfg.Identities == nil {
		return alloc, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := r.cfg.Identities.Resolve(ctx, policy.IdentityKeys(in))
	if err != nil {
		return alloc, fmt.Errorf("cluster-wide identities: %w", err)
	}
	alloc.Identities = ids
	return alloc, nil
}

// syncPolicy computes policy (or takes Admit's) and writes it with the
// local endpoints.
func (r *Reconciler) syncPolicy(w work) (*policy.Result, error) {
	pol := w.checked
	var in policy.Input // this sync's input, when it computed the policy
	if pol == nil {
		var err error
		if in, err = r.policyInput(w.store, false, w.endpoints); err != nil {
			return nil, err
		}
		alloc, err := r.clusterIdentities(in, w.alloc)
		if err != nil {
			return nil, err
		}
		pol = policy.Compute(in, alloc)
	}
	var eps []datapath.Endpoint
	for _, ep := range w.endpoints {
		p, ok := w.store.Pod(model.SplitName(ep.Pod))
		if !ok || (p.Status.PodIP != "" && p.Status.PodIP != ep.IP.String()) {
			continue // the pod is going away, or its object names another address
		}
		pe := pol.Endpoint(ep.Pod)
		eps = append(eps, datapath.Endpoint{
			IP: ep.IP, Ifindex: ep.Ifindex, PodMAC: ep.PodMAC, NodeMAC: ep.NodeMAC, Netns: ep.Netns,
			Identity: pe.Identity, IngressIsolated: len(pe.IngressIsolatedBy) > 0, EgressIsolated: len(pe.EgressIsolatedBy) > 0,
			IngressRules: pe.IngressRules, EgressRules: pe.EgressRules,
			OwnProxy: p.Annotations[l7.InboundRedirectAnnotation] != "",
		})
	}
	if err := r.dp.SyncPolicy(pol.State, eps); err != nil {
		return nil, err
	}
	if len(r.cfg.NodeAddrs) > 0 {
		routes := make([]datapath.TunnelRoute, len(pol.NodeRoutes))
		for i, nr := range pol.NodeRoutes {
			routes[i] = datapath.TunnelRoute{PodCIDR: nr.PodCIDR, Node: nr.Tunnel}
		}
		unreachable, err := r.dp.SyncTunnelRoutes(r.cfg.NodeAddrs[0], routes)
		if err != nil {
			return nil, err
		}
		r.setUnreachable(pol.NodeRoutes, unreachable)
	}
	if err := r.dp.SyncDSRNodes(pol.OtherNodes); err != nil {
		return nil, err
	}
	cluster, err := r.clusterL7For(w, pol, in, w.checked == nil)
	if err != nil {
		return nil, err
	}
	r.clusterL7.Store(cluster)
	return pol, nil
}

// clusterL7For is policy.ClusterL7 for this sync. Only with HTTP rules
// somewhere does it need the input, which it builds again (the machine's
// addresses, every pod) when Admit computed the policy (haveInput false).
func (r *Reconciler) clusterL7For(w work, pol *policy.Result, in policy.Input, haveInput bool) (*policy.Result, error) {
	if !policy.HasHTTPRules(w.store.ShuntPolicies()) {
		return nil, nil
	}
	if !haveInput {
		var err error
		if in, err = r.policyInput(w.store, false, w.endpoints); err != nil {
			return nil, err
		}
	}
	return policy.ClusterL7(in, pol.Alloc), nil
}

// syncServices writes what changed in the service table. The first sync
// after start writes (compares) the whole table, so what an earlier agent
// left is reconciled.
func (r *Reconciler) syncServices(w work) ([]netip.AddrPort, error) {
	d := w.services
	var gone []netip.AddrPort
	var err error
	switch {
	case d.Full: // Upsert holds every port
		gone, err = r.dp.SyncServices(d.Upsert)
	case !d.Empty():
		gone, err = r.dp.UpdateServices(d.Upsert, d.Remove)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r.svcNames.update(d)
	return gone, nil
}

// syncL7 computes what the node proxy serves, hands it the configuration,
// then writes the redirections (so the proxy knows a destination before
// connections to it arrive). pol is this sync's policy, nil when it did
// not change.
func (r *Reconciler) syncL7(w work, pol *policy.Result) error {
	if pol == nil {
		pol = r.policy.Load()
	}
	var ports []services.Port
	cluster := r.clusterL7.Load()
	if len(w.store.HTTPRoutes()) > 0 || len(w.store.GRPCRoutes()) > 0 || (pol != nil && len(pol.L7) > 0) || (cluster != nil && len(cluster.L7) > 0) {
		r.mu.Lock()
		ports = r.svc.Ports()
		r.mu.Unlock()
	}
	res := l7.Compute(l7.Input{Store: w.store, Ports: ports, Policy: pol, Cluster: cluster, NativeRouting: r.cfg.NativeRouting,
		Endpoints: w.endpoints, NodeAddrs: r.cfg.NodeAddrs})
	// Before the source's first Update the store is empty: a proxy that
	// kept a configuration across an agent restart must not take this one.
	res.Config.Complete = w.complete
	if r.cfg.ProxyConfig != nil {
		r.cfg.ProxyConfig(res.Config)
	}
	for _, w := range res.Warnings {
		r.cfg.Log.Warn("L7", "problem", w)
	}
	var want []datapath.L7Redirect
	if r.cfg.ProxyAddr.IsValid() {
		for _, d := range res.Redirects {
			want = append(want, datapath.L7Redirect{Dest: d, Proxy: r.cfg.ProxyAddr})
		}
	}
	toNodeProxy := len(want) > 0
	if toNodeProxy && r.cfg.SteerRouting != nil {
		if err := r.cfg.SteerRouting(true); err != nil {
			return fmt.Errorf("L7 redirects: %w", err)
		}
	}
	// Pods' own proxies: SO_ORIGINAL_DST is answered in their cgroup
	// before connections are sent there.
	var errs []error
	cgroups := map[string]string{}
	for _, ep := range w.endpoints {
		cgroups[ep.Pod] = ep.Cgroup
	}
	podProxies := map[string]bool{}
	for _, pp := range res.PodProxies {
		if err := r.dp.AttachProxy(podProxyLink(pp.Pod), cgroups[pp.Pod]); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", pp.Pod, err))
			continue
		}
		podProxies[pp.Pod] = true
		for _, rd := range pp.Redirects {
			want = append(want, datapath.L7Redirect{Dest: rd.From, Proxy: rd.To})
		}
	}
	if err := r.dp.SyncL7Redirects(want); err != nil {
		return fmt.Errorf("L7 redirects: %w", err)
	}
	if !toNodeProxy && r.cfg.SteerRouting != nil {
		errs = append(errs, r.cfg.SteerRouting(false))
	}
	for pod := range r.podProxies {
		if !podProxies[pod] {
			errs = append(errs, r.dp.DetachProxy(podProxyLink(pod)))
		}
	}
	r.podProxies = podProxies
	return errors.Join(errs...)
}

// podProxyLink names the pinned getsockopt link of a pod's own proxy.
func podProxyLink(pod string) string { return "pod-" + strings.ReplaceAll(pod, "/", "_") }

// closeStaleUDPSockets destroys the connected UDP sockets, on the node and
// in every local pod, that a service sent to a backend no service has any
// more: they would keep sending into the void (a DNS pod replaced, say).
// The application sees ECONNABORTED and connects again, through the
// service. Failing here does not fail the sync; it is logged.
func (r *Reconciler) closeStaleUDPSockets(endpoints []model.Endpoint, gone []netip.AddrPort) {
	if len(gone) == 0 {
		return
	}
	netns := []string{""} // the agent's own: the node's processes
	for _, ep := range endpoints {
		if ep.Netns != "" {
			netns = append(netns, ep.Netns)
		}
	}
	n, err := r.dp.DestroyUDPSockets(netns, gone)
	if r.cfg.UDPDestroyed != nil {
		r.cfg.UDPDestroyed(n)
	}
	if err != nil {
		r.cfg.Log.Warn("closing UDP sockets of removed backends", "backends", len(gone), "closed", n, "err", err)
	} else if n > 0 {
		r.cfg.Log.Info("closed UDP sockets of removed backends", "backends", len(gone), "closed", n)
	}
}

// Policy is the policy state last written (nil before the first sync).
func (r *Reconciler) Policy() *policy.Result { return r.policy.Load() }

// Allocations are the policy numbers handed out, to persist.
func (r *Reconciler) Allocations() policy.Allocations {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.alloc
}

// ServicePorts is the service table as last computed, sorted by service.
// It is assembled on demand (dumps): a sync that changes one service of
// 10 000 does not copy the table.
func (r *Reconciler) ServicePorts() []services.Port {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.svc.Ports()
}

// ServiceCount is the number of service ports and of their backends.
func (r *Reconciler) ServiceCount() (ports, backends int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.svc.Count()
}

// PolicyError says why the policy the objects ask for is not programmed
// (a map too small, cluster identities out of reach), nil when it is; the
// previous policy stays in force meanwhile.
// setUnreachable records which of routes' nodes SyncTunnelRoutes could
// not route to (native routing, not a next hop on the underlay's
// network), logging when that set changes: the sync goes on without
// them, and the agent names each as a problem of its Node.
func (r *Reconciler) setUnreachable(routes []policy.NodeRoute, unreachable []datapath.TunnelRoute) {
	var out []policy.NodeRoute
	for _, u := range unreachable {
		for _, nr := range routes {
			if nr.PodCIDR == u.PodCIDR.Masked() && nr.Tunnel == u.Node {
				out = append(out, nr)
			}
		}
	}
	r.mu.Lock()
	changed := !slices.Equal(out, r.unreachable)
	r.unreachable = out
	r.mu.Unlock()
	if changed && len(out) > 0 {
		r.cfg.Log.Warn("native routing: other nodes not on the underlay's network get no route to their pods", "nodes", out)
	}
}

// UnreachableNodes are the other nodes native routing cannot reach from
// this node, as of the last policy sync: their pods get no route.
func (r *Reconciler) UnreachableNodes() []policy.NodeRoute {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.unreachable)
}

func (r *Reconciler) PolicyError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.policyErr
}

// Names is what names flow events and map rows, as of the last sync.
func (r *Reconciler) Names() *Names { return r.names.Load() }

// SyncTimes is how long the last sync spent on policy and on services.
func (r *Reconciler) SyncTimes() (policy, services time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastSync.policy, r.lastSync.services
}
