// Package manifest reads Kubernetes manifests (YAML or JSON) into the typed
// objects of k8s.io/api, the same types a real cluster uses. Decoding is
// strict, as the API server's is: unknown kinds, unknown or duplicate fields
// and wrong apiVersions are errors. Every problem is reported with the file,
// the document, the object and the field it concerns.
package manifest

import (
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
)

// Object is one parsed manifest document.
type Object struct {
	// Source is where the object came from: "path/file.yaml#2" (the 1-based
	// index of the document within the file) or "<stdin>#1". Items of a
	// List get " items[i]" appended.
	Source string
	// Obj is one of *corev1.Namespace, *corev1.Pod, *corev1.Service,
	// *discoveryv1.EndpointSlice, *networkingv1.NetworkPolicy,
	// *ShuntNetworkPolicy, *gatewayv1.HTTPRoute, *gatewayv1.GRPCRoute,
	// *gatewayv1beta1.ReferenceGrant or *corev1.Node.
	Obj runtime.Object
}

// Kind is the object's kind, e.g. "Pod". It comes from the Go type, so it is
// right even for objects built in code without TypeMeta.
func (o Object) Kind() string {
	if k, ok := kindByType[reflect.TypeOf(o.Obj)]; ok {
		return k.kind
	}
	if o.Obj == nil {
		return ""
	}
	return o.Obj.GetObjectKind().GroupVersionKind().Kind
}

// NamespaceName returns the object's namespace ("" for cluster-scoped kinds)
// and name.
func (o Object) NamespaceName() (ns, name string) {
	m, ok := o.Obj.(metav1.Object)
	if !ok {
		return "", ""
	}
	return m.GetNamespace(), m.GetName()
}

// Kinds of object, as the API names them.
const (
	KindNamespace          = "Namespace"
	KindPod                = "Pod"
	KindService            = "Service"
	KindEndpointSlice      = "EndpointSlice"
	KindNetworkPolicy      = "NetworkPolicy"
	KindShuntNetworkPolicy = "ShuntNetworkPolicy"
	KindHTTPRoute          = "HTTPRoute"
	KindGRPCRoute          = "GRPCRoute"
	KindReferenceGrant     = "ReferenceGrant"
	KindNode               = "Node"
)

// GatewayAPIVersion is the apiVersion of the Gateway API kinds (HTTPRoute,
// GRPCRoute).
const GatewayAPIVersion = "gateway.networking.k8s.io/v1"

// ReferenceGrantVersion is ReferenceGrant's apiVersion: v1beta1, which
// every release of its CRD serves (and stores, up to v1.6 at least).
const ReferenceGrantVersion = "gateway.networking.k8s.io/v1beta1"

// Key identifies one object: its kind, namespace ("" for cluster-scoped
// kinds) and name. It is the one key type of every object set (the store,
// the journal, changes, errors).
type Key struct {
	Kind      string
	Namespace string
	Name      string
}

// String is "Pod/default/web", and "Namespace//prod" for cluster-scoped
// kinds: the form the API's change lists and the journal use.
func (k Key) String() string { return k.Kind + "/" + k.Namespace + "/" + k.Name }

// NamespacedName is "ns/name", or "name" for cluster-scoped kinds.
func (k Key) NamespacedName() string {
	if k.Namespace == "" {
		return k.Name
	}
	return k.Namespace + "/" + k.Name
}

// Compare orders keys by kind, namespace, name.
func (k Key) Compare(o Key) int {
	if c := strings.Compare(k.Kind, o.Kind); c != 0 {
		return c
	}
	if c := strings.Compare(k.Namespace, o.Namespace); c != 0 {
		return c
	}
	return strings.Compare(k.Name, o.Name)
}

// Key identifies the object.
func (o Object) Key() Key {
	ns, name := o.NamespaceName()
	if k, ok := kindByType[reflect.TypeOf(o.Obj)]; ok && !k.namespaced {
		ns = ""
	}
	return Key{o.Kind(), ns, name}
}

