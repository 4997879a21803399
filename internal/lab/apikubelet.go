package lab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/shuntnet/shunt/internal/kubeclient"
)

// APIKubelet is the lab's kubelet for a node whose pods are in an API: a
// real Kubernetes API server's (NewAPIKubelet), or the control plane of a
// multi-node lab, for a node that joined it (Follower.Kubelet). It runs the
// node's pods as the lab runs its own (namespace, cgroup, shunt-cni
// through libcni, processes under a shim), writing their status back
// through the API as kubelet's status manager does. A deleted pod's
// sandbox is torn down and the pod then removed for good (grace period 0),
// as kubelet finishes a graceful deletion. With a Kubernetes API server it
// keeps the node's heartbeat (its Lease and Ready condition,
// nodeheartbeat.go), so the control plane sees the node go when its agent
// goes.
//
// The lab has no scheduler: with Schedule, pods that name no node are bound
// to this one (a Binding, as kube-scheduler writes; of two nodes racing,
// the API server lets one win).
type APIKubelet struct {
	cfg      Config
	api      podAPI
	schedule bool
	// ready returns once the node's datapath knows the pods (their labels,
	// identities, the policies that select them): containers never run
	// before the policy that selects them is in force.
	ready func(ctx context.Context, pods []*corev1.Pod) error

	mu      sync.Mutex
	kubelet kubelet
	kick    chan struct{}
	// uninstalled: Uninstall removed every sandbox. A pass after it (a pod
	// event, a probe) would build them again while the agent exits, and an
	// exit in the middle of building one leaves it half made.
	uninstalled bool
}

// podAPI is the API a kubelet takes its pods from and writes their status
// to. Conflicts and pods already gone are no errors: the next pass works
// on the newer pods.
type podAPI interface {
	// run starts following the pods, calling changed at every change; it
	// returns once the pods are listed.
	run(ctx context.Context, changed func()) error
	pods() []*corev1.Pod
	bind(ctx context.Context, p *corev1.Pod, node string) error
	// remove deletes a pod whose deletion the kubelet finished.
	remove(ctx context.Context, p *corev1.Pod) error
	updateStatus(ctx context.Context, p *corev1.Pod) error
}

// NewAPIKubelet loads the pod records an earlier agent kept; Run starts.
func NewAPIKubelet(cfg Config, api *kubeclient.Client, schedule bool, ready func(context.Context, []*corev1.Pod) error) (*APIKubelet, error) {
	kp := &kubePods{api: api, heartbeat: newNodeHeartbeat(api, cfg.NodeName, cfg.NodeLeaseDuration, cfg.Log)}
	k, err := newAPIKubelet(cfg, kp, schedule, ready)
	if err == nil && cfg.CNIConfDir != "" {
		kp.heartbeat.networkReady = func() error { _, err := k.kubelet.cni.network(); return err }
	}
	return k, err
}

func newAPIKubelet(cfg Config, api podAPI, schedule bool, ready func(context.Context, []*corev1.Pod) error) (*APIKubelet, error) {
	cni, err := newCNIRuntime(cfg)
	if err != nil {
		return nil, err
	}
	k := &APIKubelet{cfg: cfg, api: api, schedule: schedule, ready: ready, kubelet: kubelet{cfg: cfg, cni: cni}, kick: make(chan struct{}, 1)}
	k.kubelet.probes.changed = k.poke // a probe's new result is written at once
	if kp, ok := api.(*kubePods); ok {
		k.kubelet.objects, k.kubelet.services = kp, kp.services
	}
	if err := k.kubelet.load(nil); err != nil {
		return nil, err
	}
	return k, nil
}

// Run follows the pods and syncs them until ctx ends; it returns once the
// pods are listed.
func (k *APIKubelet) Run(ctx context.Context) error {
	if err := k.api.run(ctx, k.poke); err != nil {
		return err
	}
	go func() {
		// A pass every second follows containers that exit on their own
		// and retries what failed.
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			if err := k.Sync(ctx); err != nil && ctx.Err() == nil {
				k.cfg.Log.Warn("lab kubelet", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-k.kick:
			case <-tick.C:
			}
		}
	}()
	return nil
}

