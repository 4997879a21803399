// Package lab plays, on one machine, the parts of a cluster that a node
// agent talks to: the API server (decoding, validation, defaults, ClusterIP
// allocation, the garbage collector's cascades, persistence), the
// EndpointSlice controller and the node's kubelet with its container
// runtime and CNI plugin (network namespaces, veths, cgroups, processes,
// pod status). It writes complete Kubernetes objects, exactly what a real
// API server would hold, and hands them to the node's dataplane (Node):
// the same objects a client-go source would deliver from a real cluster.
package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// Node is the node's dataplane as the lab sees it: the objects go to it
// as a watch would deliver them, and the API server asks it whether a
// change fits. Pod interfaces reach it through shunt-cni and the agent's
// API, as on a real node. *reconciler.Reconciler implements it.
type Node interface {
	Update(store *model.Store, changes []model.Change) uint64
	Wait(ctx context.Context, gen uint64) error
	Admit(next *model.Store) error
}

// Config is the lab node.
type Config struct {
	Instance    instance.Instance
	NodeName    string
	NodeIP      netip.Addr // the node's address on the pod network
	PodPool     ipam.Pool  // pod addresses
	ServicePool ipam.Pool  // ClusterIPs
	// LoadBalancerPool is where LoadBalancer Services get their ingress
	// address (invalid: none, they stay pending).
	LoadBalancerPool netip.Prefix
	CgroupRoot       string
	BinDir           string // put first on containers' PATH (where shunt lives), and where shunt-cni is
	ShimExe          string // executable providing `shim`
	Images           Images // the programs of the images the lab maps (images.go)
	DNS              DNS    // cluster DNS and domain for pods' resolv.conf (dns.go)
	Log              *slog.Logger
	// LegacyPods are pod records an older agent kept in state.json.
	LegacyPods map[string]*PodRecord
	// NodeLeaseDuration (APIKubelet) is the node's Lease duration, renewed
	// every quarter of it; DefaultNodeLeaseDuration when zero.
	NodeLeaseDuration time.Duration
	// NodeGrace is how long a joining node of a multi-node lab may stay
	// silent before it is NotReady (0: DefaultNodeGrace).
	NodeGrace time.Duration
	// CrashLoopBackOff and MaxCrashLoopBackOff are the back-off before a
	// container's second restart, doubled at each next one up to the
	// most (0: kubelet's, 10 s and 5 min; containers.go).
	CrashLoopBackOff, MaxCrashLoopBackOff time.Duration
	// HostPaths maps hostPath volumes' paths (and what is below them) to
	// the node's own directories (volumes.go).
	HostPaths map[string]string
	// CNIConfDir and CNIBinDir (a node whose CNI a DaemonSet installs,
	// nodekubelet.go): pods are plumbed with the configuration found
	// there, not the lab's own, and the node is Ready once there is one.
	CNIConfDir, CNIBinDir string
}

// ControlPlane is the lab's API server, EndpointSlice controller and
// kubelet around one store.
type ControlPlane struct {
	cfg  Config
	node Node

	mu         sync.Mutex // held for a whole request
	store      *model.Store
	gen        uint64 // the node generation of the latest commit
	journal    objectLog
	clusterIPs clusterIPs
	kubelet    kubelet
	// uninstalled: Uninstall removed every sandbox; no pass builds them
	// again while the agent exits (APIKubelet.uninstalled).
	uninstalled bool
	// notStarted says why pods wait to start (the datapath failed); they
	// are retried by Resync.
	notStarted string
	// watch is the revision log joining nodes follow; leases their
	// heartbeats (cluster.go).
	watch  watchState
	leases *leases
}

// New loads the persisted objects and pod records; Start brings the node
// to them.
func New(cfg Config, node Node) (*ControlPlane, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cni, err := newCNIRuntime(cfg)
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{cfg: cfg, node: node, journal: objectLog{dir: cfg.Instance.StateDir()}, kubelet: kubelet{cfg: cfg, cni: cni},
		watch: newWatchState(), leases: newLeases()}
	stored, err := cp.journal.load()
	if err != nil {
		return nil, err
	}
	if cp.journal.droppedTail != "" {
		cfg.Log.Warn("objects: a change that was never acknowledged (the agent stopped while writing it) is not applied", "detail", cp.journal.droppedTail)
	}
	objs, err := decodeObjects(stored)
	if err != nil {
		return nil, fmt.Errorf("persisted objects: %w", err)
	}
	cp.store = model.NewStore(objs)
	cp.clusterIPs = newClusterIPs(cfg.ServicePool, cp.store)
	cp.clusterIPs.lbPool = cfg.LoadBalancerPool
	if err := cp.kubelet.load(cfg.LegacyPods); err != nil {
		return nil, err
	}
	return cp, nil
}

