// Package kubesource keeps a model.Store in step with a Kubernetes API
// server through client-go shared informers and hands every change to the
// node reconciler: the second source beside the lab's emulated API server
// (docs/architecture.md). Objects go into the store as the API server holds
// them, minus the fields shunt never reads (managedFields, most of a pod's
// spec), which keeps the agent's memory proportional to what it uses.
package kubesource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/shuntnet/shunt/internal/kubeclient"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// Updater is what the source feeds: the node reconciler.
type Updater interface {
	Update(next *model.Store, changes []model.Change) uint64
}

// Config says where the API server is.
type Config struct {
	// REST is the API server's client configuration (RESTConfig loads it);
	// the source copies it before raising its rate limits.
	REST *rest.Config
	// Resync replays every object to the handlers this often (0: never).
	// The store compares objects, so a resync writes nothing unchanged.
	Resync time.Duration
	Log    *slog.Logger
}

// The custom kinds, watched through the dynamic client when the cluster
// has their CRDs (ShuntPolicyGVR: the agent also writes its status).
var (
	ShuntPolicyGVR = schema.GroupVersionResource{Group: "shunt.io", Version: "v1alpha1", Resource: "shuntnetworkpolicies"}
	HTTPRouteGVR   = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
	GRPCRouteGVR   = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "grpcroutes"}
	// ReferenceGrantGVR is watched at v1beta1, which every release of
	// its CRD serves.
	ReferenceGrantGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1beta1", Resource: "referencegrants"}
)

// Source is one connection to an API server.
type Source struct {
	cfg  Config
	rest *rest.Config
	up   Updater
	log  *slog.Logger

	mu      sync.Mutex
	store   *model.Store
	pending map[manifest.Key]*manifest.Object // nil: remove
	synced  bool                              // every informer listed once
	// delivered: the first complete listing went to the reconciler.
	delivered bool
	kick      chan struct{}

	health health
}

// RESTConfig loads a kubeconfig, or the in-cluster configuration (the
// service account of a DaemonSet pod) for "".
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration (no --kubeconfig given): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}

// New prepares a source; Run connects.
func New(cfg Config, up Updater) (*Source, error) {
	if cfg.REST == nil {
		return nil, fmt.Errorf("kubesource: no API server configuration")
	}
	rc := rest.CopyConfig(cfg.REST)
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	// Bursts of list and watch calls at start are the informers' business;
	// client-go's default of 5 QPS would slow a cold start for nothing.
	rc.QPS, rc.Burst = 50, 100
	rc.UserAgent = "shuntd"
	return &Source{cfg: cfg, rest: rc, up: up, log: cfg.Log.With("component", "kubesource"),
		store: model.New(), pending: map[manifest.Key]*manifest.Object{}, kick: make(chan struct{}, 1)}, nil
}

// Store is the objects as last handed to the reconciler.
func (s *Source) Store() *model.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store
}

// Run watches until ctx ends. It returns once the informers are started;
// WaitSynced says when the first full state reached the reconciler.
func (s *Source) Run(ctx context.Context) error {
	kc, err := kubeclient.New(s.rest)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(s.rest)
	if err != nil {
		return fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	var (
		informers []cache.SharedIndexInformer
		synced    []cache.InformerSynced
	)
	for _, t := range []struct {
		kind      kubeclient.Kind
		transform cache.TransformFunc
	}{
		{kubeclient.Namespaces, stripMeta},
		{kubeclient.Pods, slimPod},
		{kubeclient.Services, slimService},
		{kubeclient.EndpointSlices, slimEndpointSlice},
		{kubeclient.NetworkPolicies, stripMeta},
		{kubeclient.Nodes, slimNode},
	} {
		inf := kc.Informer(t.kind, s.cfg.Resync)
		if err := inf.SetTransform(t.transform); err != nil {
			return err
		}
		s.watch(inf)
		informers, synced = append(informers, inf), append(synced, inf.HasSynced)
	}
	for _, c := range []struct {
		gvr  schema.GroupVersionResource
		conv func(*unstructured.Unstructured) (runtime.Object, error)
	}{
		{ShuntPolicyGVR, convert[manifest.ShuntNetworkPolicy]},
		{HTTPRouteGVR, convert[gatewayv1.HTTPRoute]},
		{GRPCRouteGVR, convert[gatewayv1.GRPCRoute]},
		{ReferenceGrantGVR, convert[gatewayv1beta1.ReferenceGrant]},
	} {
		if served, err := kc.Serves(ctx, c.gvr); !served {
			if err != nil {
				s.log.Warn("discovery failed", "resource", c.gvr.String(), "err", err)
			}
			s.log.Warn("the API server does not serve this kind (its CRD is not installed): not watched", "resource", c.gvr.String())
			continue
		}
		inf := kubeclient.DynamicInformer(dyn, c.gvr, s.cfg.Resync)
		conv := c.conv
		if err := inf.SetTransform(func(o any) (any, error) { return unstructuredTo(o, conv) }); err != nil {
			return err
		}
		s.watch(inf)
		informers, synced = append(informers, inf), append(synced, inf.HasSynced)
	}
	for _, inf := range informers {
		go inf.RunWithContext(ctx)
	}
	go s.health.probe(ctx, kc, s.log)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return
		}
		s.mu.Lock()
		s.synced = true
		s.mu.Unlock()
		s.log.Info("informers synced")
		s.flush()
		s.loop(ctx)
	}()
	return nil
}

