package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/shuntnet/shunt/internal/kubeclient"
	"github.com/shuntnet/shunt/internal/kubeidentity"
	"github.com/shuntnet/shunt/internal/kubesource"
	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/reconciler"
)

// source is where the node's objects come from: the lab's emulated control
// plane (internal/lab), or a Kubernetes API server (internal/kubesource).
type source interface {
	Store() *model.Store
	// Apply and Delete change objects; a Kubernetes-backed agent refuses
	// them (objects are changed through the API server).
	Apply(ctx context.Context, docs []manifest.Document) ([]model.Change, error)
	Delete(ctx context.Context, docs []manifest.Document) ([]model.Change, error)
	// Resync follows what changed on the node by itself (the lab's
	// containers exiting), before `shunt get pods` answers and every
	// ResyncEvery (0: the source follows its containers on its own).
	Resync(ctx context.Context) error
	ResyncEvery() time.Duration
	Uninstall(ctx context.Context) error
	// Health is "" when the source is fine, else what is wrong.
	Health() string
	// Describe names the source for `shunt status`.
	Describe() string
}

// errObjectsFromAPIServer refuses the lab's apply/delete on a node whose
// objects come from a Kubernetes API server.
var errObjectsFromAPIServer = errors.New("this agent takes its objects from a Kubernetes API server: change them there (kubectl apply/delete with the cluster's kubeconfig), not through shunt")

// kubeSource is the Kubernetes API server as a source.
type kubeSource struct {
	*kubesource.Source
	server string
	pods   *lab.APIKubelet // the lab's kubelet for this node (nil: a real one)
}

func (k kubeSource) Apply(context.Context, []manifest.Document) ([]model.Change, error) {
	return nil, errObjectsFromAPIServer
}

func (k kubeSource) Delete(context.Context, []manifest.Document) ([]model.Change, error) {
	return nil, errObjectsFromAPIServer
}

func (k kubeSource) Resync(ctx context.Context) error {
	if k.pods != nil {
		return k.pods.Sync(ctx)
	}
	return nil
}

// ResyncEvery is 0: the API kubelet follows its containers in its own loop
// (every second and at every pod event); a periodic pass from the agent as
// well doubled its work, and an idle node's garbage.
func (kubeSource) ResyncEvery() time.Duration { return 0 }

func (k kubeSource) Uninstall(ctx context.Context) error {
	if k.pods != nil {
		return k.pods.Uninstall(ctx)
	}
	return nil
}

// podsProgrammed returns once the source delivered the pods and a sync
// covered them: the lab's kubelet starts their containers after that.
func (a *Agent) podsProgrammed(ctx context.Context, pods []*corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := lab.WaitPodsSeen(ctx, pods, func(uid string) bool {
		return slices.ContainsFunc(a.objects().Pods(), func(p *corev1.Pod) bool { return string(p.UID) == uid })
	})
	if err != nil {
		return fmt.Errorf("the API server's pods have not reached this agent: %w", err)
	}
	return a.rec.WaitCurrent(ctx)
}

func (k kubeSource) Health() string {
	if ok, detail := k.Source.Health(); !ok {
		return "Kubernetes API server " + k.server + ": " + detail
	}
	return ""
}

func (k kubeSource) Describe() string { return "kubernetes " + k.server }

// kubeClient is the API server the agent talks to in Kubernetes mode: the
// configuration is loaded once and shared by the source, the identity
// allocator and the event recorder.
type kubeClient struct {
	rest *rest.Config
	api  *kubeclient.Client
	dyn  dynamic.Interface // the custom kinds' status
}

func newKubeClient(kubeconfig string) (*kubeClient, error) {
	rc, err := kubesource.RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	api, err := kubeclient.New(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client for %s: %w", rc.Host, err)
	}
	return &kubeClient{rest: rc, api: api, dyn: dyn}, nil
}

