// Package kubeclient is the agent's Kubernetes API client: typed access to
// the few kinds shunt reads and writes (core/v1, coordination/v1,
// discovery/v1, networking/v1), encoded and decoded with a scheme that knows only them.
//
// Why not client-go's clientset: every typed client of
// k8s.io/client-go/kubernetes (and its informers and discovery packages)
// imports k8s.io/client-go/kubernetes/scheme, which registers all ~55 API
// groups. That links their code into the binary and runs their
// registrations at start: about 9 MiB of the agent's resident memory on a
// node, for kinds it never reads (issue 15's budget is 100 MiB at 10 000
// Services). The clients here are client-go's own generic ones (gentype)
// and its informers (tools/cache), over REST clients built for this
// smaller scheme, so behaviour (retries, watch bookmarks, relists) is
// client-go's. Tests and tools that are not the agent keep the clientset.
package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Scheme holds the kinds of the groups the agent uses, and nothing else.
var (
	Scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, coordinationv1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme} {
		utilruntime.Must(add(Scheme))
	}
	// ListOptions and friends, as query parameters.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
}

// Client talks to one API server.
type Client struct {
	core, coordination, disco, netpolicy rest.Interface
	// raw has no group: discovery documents and /readyz.
	raw rest.Interface
}

// New builds the clients for the configuration (kubesource.RESTConfig or a
// kubeconfig of the caller's).
func New(rc *rest.Config) (*Client, error) {
	c := &Client{}
	var err error
	if c.core, err = restFor(rc, corev1.SchemeGroupVersion, "/api"); err != nil {
		return nil, err
	}
	if c.coordination, err = restFor(rc, coordinationv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if c.disco, err = restFor(rc, discoveryv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if c.netpolicy, err = restFor(rc, networkingv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if c.raw, err = restFor(rc, schema.GroupVersion{}, "/"); err != nil {
		return nil, err
	}
	return c, nil
}

func restFor(rc *rest.Config, gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
	cfg := rest.CopyConfig(rc)
	cfg.APIPath = apiPath
	if !gv.Empty() {
		cfg.GroupVersion = &gv
	}
	cfg.NegotiatedSerializer = codecs.WithoutConversion()
	if !gv.Empty() {
		// Protobuf, as kube-proxy and kubelet ask for: it decodes with a
		// fraction of JSON's allocations, which at 20 000 objects is the
		// difference between the heap's peak at a cold sync and what it
		// keeps (custom kinds have no protobuf: they use the dynamic client).
		cfg.ContentType = runtime.ContentTypeProtobuf
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	var (
		c   rest.Interface
		err error
	)
	if gv.Empty() {
		c, err = rest.UnversionedRESTClientFor(cfg)
	} else {
		c, err = rest.RESTClientFor(cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s (%s): %w", rc.Host, gv, err)
	}
	return c, nil
}

// Typed clients of the kinds the agent writes or reads one by one.

func (c *Client) Pods(namespace string) *gentype.ClientWithList[*corev1.Pod, *corev1.PodList] {
	return gentype.NewClientWithList[*corev1.Pod, *corev1.PodList]("pods", c.core, parameterCodec, namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })
}

func (c *Client) Nodes() *gentype.ClientWithList[*corev1.Node, *corev1.NodeList] {
	return gentype.NewClientWithList[*corev1.Node, *corev1.NodeList]("nodes", c.core, parameterCodec, "",
		func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} })
}

// ConfigMaps and Secrets are what the lab kubelet reads for a pod's
// configMap and secret volumes.
func (c *Client) ConfigMaps(namespace string) *gentype.ClientWithList[*corev1.ConfigMap, *corev1.ConfigMapList] {
	return gentype.NewClientWithList[*corev1.ConfigMap, *corev1.ConfigMapList]("configmaps", c.core, parameterCodec, namespace,
		func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} })
}

func (c *Client) Secrets(namespace string) *gentype.ClientWithList[*corev1.Secret, *corev1.SecretList] {
	return gentype.NewClientWithList[*corev1.Secret, *corev1.SecretList]("secrets", c.core, parameterCodec, namespace,
		func() *corev1.Secret { return &corev1.Secret{} }, func() *corev1.SecretList { return &corev1.SecretList{} })
}

