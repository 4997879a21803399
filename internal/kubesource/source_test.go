package kubesource_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/shuntnet/shunt/internal/kubesource"
	"github.com/shuntnet/shunt/internal/kubetest"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// recorder is the reconciler's side of the contract: it keeps the last
// store and counts the updates.
type recorder struct {
	mu      sync.Mutex
	store   *model.Store
	updates int
	changes []model.Change
}

func (r *recorder) Update(next *model.Store, changes []model.Change) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.store = next
	r.updates++
	r.changes = append(r.changes, changes...)
	return uint64(r.updates)
}

func (r *recorder) last() *model.Store {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.store == nil {
		return model.New()
	}
	return r.store
}

// eventually polls cond for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSourceFollowsTheAPIServer: against a real API server and
// controller-manager, the source's store holds what the API holds (the
// ClusterIP the API server assigned, the EndpointSlice the controller
// wrote, an HTTPRoute of an installed CRD), slimmed of what shunt never
// reads, and follows updates and deletes.
func TestSourceFollowsTheAPIServer(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := c.Client
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	c.Apply(t, "../../deploy/crds/gateway.networking.k8s.io_httproutes.yaml")
	c.Apply(t, "../../deploy/crds/gateway.networking.k8s.io_referencegrants.yaml")

	rec := &recorder{}
	src, err := kubesource.New(kubesource.Config{REST: c.RESTConfig()}, rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if err := src.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the default namespace", func() bool { return rec.last().HasNamespace("default") })

	// The EndpointSlice controller skips pods of nodes it does not know.
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Once node IPAM gave it a pod CIDR, the controller-manager's shared
	// node informer has it, so the EndpointSlice controller will not skip
	// the pod (and back off for tens of seconds) on a busy machine.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		return err == nil && n.Spec.PodCIDR != "", nil
	}); err != nil {
		t.Fatalf("node-a never got a pod CIDR: %v", err)
	}
	// Its address, as a kubelet reports it: the tunnel endpoint of its pods.
	node, err := cs.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.50.11"}}
	node.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.example/busybox:1"}, SizeBytes: 1 << 20}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{"shunt.io/inbound-redirect": "8080:15006"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{
			Name: "web", Image: "lab", Command: []string{"serve"}, Env: []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("x", 4096)}},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		}}},
	}
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pod, err = cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "serviceaccount") {
			return false, nil // the service account controller has not made "default" yet
		}
		return err == nil, err
	}); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.10", PodIPs: []corev1.PodIP{{IP: "10.244.0.10"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}}
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	route := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": manifest.GatewayAPIVersion, "kind": "HTTPRoute",
		"metadata": map[string]any{"name": "split", "namespace": "default"},
		"spec": map[string]any{
			"parentRefs": []any{map[string]any{"group": "", "kind": "Service", "name": "web", "port": int64(80)}},
			"rules":      []any{map[string]any{"backendRefs": []any{map[string]any{"name": "web", "port": int64(80)}}}},
		},
	}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}).
		Namespace("default").Create(ctx, route, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	grant := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": manifest.ReferenceGrantVersion, "kind": "ReferenceGrant",
		"metadata": map[string]any{"name": "routes-of-shop", "namespace": "default"},
		"spec": map[string]any{
			"from": []any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop"}},
			"to":   []any{map[string]any{"group": "", "kind": "Service", "name": "web"}},
		},
	}}
	if _, err := dyn.Resource(kubesource.ReferenceGrantGVR).Namespace("default").Create(ctx, grant, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually(t, "the service, its EndpointSlice with the pod, the pod's address, the route and the grant", func() bool {
		s := rec.last()
		got, ok := s.Service("default", "web")
		if !ok || got.Spec.ClusterIP != svc.Spec.ClusterIP {
			return false
		}
		p, ok := s.Pod("default", "web-0")
		if !ok || p.Status.PodIP != "10.244.0.10" {
			return false
		}
		nodes := s.Nodes()
		if len(nodes) != 1 || nodes[0].Spec.PodCIDR == "" || len(nodes[0].Status.Addresses) != 1 {
			return false
		}
		slices := s.EndpointSlicesFor("default", "web")
		return len(slices) == 1 && len(slices[0].Endpoints) == 1 && slices[0].Endpoints[0].Addresses[0] == "10.244.0.10" &&
			len(s.HTTPRoutesIn("default")) == 1 && len(s.ReferenceGrants()) == 1
	})
	s := rec.last()
	p, _ := s.Pod("default", "web-0")
	if p.ManagedFields != nil || p.Spec.Containers[0].Env != nil || p.Spec.Containers[0].Command != nil {
		t.Errorf("pod kept fields shunt never reads: managedFields %d, env %v, command %v", len(p.ManagedFields), p.Spec.Containers[0].Env != nil, p.Spec.Containers[0].Command)
	}
	if p.Spec.NodeName != "node-a" || p.Spec.Containers[0].Ports[0].Name != "http" || p.Annotations["shunt.io/inbound-redirect"] != "8080:15006" {
		t.Errorf("pod lost fields shunt reads: %+v", p)
	}
	if n := s.Nodes()[0]; n.Status.Images != nil || n.ManagedFields != nil {
		t.Errorf("node kept fields shunt never reads: images %v, managedFields %d", n.Status.Images, len(n.ManagedFields))
	}
	rt := s.HTTPRoutesIn("default")[0]
	if len(rt.Spec.ParentRefs) != 1 || string(rt.Spec.ParentRefs[0].Name) != "web" {
		t.Errorf("HTTPRoute decoded as %+v", rt.Spec)
	}
	if g := s.ReferenceGrants()[0]; len(g.Spec.From) != 1 || g.Spec.From[0].Namespace != "shop" || g.Spec.To[0].Name == nil || *g.Spec.To[0].Name != "web" {
		t.Errorf("ReferenceGrant decoded as %+v", g.Spec)
	}
	if ok, detail := src.Health(); !ok {
		t.Errorf("health: %s", detail)
	}

	if err := cs.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the service's removal", func() bool {
		_, ok := rec.last().Service("default", "web")
		return !ok
	})
}