// ownNode reads this node's Node from the API server, waiting for the
// controller-manager's node IPAM to assign its spec.podCIDR.
func (k *kubeClient) ownNode(ctx context.Context, node string) (*corev1.Node, error) {
	var last error
	for {
		n, err := k.api.Nodes().Get(ctx, node, metav1.GetOptions{})
		switch {
		case err != nil:
			last = err
		case n.Spec.PodCIDR != "":
			return n, nil
		default:
			last = fmt.Errorf("node %s has no spec.podCIDR yet (the controller-manager assigns it with --allocate-node-cidrs)", node)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("reading node %s's pod CIDR from %s: %w", node, k.rest.Host, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// labSource is the lab's control plane as a source.
type labSource struct{ *lab.ControlPlane }

func (labSource) Health() string { return "" }

// ResyncEvery: the lab's containers start and exit on their own; its
// kubelet follows them into the pods' status, and so into the endpoints.
func (labSource) ResyncEvery() time.Duration { return 500 * time.Millisecond }
func (labSource) Describe() string           { return "lab" }

// followerSource is a multi-node lab's control plane, for a node that
// joined it: objects come from there, and its kubelet runs the pods placed
// on this node.
type followerSource struct {
	*lab.Follower
	pods *lab.APIKubelet
}

// errObjectsFromLab refuses apply and delete on a joining node: the lab's
// objects are the control plane's.
var errObjectsFromLab = errors.New("this node joined a multi-node lab: apply and delete objects on the lab's first node (`shunt --instance LAB ...`, the instance `shunt lab up --nodes` was given), which serves every node")

func (followerSource) Apply(context.Context, []manifest.Document) ([]model.Change, error) {
	return nil, errObjectsFromLab
}

func (followerSource) Delete(context.Context, []manifest.Document) ([]model.Change, error) {
	return nil, errObjectsFromLab
}

func (f followerSource) Resync(ctx context.Context) error {
	if f.pods != nil {
		return f.pods.Sync(ctx)
	}
	return nil
}

// ResyncEvery is 0: the kubelet follows its containers in its own loop.
func (followerSource) ResyncEvery() time.Duration { return 0 }

func (f followerSource) Uninstall(ctx context.Context) error {
	if f.pods != nil {
		return f.pods.Uninstall(ctx)
	}
	return nil
}

func (f followerSource) Describe() string { return "lab node (joined " + f.Socket() + ")" }

// startIdentities follows the cluster's ShuntIdentities, so the reconciler
// numbers identities as every other node does.
func (k *kubeClient) startIdentities(ctx context.Context, log *slog.Logger) (*kubeidentity.Allocator, error) {
	ids, err := kubeidentity.New(k.rest, log)
	if err != nil {
		return nil, err
	}
	start, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := ids.Run(start); err != nil {
		return nil, err
	}
	return ids, nil
}

// collectIdentities deletes, every interval, the cluster's identities that
// no pod uses any more (the policy the reconciler last computed lists the
// identities of every pod of the cluster).
func (a *Agent) collectIdentities(ctx context.Context, ids *kubeidentity.Allocator, every time.Duration) {
	// Not at once: a policy computed before the source synced lacks pods
	// whose identities are still in use.
	select {
	case <-ctx.Done():
		return
	case <-time.After(every):
	}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		pol := a.rec.Policy()
		if pol == nil {
			return
		}
		var inUse []policy.IdentityKey
		for _, id := range pol.Identities {
			inUse = append(inUse, policy.IdentityKey{Key: policy.IdentityKeyOf(id.Namespace, id.Labels, id.NamespaceLabels)})
		}
		if _, err := ids.Collect(ctx, inUse); err != nil {
			a.log.Warn("collecting unused identities", "err", err)
		}
	}, every)
}

// sourceStarter brings one kind of source up, in the steps of New; which
// kind is chosen once, by chooseSource.
type sourceStarter interface {
	// settle says what the source knows of the node before its settings
	// are final (the Node object of a Kubernetes node: pod CIDR, address).
	settle(a *Agent) error
	// join registers the node with the lab it joins, before anything of
	// the node is built.
	join(a *Agent) error
	// identities numbers the pods' identities as every node of the cluster
	// does (nil: this node numbers them itself).
	identities(ctx context.Context, a *Agent, s *startup) (reconciler.IdentityResolver, error)
	// open makes the source (a.src, a.objects), once the reconciler runs.
	open(ctx context.Context, a *Agent, s *startup) error
	// serving is what needs the agent's API: the lab's kubelet plumbs
	// pods through shunt-cni, which calls the agent.
	serving(ctx context.Context, a *Agent, s *startup) error
	// start hands the reconciler the source's first objects and runs it
	// until ctx ends; startCtx bounds the start.
	start(ctx, startCtx context.Context, a *Agent) error
}

// chooseSource is where the node's objects come from: a Kubernetes API
// server, the control plane of a multi-node lab this node joined, or the
// lab's own control plane (a lab of one node, or the first node of
// several).
func chooseSource(cfg Config) sourceStarter {
	switch {
	case cfg.Kubernetes:
		return &kubeStarter{}
	case cfg.LabJoin != "":
		return &followerStarter{}
	default:
		return &labStarter{}
	}
}

// labConfig is the lab's configuration on this node: its control plane's,
// or its kubelet's where the objects come from elsewhere.
func (a *Agent) labConfig(s *startup) lab.Config {
	return lab.Config{
		Instance: a.cfg.Instance, NodeName: a.nodeName, NodeIP: a.podPool.NodeIP(), PodPool: a.podPool, ServicePool: a.svcPool,
		CgroupRoot: s.root, BinDir: a.cfg.BinDir, ShimExe: a.cfg.ShimExe, Images: a.cfg.Images, DNS: a.cfg.DNS, Log: a.log,
		LegacyPods: a.state.Pods, NodeGrace: a.cfg.NodeGrace, LoadBalancerPool: a.cfg.LoadBalancerPool, NodeLeaseDuration: a.cfg.NodeLeaseDuration,
		CrashLoopBackOff: a.cfg.CrashLoopBackOff,
	}
}

// labStarter starts the lab's own control plane: API server, controllers
// and kubelet of this node, serving the other nodes of a multi-node lab
// with LabControlPlane.
type labStarter struct{ cp *lab.ControlPlane }

func (*labStarter) settle(*Agent) error { return nil }
func (*labStarter) join(*Agent) error   { return nil }

func (l *labStarter) identities(_ context.Context, a *Agent, s *startup) (reconciler.IdentityResolver, error) {
	if !a.cfg.LabControlPlane {
		return nil, nil
	}
	// The numbers this node gave so far stay theirs.
	var err error
	if a.clusterIDs, err = lab.NewClusterIdentities(a.cfg.Instance.StateDir(), s.alloc.Identities); err != nil {
		return nil, err
	}
	return a.clusterIDs, nil
}

func (l *labStarter) open(_ context.Context, a *Agent, s *startup) error {
	var err error
	if l.cp, err = lab.New(a.labConfig(s), a.rec); err != nil {
		return err
	}
	a.src, a.objects = labSource{l.cp}, l.cp.Store
	if a.cfg.LabControlPlane {
		a.labCP = l.cp
	}
	return nil
}

// serving moves what older versions kept in state.json (objects,
// ClusterIPs, pods) to the lab, before the state is saved without them.
func (l *labStarter) serving(_ context.Context, a *Agent, _ *startup) error {
	if st := a.state; len(st.Objects) > 0 || len(st.ClusterIPs) > 0 || st.Pods != nil {
		if err := l.cp.Migrate(st.Objects, st.ClusterIPs); err != nil {
			return err
		}
		st.Objects, st.ClusterIPs, st.Pods = nil, nil, nil
	}
	return nil
}

func (l *labStarter) start(ctx, startCtx context.Context, a *Agent) error {
	if err := l.cp.Start(startCtx); err != nil {
		return err
	}
	if a.cfg.LabControlPlane {
		// The control plane's own node is one of the lab's.
		if err := l.cp.RegisterNode(startCtx, a.nodeObject()); err != nil {
			return err
		}
		go l.cp.RunNodeLifecycle(ctx)
	}
	return nil
}

// followerStarter joins the control plane of a multi-node lab: objects
// come from there, and this node's kubelet runs the pods placed on it.
type followerStarter struct {
	f    *lab.Follower
	pods *lab.APIKubelet
}

func (*followerStarter) settle(*Agent) error { return nil }

func (fs *followerStarter) join(a *Agent) error {
	fs.f = lab.NewFollower(a.cfg.LabJoin, a.nodeName, a.log)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return fs.f.Register(ctx, newNodeObject(a.nodeName, a.podPool.CIDR, a.cfg.Underlay, time.Now().UTC()))
}

func (fs *followerStarter) identities(context.Context, *Agent, *startup) (reconciler.IdentityResolver, error) {
	return fs.f, nil
}

func (fs *followerStarter) open(_ context.Context, a *Agent, _ *startup) error {
	a.src, a.objects = followerSource{Follower: fs.f}, fs.f.Store
	return nil
}

func (fs *followerStarter) serving(_ context.Context, a *Agent, s *startup) error {
	var err error
	if fs.pods, err = fs.f.Kubelet(a.labConfig(s), a.podsProgrammed); err != nil {
		return err
	}
	a.src = followerSource{Follower: fs.f, pods: fs.pods}
	return nil
}

func (fs *followerStarter) start(ctx, startCtx context.Context, a *Agent) error {
	if err := fs.f.Run(ctx, startCtx, a.rec); err != nil {
		return err
	}
	return fs.pods.Run(ctx)
}

// kubeStarter follows a Kubernetes API server; with RunPods the lab plays
// this node's kubelet.
type kubeStarter struct {
	kube *kubeClient // loaded once, shared by everything that talks to it
	ks   *kubesource.Source
}

func (k *kubeStarter) settle(a *Agent) error {
	cfg := &a.cfg
	var err error
	if k.kube, err = newKubeClient(cfg.Kubeconfig); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	own, err := k.kube.ownNode(ctx, a.nodeName)
	cancel()
	if err != nil {
		return err
	}
	cidr := own.Spec.PodCIDR
	if needsUnderlay(*cfg) && !cfg.Underlay.IsValid() && a.state.Underlay == "" {
		// Other nodes reach this one's pods where the Node says, and
		// pods' traffic to outside leaves from there.
		if cfg.Underlay = policy.NodeTunnel(own); !cfg.Underlay.IsValid() {
			return fmt.Errorf("%s: node %s has no IPv4 InternalIP or ExternalIP in status.addresses: give --underlay-addr", underlayUser(*cfg), a.nodeName)
		}
	}
	if cfg.PodCIDR != "" && cfg.PodCIDR != cidr {
		return fmt.Errorf("--pod-cidr %s, but node %s has spec.podCIDR %s: leave --pod-cidr out with --kubeconfig", cfg.PodCIDR, a.nodeName, cidr)
	}
	cfg.PodCIDR = cidr
	return nil
}

func (*kubeStarter) join(*Agent) error { return nil }

func (k *kubeStarter) identities(ctx context.Context, a *Agent, _ *startup) (reconciler.IdentityResolver, error) {
	// Every node of the cluster must number identities alike.
	ids, err := k.kube.startIdentities(ctx, a.log)
	if err != nil {
		return nil, err
	}
	go a.collectIdentities(ctx, ids, 2*time.Minute)
	return ids, nil
}

func (k *kubeStarter) open(ctx context.Context, a *Agent, _ *startup) error {
	var err error
	if k.ks, err = kubesource.New(kubesource.Config{REST: k.kube.rest, Resync: 10 * time.Minute, Log: a.log}, a.rec); err != nil {
		return err
	}
	a.src = kubeSource{Source: k.ks, server: k.kube.rest.Host}
	// Before anything that reads the objects starts: the problem events
	// and status writers below run at once (a nil a.objects crashed one
	// agent start in 14 of the cross-node benchmark).
	a.objects = k.ks.Store
	if err := k.ks.Run(ctx); err != nil {
		return err
	}
	events, err := newProblemEvents(k.kube.api, a.nodeName, k.ks.Store, a.problems, a.log)
	if err != nil {
		return err
	}
	go events.run(ctx, time.Second)
	// Status of the cluster's objects that only this agent can write: its
	// entry in each ShuntNetworkPolicy, the mesh's HTTPRoutes.
	go wait.UntilWithContext(ctx, newPolicyStatus(k.kube.dyn, a.nodeName, k.ks.Store, a.problems, a.rec.Settled, a.log).write, time.Second)
	go wait.UntilWithContext(ctx, newRouteStatus(k.kube.dyn, k.ks.Store, a.rec.Settled, a.log).write, time.Second)
	return nil
}

func (k *kubeStarter) serving(ctx context.Context, a *Agent, s *startup) error {
	if !a.cfg.RunPods {
		return nil
	}
	kl, err := lab.NewAPIKubelet(a.labConfig(s), k.kube.api, !a.cfg.NoSchedule, a.podsProgrammed)
	if err != nil {
		return err
	}
	if err := a.serveKubeletAPI(ctx, kl, k.kube.rest); err != nil {
		// The pods run without it; only kubectl exec, logs, attach and
		// port-forward do not.
		a.log.Warn("the node's kubelet API is not served: kubectl exec, logs, attach and port-forward fail on its pods", "err", err)
	}
	if err := kl.Run(ctx); err != nil {
		return err
	}
	a.src = kubeSource{Source: k.ks, server: k.kube.rest.Host, pods: kl}
	return nil
}

func (k *kubeStarter) start(_, startCtx context.Context, _ *Agent) error {
	return k.ks.WaitSynced(startCtx)
}

// serveKubeletAPI serves the node's kubelet API (lab.KubeletAPI).
func (a *Agent) serveKubeletAPI(ctx context.Context, kl *lab.APIKubelet, rc *rest.Config) error {
	// The API server's kubelet client certificate is signed by the CA
	// that signs its own (kubeadm's and shunt dev cluster's layout).
	ca, err := kubeconfigCA(rc)
	if err != nil {
		return err
	}
	// The API server reaches a kubelet at its Node's InternalIP: the
	// underlay address where the node has one (the Node's own, see
	// settle), else the node's address on the pod network, which the
	// kubelet then writes into a Node that names none.
	addr := a.cfg.Underlay
	if !addr.IsValid() {
		addr = a.podPool.NodeIP()
	}
	_, err = kl.ServeKubeletAPI(ctx, addr, lab.KubeletPort, ca)
	return err
}

// kubeconfigCA is the CA certificate (PEM) the kubeconfig trusts the API
// server with.
func kubeconfigCA(rc *rest.Config) ([]byte, error) {
	if len(rc.TLSClientConfig.CAData) > 0 {
		return rc.TLSClientConfig.CAData, nil
	}
	if rc.TLSClientConfig.CAFile != "" {
		data, err := os.ReadFile(rc.TLSClientConfig.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading the kubeconfig's CA certificate: %w", err)
		}
		return data, nil
	}
	return nil, errors.New("the kubeconfig names no CA certificate (certificate-authority-data or certificate-authority): the lab's kubelet API checks the API server's client certificate with it")
}