// label names the object in error messages: "Pod default/web".
func (o Object) label() string {
	ns, name := o.NamespaceName()
	return objectLabel(o.Kind(), ns, name)
}

// kindInfo is everything the package knows about one supported kind; the
// table below is the single place to add a kind.
type kindInfo struct {
	kind       string
	apiVersion string
	namespaced bool
	nameRule   func(string) []string // validation of metadata.name
	newObj     func() runtime.Object
	defaults   func(runtime.Object)
	check      func(*checker, runtime.Object)
}

// register builds a kindInfo from functions typed on the kind's Go type,
// so the per-kind code needs no type assertions.
func register[T any, P interface {
	*T
	runtime.Object
}](kind, apiVersion string, namespaced bool, nameRule func(string) []string, def func(P), check func(*checker, P)) kindInfo {
	return kindInfo{
		kind:       kind,
		apiVersion: apiVersion,
		namespaced: namespaced,
		nameRule:   nameRule,
		newObj:     func() runtime.Object { return P(new(T)) },
		defaults: func(o runtime.Object) {
			if def != nil {
				def(o.(P))
			}
		},
		check: func(c *checker, o runtime.Object) {
			if check != nil {
				check(c, o.(P))
			}
		},
	}
}

// kinds lists the supported kinds. Names follow the API server: Services and
// Namespaces become DNS labels (they are used as DNS names), the rest may be
// subdomains.
var kinds = []kindInfo{
	register[corev1.Namespace]("Namespace", "v1", false, validation.IsDNS1123Label, nil, nil),
	register[corev1.Pod]("Pod", "v1", true, validation.IsDNS1123Subdomain, defaultPod, checkPod),
	register[corev1.Service]("Service", "v1", true, validation.IsDNS1123Label, defaultService, checkService),
	register[discoveryv1.EndpointSlice]("EndpointSlice", "discovery.k8s.io/v1", true, validation.IsDNS1123Subdomain, defaultEndpointSlice, checkEndpointSlice),
	register[networkingv1.NetworkPolicy]("NetworkPolicy", "networking.k8s.io/v1", true, validation.IsDNS1123Subdomain, defaultNetworkPolicy, checkNetworkPolicy),
	register[ShuntNetworkPolicy]("ShuntNetworkPolicy", ShuntAPIVersion, true, validation.IsDNS1123Subdomain, defaultShuntPolicy, checkShuntPolicy),
	register[gatewayv1.HTTPRoute]("HTTPRoute", GatewayAPIVersion, true, validation.IsDNS1123Subdomain, defaultHTTPRoute, checkHTTPRoute),
	register[gatewayv1.GRPCRoute]("GRPCRoute", GatewayAPIVersion, true, validation.IsDNS1123Subdomain, defaultGRPCRoute, checkGRPCRoute),
	register[gatewayv1beta1.ReferenceGrant]("ReferenceGrant", ReferenceGrantVersion, true, validation.IsDNS1123Subdomain, nil, checkReferenceGrant),
	register[corev1.Node]("Node", "v1", false, validation.IsDNS1123Subdomain, nil, checkNode),
}

var (
	kindByName = map[string]*kindInfo{}
	kindByType = map[reflect.Type]*kindInfo{}
)

func init() {
	for i := range kinds {
		k := &kinds[i]
		kindByName[k.kind] = k
		kindByType[reflect.TypeOf(k.newObj())] = k
	}
}

// APIVersion returns the apiVersion of a supported kind, e.g.
// "networking.k8s.io/v1" for NetworkPolicy.
func APIVersion(kind string) (string, bool) {
	k, ok := kindByName[kind]
	if !ok {
		return "", false
	}
	return k.apiVersion, true
}

// supportedKinds lists "apiVersion Kind" pairs for error messages.
func supportedKinds() string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.apiVersion + " " + k.kind
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
