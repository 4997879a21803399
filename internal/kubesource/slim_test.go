package kubesource

import (
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shuntnet/shunt/internal/services"
)

// TestSlimEndpointSliceBalancesAlike: the slimmed slice gives the service
// table exactly the backends the original gives (ready, serving and
// terminating endpoints alike), with fewer endpoints, and the original is
// left as it was.
func TestSlimEndpointSliceBalancesAlike(t *testing.T) {
	yes, no := true, false
	port, name, proto := int32(8080), "http", corev1.ProtocolTCP
	ep := func(addr string, ready, serving, terminating *bool) discoveryv1.Endpoint {
		node := "node-1"
		return discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: addr},
			Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}}
	}
	orig := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-abc", Namespace: "default", ResourceVersion: "7",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
		Endpoints: []discoveryv1.Endpoint{
			ep("10.0.0.1", &yes, &yes, &no), ep("10.0.0.2", &yes, &yes, &no), ep("10.0.0.3", &no, &yes, &yes),
			ep("10.0.0.4", &yes, &yes, &no), ep("10.0.0.5", nil, nil, nil), ep("10.0.0.6", &no, &no, &yes),
		},
	}
	before := orig.DeepCopy()
	o, err := slimEndpointSlice(orig)
	if err != nil {
		t.Fatal(err)
	}
	slim := o.(*discoveryv1.EndpointSlice)
	if !reflect.DeepEqual(orig, before) {
		t.Error("slimming changed the original slice")
	}
	if len(slim.Endpoints) != 4 || len(slim.Endpoints[0].Addresses) != 3 {
		t.Errorf("endpoints not merged by conditions: %+v", slim.Endpoints)
	}
	if slim.Labels[discoveryv1.LabelServiceName] != "web" || len(slim.Labels) != 1 || slim.ResourceVersion != "7" {
		t.Errorf("metadata: %+v", slim.ObjectMeta)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: proto}}}}
	vip := netip.MustParseAddr("10.96.0.10")
	want := services.Ports(svc, vip, []*discoveryv1.EndpointSlice{before})
	got := services.Ports(svc, vip, []*discoveryv1.EndpointSlice{slim})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("service table from the slimmed slice:\n%+v\nfrom the original:\n%+v", got, want)
	}
}

// TestSlimServiceKeepsWhatIsRead: a Service as the API server returns it
// (defaults filled in, a status) gives the service table the same ports
// and affinity once slimmed, keeps its selector and type, and loses the
// fields shunt never reads.
func TestSlimServiceKeepsWhatIsRead(t *testing.T) {
	single, local, timeout := corev1.IPFamilyPolicySingleStack, corev1.ServiceInternalTrafficPolicyCluster, int32(600)
	orig := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", ResourceVersion: "9",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
				{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolUDP}},
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}},
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &local},
		Status: corev1.ServiceStatus{Conditions: []metav1.Condition{{Type: "Ready"}}},
	}
	before := orig.DeepCopy()
	o, err := slimService(orig)
	if err != nil {
		t.Fatal(err)
	}
	slim := o.(*corev1.Service)
	if !reflect.DeepEqual(orig, before) {
		t.Error("slimming changed the original Service")
	}
	if slim.Spec.IPFamilies != nil || slim.Spec.IPFamilyPolicy != nil || slim.Spec.InternalTrafficPolicy != nil ||
		slim.Status.Conditions != nil || slim.ManagedFields != nil {
		t.Errorf("fields shunt never reads were kept: %+v", slim)
	}
	if slim.Spec.Type != corev1.ServiceTypeClusterIP || !reflect.DeepEqual(slim.Spec.Selector, orig.Spec.Selector) ||
		!reflect.DeepEqual(slim.Spec.ClusterIPs, orig.Spec.ClusterIPs) || slim.ResourceVersion != "9" {
		t.Errorf("fields shunt reads were lost: %+v", slim.Spec)
	}
	vip := netip.MustParseAddr("10.96.0.10")
	addr := "10.0.0.1"
	port, proto := int32(8080), corev1.ProtocolTCP
	slices := []*discoveryv1.EndpointSlice{{AddressType: discoveryv1.AddressTypeIPv4,
		Ports:     []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: &port, Protocol: &proto}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr}}}}}
	if got, want := services.Ports(slim, vip, slices), services.Ports(before, vip, slices); !reflect.DeepEqual(got, want) {
		t.Errorf("service table from the slimmed Service:\n%+v\nfrom the original:\n%+v", got, want)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestSlimServiceKeepsOutsideTraffic: a LoadBalancer Service keeps what
// outside traffic reads (nodePorts, externalIPs, the traffic policy, the
// health check port, the load balancer's ingress, the source ranges,
// internalTrafficPolicy Local), so that the frontends and the problems
// computed from it are the original's;
// its EndpointSlice keeps each endpoint's node.
func TestSlimServiceKeepsOutsideTraffic(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	orig := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10",
			Ports:       []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			ExternalIPs: []string{"192.0.2.7"}, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 30500,
			LoadBalancerSourceRanges: []string{"198.51.100.0/24"}, InternalTrafficPolicy: &local},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.100"}}}},
	}
	o, err := slimService(orig.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	slim := o.(*corev1.Service)
	node1, node2 := "node-1", "node-2"
	port, proto, yes := int32(8080), corev1.ProtocolTCP, true
	slice := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: &port, Protocol: &proto}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, NodeName: &node1, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.0.0.2"}, NodeName: &node2, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.0.0.3"}, NodeName: &node1, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
		}}
	so, err := slimEndpointSlice(slice.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	slimSlice := so.(*discoveryv1.EndpointSlice)
	node := services.Node{Name: "node-1", NodePortAddrs: []netip.Addr{netip.MustParseAddr("192.168.123.1")}}
	got := services.PortsFor(slim, []*discoveryv1.EndpointSlice{slimSlice}, node)
	want := services.PortsFor(orig, []*discoveryv1.EndpointSlice{slice}, node)
	if !reflect.DeepEqual(got, want) || len(got) != 4 {
		t.Errorf("frontends from the slimmed objects:\n%+v\nfrom the originals (want 4: ClusterIP, NodePort, externalIP, LB):\n%+v", got, want)
	}
	for _, p := range got {
		switch {
		case p.Kind == services.KindLoadBalancer && (len(p.SourceRanges) != 1 || p.SourceRanges[0].String() != "198.51.100.0/24"):
			t.Errorf("load balancer frontend's source ranges %v, want the Service's", p.SourceRanges)
		case p.Kind == services.KindClusterIP && len(p.Backends) != 2:
			t.Errorf("ClusterIP backends %v, want node-1's two (internalTrafficPolicy Local)", p.Backends)
		}
	}
	if g, w := services.Unsupported(slim), services.Unsupported(orig); !reflect.DeepEqual(g, w) {
		t.Errorf("problems of the slimmed Service %+v, of the original %+v: want the same", g, w)
	}
}