// WaitSynced waits until the first complete listing reached the reconciler.
func (s *Source) WaitSynced(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		done := s.synced && len(s.pending) == 0
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the API server's objects: %w (API server: %s)", ctx.Err(), s.health.String())
		case <-t.C:
		}
	}
}

// watch routes an informer's events into the pending batch.
func (s *Source) watch(inf cache.SharedIndexInformer) {
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, r *cache.Reflector, err error) {
		s.health.watchFailed(err)
		s.log.Warn("watch failed; the informer relists and the datapath keeps its state meanwhile", "err", err)
	}); err != nil {
		s.log.Warn("cannot set the watch error handler", "err", err)
	}
	put := func(o any) {
		ro, ok := o.(runtime.Object)
		if !ok {
			return
		}
		obj := manifest.Object{Source: "apiserver", Obj: ro}
		s.enqueue(obj.Key(), &obj)
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    put,
		UpdateFunc: func(_, o any) { put(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if ro, ok := o.(runtime.Object); ok {
				s.enqueue(manifest.Object{Obj: ro}.Key(), nil)
			}
		},
	})
}

func (s *Source) enqueue(key manifest.Key, o *manifest.Object) {
	s.mu.Lock()
	s.pending[key] = o
	synced := s.synced
	s.mu.Unlock()
	if synced {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// loop hands batches to the reconciler: whatever arrived while the last
// batch was applied goes as one, so a burst of events is a few updates.
func (s *Source) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			s.flush()
		}
	}
}

// flush applies the pending events to the store and gives the result to
// the reconciler.
func (s *Source) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 && s.delivered {
		return
	}
	// The first flush is delivered even empty: the reconciler syncs
	// nothing before its first Update (reconciler.Config.WaitForObjects).
	s.delivered = true
	var puts []manifest.Object
	var removes []manifest.Key
	for k, o := range s.pending {
		if o == nil {
			removes = append(removes, k)
		} else {
			puts = append(puts, *o)
		}
	}
	clear(s.pending)
	next, changes := s.store.Put(puts)
	next, removed := next.Remove(removes)
	changes = append(changes, removed...)
	s.store = next
	s.up.Update(next, changes)
}

// Health says whether the API server answers.
func (s *Source) Health() (ok bool, detail string) { return s.health.state() }

// health follows the API server: a readiness probe every few seconds, and
// the informers' watch failures.
type health struct {
	mu      sync.Mutex
	ok      bool
	since   time.Time
	lastErr error
}

func (h *health) set(ok bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ok != h.ok || h.since.IsZero() {
		h.since = time.Now()
	}
	h.ok, h.lastErr = ok, err
}

func (h *health) watchFailed(err error) { h.set(false, err) }

func (h *health) state() (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() {
		return false, "not contacted yet"
	}
	if h.ok {
		return true, "reachable since " + h.since.UTC().Format(time.RFC3339)
	}
	return false, fmt.Sprintf("unreachable since %s: %v; the datapath keeps its last state", h.since.UTC().Format(time.RFC3339), h.lastErr)
}

func (h *health) String() string { _, d := h.state(); return d }

