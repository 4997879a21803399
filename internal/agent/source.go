package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