// Migrate stores objects an older agent kept elsewhere (state.json) and
// gives services persisted without a ClusterIP one now.
func (cp *ControlPlane) Migrate(legacy []StoredObject, clusterIPs map[string]string) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	objs, err := decodeObjects(legacy)
	if err != nil {
		return fmt.Errorf("persisted state: %w", err)
	}
	next, changes := cp.store.Put(objs)
	for _, s := range next.Services() {
		if s.Spec.ClusterIP == "" {
			if ip := clusterIPs[s.Namespace+"/"+s.Name]; ip != "" {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
			} else {
				changes = append(changes, model.Change{Key: manifest.Key{Kind: manifest.KindService, Namespace: s.Namespace, Name: s.Name}, Action: model.Created})
			}
		}
	}
	cp.clusterIPs = newClusterIPs(cp.cfg.ServicePool, next)
	cp.clusterIPs.lbPool = cp.cfg.LoadBalancerPool
	ips, err := cp.clusterIPs.assign(cp.store, next, changes)
	if err != nil {
		return fmt.Errorf("persisted state: %w", err)
	}
	cp.clusterIPs.commit(ips)
	cp.store = next
	if len(objs) > 0 || len(ips.held) > 0 {
		return cp.journal.snapshot(next)
	}
	return nil
}

// Start hands every object to the node and brings the pods to what the
// objects say: plumbing rebuilt where it is gone, containers started where
// they never were, status written.
func (cp *ControlPlane) Start(ctx context.Context) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var all []model.Change
	for _, o := range cp.store.Objects() {
		all = append(all, model.Change{Key: o.Key(), Action: model.Created})
	}
	cp.gen = cp.node.Update(cp.store, all)
	err := cp.syncPods(ctx)
	return errors.Join(err, cp.node.Wait(ctx, cp.gen))
}

// Store is the objects as they are now.
func (cp *ControlPlane) Store() *model.Store {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.store
}

// Apply creates or updates objects all or nothing, as `kubectl apply`
// does, and returns once the node's datapath and pods reflect them.
func (cp *ControlPlane) Apply(ctx context.Context, docs []manifest.Document) ([]model.Change, error) {
	objs, err := manifest.Decode(docs)
	if err == nil {
		err = manifest.Validate(objs)
	}
	if err != nil {
		return nil, err
	}
	return cp.changeEverywhere(ctx, objs, cp.admitApply)
}

// Delete removes objects (and what depends on them) all or nothing. As
// kubectl, it needs only what names each object (apiVersion, kind,
// namespace, name): the rest of a manifest is not read.
func (cp *ControlPlane) Delete(ctx context.Context, docs []manifest.Document) ([]model.Change, error) {
	objs, err := manifest.DecodeReferences(docs)
	if err == nil {
		err = manifest.CheckReferences(objs)
	}
	if err != nil {
		return nil, err
	}
	return cp.changeEverywhere(ctx, objs, cp.admitDelete)
}

type admission func(cur *model.Store, objs []manifest.Object) (*model.Store, []model.Change, ipAssignment, error)

// changeEverywhere is change, returning once every node of a multi-node
// lab enforces it too (without holding the lock: their polls need it).
func (cp *ControlPlane) changeEverywhere(ctx context.Context, objs []manifest.Object, admit admission) ([]model.Change, error) {
	changes, rev, err := cp.change(ctx, objs, admit)
	if err != nil || rev == 0 {
		return changes, err
	}
	return changes, cp.waitNodes(ctx, rev)
}

// change admits a request, commits it and waits for the node; rev is the
// revision that holds it (0: nothing changed).
func (cp *ControlPlane) change(ctx context.Context, objs []manifest.Object, admit admission) (_ []model.Change, rev uint64, _ error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	next, changes, ips, err := admit(cp.store, objs)
	if err != nil {
		return nil, 0, err
	}
	if !slices.ContainsFunc(changes, model.Change.Changed) {
		return changes, 0, nil // nothing to do, nothing to write
	}
	pods := touches(changes, manifest.KindPod)
	if pods {
		if err := cp.kubelet.admit(next); err != nil {
			return nil, 0, err
		}
	}
	if pods || touches(changes, manifest.KindNamespace, manifest.KindNetworkPolicy, manifest.KindShuntNetworkPolicy) {
		if err := cp.node.Admit(next); err != nil {
			return nil, 0, err
		}
	}
	if err := cp.commit(next, changes); err != nil {
		return nil, 0, err
	}
	rev = cp.watch.rev
	cp.clusterIPs.commit(ips)
	if pods {
		err = cp.syncPods(ctx)
	}
	return changes, rev, errors.Join(err, cp.node.Wait(ctx, cp.gen))
}

// joinChanges adds the controllers' changes to a request's: a status
// written to an object the request changed (a route it created) is part of
// that one change, not a second one.
func joinChanges(changes, more []model.Change) []model.Change {
	changed := map[manifest.Key]bool{}
	for _, c := range changes {
		changed[c.Key] = c.Changed()
	}
	for _, c := range more {
		if !changed[c.Key] {
			changes = append(changes, c)
		}
	}
	return changes
}

func touches(changes []model.Change, kinds ...string) bool {
	return slices.ContainsFunc(changes, func(c model.Change) bool { return c.Changed() && slices.Contains(kinds, c.Key.Kind) })
}

