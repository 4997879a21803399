package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
)

// Follower is a node that joined a multi-node lab: it takes the objects
// from the first node's control plane (cluster.go) over that agent's
// socket, as a node agent watches an API server, hands them to its own
// datapath (Node), and its kubelet runs the pods placed on it.
type Follower struct {
	socket string
	node   string
	client *api.Client
	log    *slog.Logger

	mu         sync.Mutex
	store      *model.Store
	epoch      string
	rev        uint64 // the control plane's revision the store holds
	programmed uint64 // the revision the datapath enforces
	unreach    string // why the control plane does not answer, since when ("": it does)
	changed    func() // the kubelet's poke
}

// NewFollower follows the control plane at socket as node.
func NewFollower(socket, node string, log *slog.Logger) *Follower {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Follower{socket: socket, node: node, client: api.NewClient(socket), log: log, store: model.NewStore(nil), changed: func() {}}
}

// Lab API paths a control plane serves to joining nodes.
const (
	PathWatch      = "/v1/lab/watch"
	PathNodes      = "/v1/lab/nodes"
	PathIdentities = "/v1/lab/identities"
	// PathPodStatus is followed by namespace/name/status.
	PathPodStatus = "/v1/lab/pods/"
)

// Register gives the control plane this node's Node, retrying while it
// does not answer (it may be starting), until ctx ends. A Node it refuses
// is an error at once.
func (f *Follower) Register(ctx context.Context, n *corev1.Node) error {
	for {
		err := f.client.DoContext(ctx, http.MethodPost, PathNodes, n, nil)
		if err == nil {
			return nil
		}
		if !errors.As(err, new(*api.UnreachableError)) {
			return fmt.Errorf("joining the lab at %s: %w", f.socket, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("joining the lab: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Resolve numbers identities with the control plane's ClusterIdentities.
func (f *Follower) Resolve(ctx context.Context, keys []policy.IdentityKey) (map[string]uint32, error) {
	var ids map[string]uint32
	if err := f.client.DoContext(ctx, http.MethodPost, PathIdentities, keys, &ids); err != nil {
		return nil, fmt.Errorf("the lab's control plane at %s: %w", f.socket, err)
	}
	return ids, nil
}

// Run delivers the objects to node until ctx ends; it returns once the
// first delivery is programmed (or failed to be: the datapath retries), or
// with an error when none came before start ends.
func (f *Follower) Run(ctx, start context.Context, node Node) error {
	first := make(chan error, 1)
	go func() {
		delivered := false
		for ctx.Err() == nil {
			err := f.follow(ctx, node)
			if err != nil && ctx.Err() == nil {
				f.log.Warn("following the lab's control plane", "socket", f.socket, "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			if !delivered {
				delivered = true
				first <- nil
			}
		}
		if !delivered {
			first <- ctx.Err()
		}
	}()
	select {
	case err := <-first:
		if err != nil {
			return fmt.Errorf("the lab's control plane at %s sent no objects: %w", f.socket, err)
		}
		return nil
	case <-start.Done():
		return fmt.Errorf("the lab's control plane at %s sent no objects: %w", f.socket, start.Err())
	}
}

// follow is one poll: what changed goes to the store and the node, and is
// programmed before the next poll says so.
func (f *Follower) follow(ctx context.Context, node Node) error {
	f.mu.Lock()
	req := WatchRequest{Node: f.node, Epoch: f.epoch, After: f.rev, Programmed: f.programmed}
	f.mu.Unlock()
	poll, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var res WatchResult
	if err := f.client.DoContext(poll, http.MethodPost, PathWatch, req, &res); err != nil {
		f.mu.Lock()
		if f.unreach == "" {
			f.unreach = time.Now().UTC().Format(time.RFC3339)
		}
		f.mu.Unlock()
		return err
	}
	f.mu.Lock()
	f.unreach = ""
	f.mu.Unlock()
	if !res.Full && res.Epoch == req.Epoch && res.Rev == req.After {
		return nil // nothing changed while the poll waited
	}
	objs, err := res.Decode()
	if err != nil {
		return fmt.Errorf("objects from the control plane: %w", err)
	}
	f.mu.Lock()
	next, changes := f.store, []model.Change(nil)
	var removed []manifest.Key
	if res.Full {
		keep := map[manifest.Key]bool{}
		for _, o := range objs {
			keep[o.Key()] = true
		}
		for _, o := range next.Objects() {
			if !keep[o.Key()] {
				removed = append(removed, o.Key())
			}
		}
	} else {
		removed = res.Deleted
	}
	next, put := next.Put(objs)
	next, gone := next.Remove(removed)
	changes = append(put, gone...)
	f.store, f.epoch, f.rev = next, res.Epoch, res.Rev
	changed := f.changed
	f.mu.Unlock()
	gen := node.Update(next, changes)
	changed()
	if err := node.Wait(ctx, gen); err != nil {
		return fmt.Errorf("programming revision %d: %w", res.Rev, err)
	}
	f.mu.Lock()
	f.programmed = res.Rev
	f.mu.Unlock()
	return nil
}

// Socket is the control plane's agent socket.
func (f *Follower) Socket() string { return f.socket }

// Store is the objects as this node last received them.
func (f *Follower) Store() *model.Store {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.store
}

// Health is "" while the control plane answers, else since when it does not.
func (f *Follower) Health() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unreach == "" {
		return ""
	}
	return fmt.Sprintf("the lab's control plane at %s: unreachable since %s; the datapath keeps its last state", f.socket, f.unreach)
}

// Kubelet is this node's kubelet: it runs the pods the control plane
// placed here and writes their status back there.
func (f *Follower) Kubelet(cfg Config, ready func(context.Context, []*corev1.Pod) error) (*APIKubelet, error) {
	return newAPIKubelet(cfg, followerPods{f}, false, ready)
}

// followerPods are the pods of the lab's control plane, as a kubelet of a
// joining node sees them.
type followerPods struct{ f *Follower }

func (fp followerPods) run(_ context.Context, changed func()) error {
	fp.f.mu.Lock()
	defer fp.f.mu.Unlock()
	fp.f.changed = changed
	return nil
}

func (fp followerPods) pods() []*corev1.Pod { return fp.f.Store().Pods() }

// bind: the control plane places every pod when it is created.
func (fp followerPods) bind(context.Context, *corev1.Pod, string) error { return nil }

// remove: the lab deletes pods at once, without a grace period.
func (fp followerPods) remove(context.Context, *corev1.Pod) error { return nil }

func (fp followerPods) updateStatus(ctx context.Context, p *corev1.Pod) error {
	path := PathPodStatus + url.PathEscape(p.Namespace) + "/" + url.PathEscape(p.Name) + "/status?node=" + url.QueryEscape(fp.f.node)
	err := fp.f.client.DoContext(ctx, http.MethodPut, path, p, nil)
	var se *api.StatusError
	if errors.As(err, &se) && (se.Code == http.StatusNotFound || se.Code == http.StatusConflict) {
		return nil // the next pass writes it against the newer pod
	}
	if err != nil {
		return fmt.Errorf("writing the status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}