func (h *health) probe(ctx context.Context, kc *kubeclient.Client, log *slog.Logger) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := kc.Ready(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		wasOK, _ := h.state()
		h.set(err == nil, err)
		if wasOK && err != nil {
			log.Warn("API server unreachable; the datapath keeps its last state", "err", err)
		} else if !wasOK && err == nil {
			log.Info("API server reachable")
		}
	}, 3*time.Second)
}

// stripMeta drops what no part of shunt reads and costs the most memory:
// managedFields (often larger than the object) and the last-applied
// annotation kubectl writes.
func stripMeta(o any) (any, error) {
	if m, ok := o.(metav1.Object); ok {
		m.SetManagedFields(nil)
		if a := m.GetAnnotations(); a[corev1.LastAppliedConfigAnnotation] != "" {
			delete(a, corev1.LastAppliedConfigAnnotation)
		}
	}
	return o, nil
}

// Services and EndpointSlices are most of a large cluster's objects (at
// 10 000 Services, 20 000 objects: 45 of the agent's 60 MB of heap before
// slimming), so the informers keep only what the datapath reads of them, in
// new, smaller allocations; the decoded originals become garbage.

// slimMeta is the metadata the agent uses: identity, version, labels and
// annotations (the rest, owner references and finalizers included, is
// never read).
func slimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, Labels: m.Labels, Annotations: withoutLastApplied(m.Annotations),
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp}
}

func withoutLastApplied(a map[string]string) map[string]string {
	if a[corev1.LastAppliedConfigAnnotation] != "" {
		delete(a, corev1.LastAppliedConfigAnnotation)
	}
	if len(a) == 0 {
		return nil
	}
	return a
}

// slimService keeps the metadata and the spec fields shunt reads: the
// type, the cluster IPs, the ports (nodePorts included), the selector and
// session affinity, what outside traffic reads (externalIPs, the traffic
// policies, the health check port, the load balancer's ingress in the
// status) and the fields shunt names as not implemented
// (services.Unsupported: source ranges, traffic distribution); a field
// read anywhere else must be added here. The API server's other defaults
// (IP families and policy, ...) are not the datapath's: 10 000 Services
// kept whole are a tenth of its heap.
func slimService(o any) (any, error) {
	svc, ok := o.(*corev1.Service)
	if !ok {
		return stripMeta(o)
	}
	in := &svc.Spec
	spec := corev1.ServiceSpec{Type: in.Type, ClusterIP: in.ClusterIP, Ports: in.Ports, Selector: in.Selector,
		SessionAffinity: in.SessionAffinity, SessionAffinityConfig: in.SessionAffinityConfig,
		ExternalIPs: in.ExternalIPs, ExternalTrafficPolicy: in.ExternalTrafficPolicy, HealthCheckNodePort: in.HealthCheckNodePort,
		LoadBalancerSourceRanges: in.LoadBalancerSourceRanges, TrafficDistribution: in.TrafficDistribution}
	// internalTrafficPolicy Cluster is every Service's default: only Local
	// says something (not implemented, so named).
	if p := in.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		spec.InternalTrafficPolicy = p
	}
	var status corev1.ServiceStatus
	if in.Type == corev1.ServiceTypeLoadBalancer {
		status.LoadBalancer.Ingress = svc.Status.LoadBalancer.Ingress
	}
	// Most Services have one cluster IP: ClusterIPs then shares its string.
	if len(in.ClusterIPs) == 1 && in.ClusterIPs[0] == in.ClusterIP {
		spec.ClusterIPs = []string{in.ClusterIP}
	} else {
		spec.ClusterIPs = slices.Clip(in.ClusterIPs)
	}
	return &corev1.Service{TypeMeta: svc.TypeMeta, ObjectMeta: slimMeta(svc.ObjectMeta), Spec: spec, Status: status}, nil
}