// kubePods are the pods of a Kubernetes API server, and the heartbeat of
// their node.
type kubePods struct {
	api          *kubeclient.Client
	store        cache.Store
	serviceStore cache.Store
	heartbeat    *nodeHeartbeat
}

func (kp *kubePods) run(ctx context.Context, changed func()) error {
	// The node says it is Ready before its pods do: the node-lifecycle
	// controller marks the pods of a node it holds NotReady not ready
	// again as soon as their status is written (after a restart, a node
	// it marked Unknown while the agent was away).
	kp.heartbeat.start(ctx)
	inf := kp.api.Informer(kubeclient.Pods, 0)
	poke := func(any) { changed() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, n any) { changed() }, DeleteFunc: poke,
	}); err != nil {
		return err
	}
	kp.store = inf.GetStore()
	// Every Service, as kubelet's service lister: the pods' environment
	// (podenv.go) is made of them, and kubelet starts no container before
	// it has read them once.
	svcs := kp.api.Informer(kubeclient.Services, 0)
	kp.serviceStore = svcs.GetStore()
	go inf.RunWithContext(ctx)
	go svcs.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced, svcs.HasSynced) {
		return fmt.Errorf("lab kubelet: listing pods and services from the API server: %w", ctx.Err())
	}
	return nil
}

func (kp *kubePods) services() []*corev1.Service {
	var all []*corev1.Service
	for _, o := range kp.serviceStore.List() {
		if s, ok := o.(*corev1.Service); ok {
			all = append(all, s)
		}
	}
	return all
}

func (kp *kubePods) pods() []*corev1.Pod {
	var all []*corev1.Pod
	for _, o := range kp.store.List() {
		if p, ok := o.(*corev1.Pod); ok {
			all = append(all, p)
		}
	}
	return all
}

func (kp *kubePods) bind(ctx context.Context, p *corev1.Pod, node string) error {
	return kp.bindIfFits(ctx, p, node)
}

func (kp *kubePods) bindHere(ctx context.Context, p *corev1.Pod, node string) error {
	err := kp.api.BindPod(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // another node took it, or it is gone
	}
	if err != nil {
		return fmt.Errorf("binding pod %s/%s to node %s: %w", p.Namespace, p.Name, node, err)
	}
	return nil
}