// commit makes next the objects: the writes of the EndpointSlice and mesh
// controllers join the same transaction, the journal records it, and only
// then the node gets the result. Written ahead, the change is durable
// before anything acts on it; if it cannot be written, none of it is
// applied (a datapath running a change the disk does not hold would drop
// it at the next start). Called with mu held.
func (cp *ControlPlane) commit(next *model.Store, changes []model.Change) error {
	put, remove := sliceChanges(cp.store, next, changes)
	put = append(put, routeStatusChanges(next, changes)...)
	if len(put) > 0 || len(remove) > 0 {
		var more, fewer []model.Change
		next, more = next.Put(put)
		next, fewer = next.Remove(remove)
		changes = joinChanges(changes, append(more, fewer...))
	}
	var changed []manifest.Key
	for _, c := range changes {
		if c.Changed() {
			changed = append(changed, c.Key)
		}
	}
	if err := cp.journal.save(next, changed); err != nil {
		return fmt.Errorf("nothing applied: %w", err)
	}
	cp.store = next
	cp.watch.committed(changed)
	cp.gen = cp.node.Update(next, changes)
	return nil
}

// syncPods is the kubelet's pass: pods gone are torn down, new ones
// plumbed and reported to the node, and containers started only once the
// node has programmed their pod (identity, policy), so no process ever
// runs unprotected by the policy that selects it. Called with mu held.
func (cp *ControlPlane) syncPods(ctx context.Context) error {
	if cp.uninstalled {
		return nil
	}
	k := &cp.kubelet
	local := map[string]*corev1.Pod{}
	for _, p := range cp.store.Pods() {
		if p.Spec.NodeName == cp.cfg.NodeName {
			local[p.Namespace+"/"+p.Name] = p
		}
	}
	var gone []*PodRecord
	for key, rec := range k.pods {
		if local[key] == nil {
			gone = append(gone, rec)
		}
	}
	errs := []error{k.remove(ctx, gone...)}
	var toStart []string
	var plumbErr error
	keys := slices.Sorted(maps.Keys(local))
	recs := make([]*PodRecord, len(keys))
	for i, key := range keys {
		recs[i] = k.record(local[key])
	}
	for i, err := range k.plumbEach(ctx, recs, !k.checked) {
		if err != nil {
			plumbErr = errors.Join(plumbErr, err)
			continue
		}
		if recs[i].Containers == nil && k.runnable(local[keys[i]]) {
			toStart = append(toStart, keys[i])
		}
	}
	k.checked = true
	errs = append(errs, plumbErr, cp.writeStatus())
	if len(toStart) > 0 {
		if err := cp.node.Wait(ctx, cp.gen); err != nil {
			cp.notStarted = "waiting for the datapath: " + err.Error()
			errs = append(errs, fmt.Errorf("pods %v not started (retried): the datapath is not programmed: %w", toStart, err))
			toStart = nil
		} else {
			cp.notStarted = ""
		}
	}
	if plumbErr != nil { // Resync retries
		cp.notStarted = "plumbing the pod's network: " + plumbErr.Error()
	}
	for _, key := range toStart {
		rec := k.pods[key]
		if err := k.start(local[key], rec); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", key, err), k.remove(ctx, rec))
			continue
		}
		cp.cfg.Log.Info("pod started", "pod", key, "ip", rec.IP, "veth", rec.HostIf)
	}
	errs = append(errs, k.syncContainers(cp.localPods()), cp.writeStatus(), k.save())
	return errors.Join(errs...)
}

// localPods are the pods of this node. Called with mu held.
func (cp *ControlPlane) localPods() []*corev1.Pod {
	var pods []*corev1.Pod
	for _, p := range cp.store.Pods() {
		if p.Spec.NodeName == cp.cfg.NodeName {
			pods = append(pods, p)
		}
	}
	return pods
}

// writeStatus writes the status of every local pod whose status changed,
// as the kubelet's status manager does. Called with mu held.
func (cp *ControlPlane) writeStatus() error {
	var updated []manifest.Object
	for _, p := range cp.store.Pods() {
		if p.Spec.NodeName != cp.cfg.NodeName {
			continue
		}
		st := cp.kubelet.status(p, cp.notStarted)
		if reflect.DeepEqual(st, p.Status) {
			continue
		}
		np := p.DeepCopy()
		np.Status = st
		updated = append(updated, manifest.Object{Source: "kubelet", Obj: np})
	}
	if len(updated) == 0 {
		return nil
	}
	next, changes := cp.store.Put(updated)
	return cp.commit(next, changes)
}

// Resync follows containers that started or exited on their own, and the
// probes' results, into the pods' status (and so into the
// EndpointSlices), restarts containers as their pods' restartPolicy says,
// and retries pods that could not start.
func (cp *ControlPlane) Resync(ctx context.Context) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.uninstalled {
		return nil
	}
	if cp.notStarted != "" {
		return cp.syncPods(ctx)
	}
	return errors.Join(cp.kubelet.syncContainers(cp.localPods()), cp.writeStatus())
}

// Uninstall removes every pod of the node.
func (cp *ControlPlane) Uninstall(ctx context.Context) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.uninstalled = true
	return cp.kubelet.removeAll(ctx)
}