// slimEndpointSlice keeps what load balancing reads: the ports, and of
// the endpoints their addresses and conditions, with endpoints whose
// conditions are the same merged into one (the API calls an endpoint's
// addresses fungible, and the datapath balances over every address), the
// conditions pointing at shared values, and of the labels only the
// Service's name. At 10 000 slices of 10 endpoints this is most of the
// agent's heap: 16 MB before merging, 1-2 after.
func slimEndpointSlice(o any) (any, error) {
	sl, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return stripMeta(o)
	}
	meta := slimMeta(sl.ObjectMeta)
	meta.Labels, meta.Annotations = nil, nil
	if name, ok := sl.Labels[discoveryv1.LabelServiceName]; ok {
		meta.Labels = map[string]string{discoveryv1.LabelServiceName: name}
	}
	out := &discoveryv1.EndpointSlice{TypeMeta: sl.TypeMeta, ObjectMeta: meta, AddressType: sl.AddressType, Ports: sl.Ports}
	// Merged by conditions and node: externalTrafficPolicy Local and its
	// health check read the node.
	type group struct {
		conditions [3]int8
		node       string
	}
	byConditions := map[group]int{} // index in out.Endpoints
	for _, e := range sl.Endpoints {
		c := discoveryv1.EndpointConditions{Ready: shared(e.Conditions.Ready), Serving: shared(e.Conditions.Serving), Terminating: shared(e.Conditions.Terminating)}
		k := group{conditions: [3]int8{tristate(c.Ready), tristate(c.Serving), tristate(c.Terminating)}}
		if e.NodeName != nil {
			k.node = *e.NodeName
		}
		if i, ok := byConditions[k]; ok {
			out.Endpoints[i].Addresses = append(out.Endpoints[i].Addresses, e.Addresses...)
			continue
		}
		byConditions[k] = len(out.Endpoints)
		out.Endpoints = append(out.Endpoints, discoveryv1.Endpoint{Addresses: slices.Clip(e.Addresses), Conditions: c, NodeName: e.NodeName})
	}
	for i := range out.Endpoints {
		out.Endpoints[i].Addresses = slices.Clip(out.Endpoints[i].Addresses)
	}
	return out, nil
}

var sharedTrue, sharedFalse = true, false

// shared points at one of two package-level booleans: the store's
// objects are never written to, so every condition can share them.
func shared(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &sharedTrue
	default:
		return &sharedFalse
	}
}

func tristate(b *bool) int8 {
	switch {
	case b == nil:
		return 0
	case *b:
		return 1
	default:
		return 2
	}
}

// slimPod keeps of a pod what services, policy and L7 read: labels and
// annotations, the node, host networking, the containers' ports (named
// ports), and the status addresses, phase and conditions.
func slimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return stripMeta(o)
	}
	if _, err := stripMeta(p); err != nil {
		return nil, err
	}
	spec := corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork}
	for _, c := range p.Spec.Containers {
		spec.Containers = append(spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
	}
	p.Spec = spec
	p.Status = corev1.PodStatus{Phase: p.Status.Phase, Conditions: p.Status.Conditions, PodIP: p.Status.PodIP,
		PodIPs: p.Status.PodIPs, HostIP: p.Status.HostIP}
	return p, nil
}

// slimNode keeps a Node's pod CIDRs and addresses (where its pods are
// reached: the tunnel endpoint); its status is otherwise images, capacity
// and conditions that change without concerning the datapath.
func slimNode(o any) (any, error) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return stripMeta(o)
	}
	return &corev1.Node{TypeMeta: n.TypeMeta, ObjectMeta: slimMeta(n.ObjectMeta),
		Spec:   corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status: corev1.NodeStatus{Addresses: n.Status.Addresses}}, nil
}

// convert turns an unstructured object into its Go type.
func convert[T any, PT interface {
	*T
	runtime.Object
}](u *unstructured.Unstructured) (runtime.Object, error) {
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &v); err != nil {
		return nil, err
	}
	return PT(&v), nil
}

// unstructuredTo is the transform of the dynamic informers: the store
// holds typed objects whatever the source.
func unstructuredTo(o any, conv func(*unstructured.Unstructured) (runtime.Object, error)) (any, error) {
	switch v := o.(type) {
	case *unstructured.Unstructured:
		v.SetManagedFields(nil)
		t, err := conv(v)
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", v.GetKind(), v.GetNamespace(), v.GetName(), err)
		}
		return t, nil
	case cache.DeletedFinalStateUnknown:
		if u, ok := v.Obj.(*unstructured.Unstructured); ok {
			t, err := conv(u)
			if err != nil {
				return nil, err
			}
			v.Obj = t
		}
		return v, nil
	}
	return nil, errors.New("dynamic informer: not an unstructured object")
}