// Leases are coordination.k8s.io Leases: a kubelet's heartbeat is its
// node's Lease in namespace kube-node-lease.
func (c *Client) Leases(namespace string) *gentype.ClientWithList[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return gentype.NewClientWithList[*coordinationv1.Lease, *coordinationv1.LeaseList]("leases", c.coordination, parameterCodec, namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} }, func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
}

// BindPod assigns a pod to a node, as kube-scheduler does (the pods/binding
// subresource).
func (c *Client) BindPod(ctx context.Context, b *corev1.Binding) error {
	return c.core.Post().Namespace(b.Namespace).Resource("pods").Name(b.Name).SubResource("binding").
		VersionedParams(&metav1.CreateOptions{}, parameterCodec).Body(b).Do(ctx).Error()
}

// EventSink writes Events for client-go's event recorder
// (record.EventBroadcaster.StartRecordingToSink), each in its object's
// namespace.
func (c *Client) EventSink() *EventSink { return &EventSink{core: c.core} }

type EventSink struct{ core rest.Interface }

func (s *EventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.core.Post().NamespaceIfScoped(e.Namespace, e.Namespace != "").Resource("events").Body(e).
		Do(context.Background()).Into(out)
	return out, err
}

func (s *EventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.core.Put().NamespaceIfScoped(e.Namespace, e.Namespace != "").Resource("events").Name(e.Name).Body(e).
		Do(context.Background()).Into(out)
	return out, err
}

func (s *EventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.core.Patch(types.StrategicMergePatchType).NamespaceIfScoped(e.Namespace, e.Namespace != "").
		Resource("events").Name(e.Name).Body(data).Do(context.Background()).Into(out)
	return out, err
}

// Informers of the kinds the agent watches. Each has its own cache: the
// agent needs one informer per kind, so a shared factory would add only
// its bookkeeping.

// Kind is a watched resource and the Go type of its objects.
type Kind struct {
	Resource string
	Object   runtime.Object
	client   func(*Client) rest.Interface
}

var (
	Namespaces      = Kind{"namespaces", &corev1.Namespace{}, func(c *Client) rest.Interface { return c.core }}
	Pods            = Kind{"pods", &corev1.Pod{}, func(c *Client) rest.Interface { return c.core }}
	Services        = Kind{"services", &corev1.Service{}, func(c *Client) rest.Interface { return c.core }}
	Nodes           = Kind{"nodes", &corev1.Node{}, func(c *Client) rest.Interface { return c.core }}
	EndpointSlices  = Kind{"endpointslices", &discoveryv1.EndpointSlice{}, func(c *Client) rest.Interface { return c.disco }}
	NetworkPolicies = Kind{"networkpolicies", &networkingv1.NetworkPolicy{}, func(c *Client) rest.Interface { return c.netpolicy }}
)

// Informer watches every object of a kind, in every namespace.
func (c *Client) Informer(k Kind, resync time.Duration) cache.SharedIndexInformer {
	lw := cache.NewListWatchFromClient(k.client(c), k.Resource, metav1.NamespaceAll, fields.Everything())
	// No namespace index (the typed factories add one): nothing here lists
	// by namespace, and at 10 000 Services and slices it is 20 000 keys.
	return cache.NewSharedIndexInformer(lw, k.Object, resync, cache.Indexers{})
}

// DynamicInformer watches a custom kind through the dynamic client (as
// client-go's dynamicinformer, which imports every API group through its
// informer factory).
func DynamicInformer(dyn dynamic.Interface, gvr schema.GroupVersionResource, resync time.Duration) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return dyn.Resource(gvr).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return dyn.Resource(gvr).Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, resync, cache.Indexers{})
}

// Serves says whether the API server serves a resource (a custom kind's
// CRD is installed): the group version's discovery document lists it.
func (c *Client) Serves(ctx context.Context, gvr schema.GroupVersionResource) (bool, error) {
	body, err := c.raw.Get().AbsPath("/apis", gvr.Group, gvr.Version).Do(ctx).Raw()
	if err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(body, &list); err != nil {
		return false, fmt.Errorf("discovery document of %s: %w", gvr.GroupVersion(), err)
	}
	for _, r := range list.APIResources {
		if r.Name == gvr.Resource {
			return true, nil
		}
	}
	return false, nil
}

// Ready asks the API server's readiness endpoint.
func (c *Client) Ready(ctx context.Context) error {
	return c.raw.Get().AbsPath("/readyz").Do(ctx).Error()
}