func (kp *kubePods) remove(ctx context.Context, p *corev1.Pod) error {
	err := kp.api.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &p.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("removing deleted pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

func (kp *kubePods) updateStatus(ctx context.Context, p *corev1.Pod) error {
	_, err := kp.api.Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // the next pass writes it against the newer pod
	}
	if err != nil {
		return fmt.Errorf("writing the status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

func (k *APIKubelet) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Sync is one kubelet pass: pods gone or deleted torn down, new ones
// plumbed and started, every status brought up to date.
func (k *APIKubelet) Sync(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.uninstalled {
		return nil
	}
	all := k.api.pods()
	kl := &k.kubelet
	var errs []error
	local := map[string]*corev1.Pod{}
	for _, p := range all {
		switch {
		case p.Spec.NodeName == k.cfg.NodeName:
			local[p.Namespace+"/"+p.Name] = p
		case p.Spec.NodeName == "" && k.schedule && p.DeletionTimestamp == nil:
			errs = append(errs, k.bind(ctx, p))
		}
	}
	// A record whose pod is gone, or was replaced by a new one of the same
	// name, loses its sandbox.
	var gone []*PodRecord
	for key, rec := range kl.pods {
		if p := local[key]; p == nil || (rec.UID != "" && rec.UID != string(p.UID)) {
			gone = append(gone, rec)
		}
	}
	errs = append(errs, kl.remove(ctx, gone...))
	var toStart []*corev1.Pod
	var pods []*corev1.Pod
	var recs []*PodRecord
	for _, key := range slices.Sorted(maps.Keys(local)) {
		p := local[key]
		if p.DeletionTimestamp != nil {
			errs = append(errs, k.finishDeletion(ctx, p))
			continue
		}
		rec := kl.record(p)
		rec.UID = string(p.UID)
		pods, recs = append(pods, p), append(recs, rec)
	}
	for i, err := range kl.plumbEach(ctx, recs, !kl.checked) {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if recs[i].Containers == nil && kl.runnable(pods[i]) {
			toStart = append(toStart, pods[i])
		}
	}
	kl.checked = true
	if len(toStart) > 0 {
		if err := k.ready(ctx, toStart); err != nil {
			errs = append(errs, fmt.Errorf("pods not started yet (retried): %w", err))
			toStart = nil
		}
	}
	for _, p := range toStart {
		rec := kl.pods[p.Namespace+"/"+p.Name]
		if err := kl.start(p, rec); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", rec.key(), err), kl.remove(ctx, rec))
			continue
		}
		k.cfg.Log.Info("pod started", "pod", rec.key(), "ip", rec.IP, "veth", rec.HostIf)
	}
	errs = append(errs, kl.syncContainers(slices.Collect(maps.Values(local))), kl.save())
	for _, p := range local {
		if p.DeletionTimestamp == nil && kl.pods[p.Namespace+"/"+p.Name] != nil {
			errs = append(errs, k.writeStatus(ctx, p))
		}
	}
	return errors.Join(errs...)
}

// bind assigns an unscheduled pod to this node.
func (k *APIKubelet) bind(ctx context.Context, p *corev1.Pod) error {
	return k.api.bind(ctx, p, k.cfg.NodeName)
}

// finishDeletion stops a deleted pod's processes, removes its sandbox, and
// then the pod itself (grace period 0, this pod and no newer one).
func (k *APIKubelet) finishDeletion(ctx context.Context, p *corev1.Pod) error {
	var err error
	if rec := k.kubelet.pods[p.Namespace+"/"+p.Name]; rec != nil {
		if !k.kubelet.stopGracefully(p, rec) {
			return nil // its containers are still stopping
		}
		err = k.kubelet.remove(ctx, rec)
	}
	return errors.Join(err, k.api.remove(ctx, p))
}

// writeStatus writes the fields a kubelet owns (address, phase, the Ready
// condition, container states) when they differ from the pod's; what
// others wrote (other conditions, QoS class) is kept.
func (k *APIKubelet) writeStatus(ctx context.Context, p *corev1.Pod) error {
	mine := k.kubelet.status(p, "")
	st := p.Status.DeepCopy()
	st.Phase, st.PodIP, st.PodIPs, st.HostIP, st.HostIPs, st.StartTime = mine.Phase, mine.PodIP, mine.PodIPs, mine.HostIP, mine.HostIPs, mine.StartTime
	st.ContainerStatuses = mine.ContainerStatuses
	for _, c := range mine.Conditions {
		st.Conditions = setCondition(st.Conditions, c)
	}
	if equality.Semantic.DeepEqual(*st, p.Status) {
		return nil
	}
	np := p.DeepCopy()
	np.Status = *st
	return k.api.updateStatus(ctx, np)
}

// setCondition replaces the condition of c's type, keeping its transition
// time when the status did not change.
func setCondition(conds []corev1.PodCondition, c corev1.PodCondition) []corev1.PodCondition {
	for i, old := range conds {
		if old.Type != c.Type {
			continue
		}
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.NewTime(time.Now().Truncate(time.Second))
		}
		conds[i] = c
		return conds
	}
	c.LastTransitionTime = metav1.NewTime(time.Now().Truncate(time.Second))
	return append(conds, c)
}

// Uninstall removes the sandboxes of every pod this kubelet ran (the pods
// stay in the API server, as when a node is removed); no pass builds them
// again.
func (k *APIKubelet) Uninstall(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.uninstalled = true
	return k.kubelet.removeAll(ctx)
}

// WaitPodsSeen polls until have reports each pod's UID (the agent's source
// delivered it); a helper for the ready callback.
func WaitPodsSeen(ctx context.Context, pods []*corev1.Pod, have func(uid string) bool) error {
	return wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, p := range pods {
			if !have(string(p.UID)) {
				return false, nil
			}
		}
		return true, nil
	})
}
