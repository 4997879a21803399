package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// outsideSvc is a Service of type typ with extra spec lines (YAML flow
// entries, each ending in ", ").
func outsideSvc(name, typ, extra string) string {
	if !strings.Contains(extra, "ports:") {
		extra += "ports: [{port: 80}], "
	}
	return fmt.Sprintf("---\napiVersion: v1\nkind: Service\nmetadata: {name: %s}\nspec: {type: %s, %sselector: {app: %s}}\n", name, typ, extra, name)
}

func serviceOf(t *testing.T, cp *ControlPlane, name string) *corev1.Service {
	t.Helper()
	s, ok := cp.Store().Service("default", name)
	if !ok {
		t.Fatalf("no service %s", name)
	}
	return s
}

// TestAssignOutside: the lab's API server gives NodePort and LoadBalancer
// Services the lowest free nodePorts, a Local LoadBalancer a health check
// port, and a LoadBalancer the lowest free address of the pool in its
// status; updates keep them; a taken nodePort, a load balancer address in
// use elsewhere or outside the pool is refused with file, object and
// field, and nothing of such a request is applied.
func TestAssignOutside(t *testing.T) {
	cp, _ := newControlPlane(t)
	cp.clusterIPs.lbPool = netip.MustParsePrefix("192.168.124.0/30")
	ctx := context.Background()
	apply := func(doc string) error { _, err := cp.Apply(ctx, docs(doc)); return err }
	if err := apply(outsideSvc("np", "NodePort", "") + outsideSvc("lb", "LoadBalancer", "externalTrafficPolicy: Local, ") +
		outsideSvc("fixed", "NodePort", "ports: [{port: 80, nodePort: 30000}], ")); err != nil {
		t.Fatal(err)
	}
	// "fixed" asked for 30000 in the same request: the others take the
	// next free ones, in the order of the request.
	np, lb, fixed := serviceOf(t, cp, "np"), serviceOf(t, cp, "lb"), serviceOf(t, cp, "fixed")
	if np.Spec.Ports[0].NodePort != 30001 || lb.Spec.Ports[0].NodePort != 30002 || lb.Spec.HealthCheckNodePort != 30003 || fixed.Spec.Ports[0].NodePort != 30000 {
		t.Errorf("nodePorts np=%d lb=%d (health %d) fixed=%d", np.Spec.Ports[0].NodePort, lb.Spec.Ports[0].NodePort, lb.Spec.HealthCheckNodePort, fixed.Spec.Ports[0].NodePort)
	}
	if ing := lb.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != "192.168.124.1" {
		t.Errorf("load balancer status %+v, want 192.168.124.1 (the first host of the pool)", ing)
	}
	if np.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyCluster {
		t.Errorf("externalTrafficPolicy defaulted to %q, want Cluster", np.Spec.ExternalTrafficPolicy)
	}
	// Applied again as written: everything assigned is kept.
	if err := apply(outsideSvc("np", "NodePort", "") + outsideSvc("lb", "LoadBalancer", "externalTrafficPolicy: Local, ")); err != nil {
		t.Fatal(err)
	}
	if n, l := serviceOf(t, cp, "np"), serviceOf(t, cp, "lb"); n.Spec.Ports[0].NodePort != 30001 || l.Spec.HealthCheckNodePort != 30003 ||
		len(l.Status.LoadBalancer.Ingress) != 1 || l.Status.LoadBalancer.Ingress[0].IP != "192.168.124.1" {
		t.Errorf("reapplied: np %d, lb health %d status %+v", n.Spec.Ports[0].NodePort, l.Spec.HealthCheckNodePort, l.Status.LoadBalancer)
	}
	before := cp.Store()
	for _, tc := range []struct{ doc, want string }{
		{outsideSvc("dup", "NodePort", "ports: [{port: 80, nodePort: 30001}], "),
			"<stdin>#1: Service default/dup: spec.ports[0].nodePort: 30001/TCP is already allocated to Service default/np"},
		{outsideSvc("lb2", "LoadBalancer", "loadBalancerIP: 192.168.124.1, "),
			"<stdin>#1: Service default/lb2: spec.loadBalancerIP: 192.168.124.1 is already the load balancer address of Service default/lb"},
		{outsideSvc("far", "LoadBalancer", "loadBalancerIP: 10.1.2.3, "), "spec.loadBalancerIP: 10.1.2.3 is not in the load balancer pool 192.168.124.0/30"},
		{outsideSvc("ext", "ClusterIP", "externalIPs: [192.168.124.1], "), "spec.externalIPs[0]: 192.168.124.1 is the load balancer address of Service default/lb"},
		{outsideSvc("range", "NodePort", "ports: [{port: 80, nodePort: 80}], "), "spec.ports[0].nodePort: 80 is outside the NodePort range 30000-32767"},
		{outsideSvc("full1", "LoadBalancer", "") + outsideSvc("full2", "LoadBalancer", ""), "the load balancer pool 192.168.124.0/30 has no free address left"},
	} {
		if err := apply(tc.doc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
	if cp.Store() != before {
		t.Error("a refused request changed the objects")
	}
	// allocateLoadBalancerNodePorts false: no nodePort unless asked for;
	// the load balancer address still.
	if err := apply(outsideSvc("nonp", "LoadBalancer", "allocateLoadBalancerNodePorts: false, ports: [{name: a, port: 80}, {name: b, port: 81, nodePort: 30100}], ")); err != nil {
		t.Fatal(err)
	}
	if s := serviceOf(t, cp, "nonp"); s.Spec.Ports[0].NodePort != 0 || s.Spec.Ports[1].NodePort != 30100 || len(s.Status.LoadBalancer.Ingress) != 1 {
		t.Errorf("allocateLoadBalancerNodePorts false: nodePorts %d, %d (want 0, 30100), status %+v", s.Spec.Ports[0].NodePort, s.Spec.Ports[1].NodePort, s.Status.LoadBalancer)
	}
	// Back to ClusterIP: the nodePort goes (the API server would refuse
	// to keep it).
	if err := apply(outsideSvc("np", "ClusterIP", "")); err != nil {
		t.Fatal(err)
	}
	if p := serviceOf(t, cp, "np").Spec.Ports[0].NodePort; p != 0 {
		t.Errorf("a ClusterIP Service kept nodePort %d", p)
	}
}
