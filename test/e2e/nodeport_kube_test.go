package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestKubernetesNodePort: a node of a real API server (its own network
// namespace on an underlay, a second namespace there being a host
// outside the cluster) programs a NodePort Service and a LoadBalancer
// Service with externalTrafficPolicy Local from the objects as the API
// server allocated them (nodePorts, health check port): the outside host
// reaches the NodePort on the node's address and the backend sees its
// address; the health check answers 200 with one local endpoint; the
// LoadBalancer's source ranges refuse the outside host at the address a
// controller wrote in its status until the host is added to them; an
// internalTrafficPolicy Local ClusterIP reaches the node's endpoint; and
// `shunt status` names none of them as left out.
func TestKubernetesNodePort(t *testing.T) {
	c := newKubeCluster(t)
	netns, addrs, _ := newUnderlay(t, 2)
	k := newCrossNode(t, c, netns[0], addrs[0], overlayRouting)
	outside := netns[1]
	k.runPod("default", "web", map[string]string{"app": "web"}, "shunt", "lab", "serve", "--http", "8080")

	create := func(svc *corev1.Service) *corev1.Service {
		t.Helper()
		out, err := k.cs.CoreV1().Services("default").Create(k.ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	port := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
	np := create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"}, Ports: port}})
	lb := create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ranges"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "web"}, Ports: port,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, LoadBalancerSourceRanges: []string{"198.51.100.0/24"}}})
	if np.Spec.Ports[0].NodePort == 0 || lb.Spec.HealthCheckNodePort == 0 {
		t.Fatalf("the API server allocated nodePort %d, health check port %d", np.Spec.Ports[0].NodePort, lb.Spec.HealthCheckNodePort)
	}

	get := func(url string) (string, string) {
		out, err := exec.Command("ip", "netns", "exec", outside, filepath.Join(binDir, "shunt"), "lab", "http-get", "--timeout", "2s", url).CombinedOutput()
		if err != nil {
			return "", string(out)
		}
		status, body, _ := strings.Cut(string(out), "\n")
		return status, strings.TrimSpace(body)
	}
	body := eventually(t, "NodePort from outside", "200", func() (string, string) {
		return get(fmt.Sprintf("http://%s:%d/remote", addrs[0], np.Spec.Ports[0].NodePort))
	})
	if host, _, _ := strings.Cut(body, ":"); host != addrs[1] {
		t.Errorf("the backend saw %q, want the outside host %s (its backend is on the node: no SNAT)", body, addrs[1])
	}
	body = eventually(t, "health check", "200", func() (string, string) {
		return get(fmt.Sprintf("http://%s:%d/", addrs[0], lb.Spec.HealthCheckNodePort))
	})
	var hc struct {
		Service        struct{ Namespace, Name string }
		LocalEndpoints int
	}
	if err := json.Unmarshal([]byte(body), &hc); err != nil || hc.Service.Name != "ranges" || hc.LocalEndpoints != 1 {
		t.Errorf("health check body %q (%v), want Service default/ranges with one local endpoint", body, err)
	}

	// The source ranges guard the load balancer address a controller
	// writes in the status (routed to the node by the outside host): the
	// outside host is not in them, then it is.
	lbAddr := "192.0.2.200"
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbAddr}}
	lb, err := k.cs.CoreV1().Services("default").UpdateStatus(k.ctx, lb, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "-n", outside, "route", "replace", lbAddr+"/32", "via", addrs[0]).CombinedOutput(); err != nil {
		t.Fatalf("routing the load balancer address: %v: %s", err, out)
	}
	lbURL := "http://" + lbAddr + ":80/remote"
	// Its NodePort stays open to every client, as kube-proxy's: once it
	// answers, the Service is programmed with its ranges.
	eventually(t, "the ranged Service's NodePort", "200", func() (string, string) {
		return get(fmt.Sprintf("http://%s:%d/remote", addrs[0], lb.Spec.Ports[0].NodePort))
	})
	eventually(t, "load balancer address, client outside the ranges", "", func() (string, string) { return get(lbURL) })
	lb.Spec.LoadBalancerSourceRanges = append(lb.Spec.LoadBalancerSourceRanges, addrs[1]+"/32")
	if _, err := k.cs.CoreV1().Services("default").Update(k.ctx, lb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "load balancer address, client in the ranges", "200", func() (string, string) { return get(lbURL) })

	// internalTrafficPolicy Local: the ClusterIP of a Service whose one
	// endpoint is on this node reaches it from the node.
	local := corev1.ServiceInternalTrafficPolicyLocal
	itp := create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "near"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: port, InternalTrafficPolicy: &local}})
	eventually(t, "internalTrafficPolicy Local ClusterIP from the node", "200", func() (string, string) {
		out, err := exec.Command("ip", "netns", "exec", netns[0], filepath.Join(binDir, "shunt"), "lab", "http-get", "--timeout", "2s",
			"http://"+itp.Spec.ClusterIP+"/").CombinedOutput()
		if err != nil {
			return "", string(out)
		}
		status, body, _ := strings.Cut(string(out), "\n")
		return status, body
	})
	if st := k.mustShunt("status"); strings.Contains(st, "loadBalancerSourceRanges") || strings.Contains(st, "internalTrafficPolicy") {
		t.Errorf("shunt status names implemented fields as left out:\n%s", st)
	}
}

// TestKubernetesNodePortWithoutMasquerade: a node of a real API server
// without --masquerade gives its pods a default route through it (as
// every CNI plugin does), so a NodePort's backend on the ingress node
// answers a host outside the cluster, whose address it sees; the pod's
// routing table shows the default route via its gateway.
func TestKubernetesNodePortWithoutMasquerade(t *testing.T) {
	c := newKubeCluster(t)
	netns, addrs, _ := newUnderlay(t, 2)
	r := overlayRouting
	r.noMasquerade = true
	k := newCrossNode(t, c, netns[0], addrs[0], r)
	outside := netns[1]
	k.runPod("default", "web", map[string]string{"app": "web"}, "shunt", "lab", "serve", "--http", "8080")
	np, err := k.cs.CoreV1().Services("default").Create(k.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	route, code := k.shunt("lab", "exec", "web", "--", "ip", "-4", "route", "show", "default")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(route), "default via ") {
		t.Errorf("the pod's default route: exit %d, %q; want one via its gateway", code, route)
	}
	body := eventually(t, "NodePort from outside, backend on the ingress node, no masquerade", "200", func() (string, string) {
		out, err := exec.Command("ip", "netns", "exec", outside, filepath.Join(binDir, "shunt"), "lab", "http-get", "--timeout", "2s",
			fmt.Sprintf("http://%s:%d/remote", addrs[0], np.Spec.Ports[0].NodePort)).CombinedOutput()
		if err != nil {
			return "", string(out)
		}
		status, body, _ := strings.Cut(string(out), "\n")
		return status, strings.TrimSpace(body)
	})
	if host, _, _ := strings.Cut(body, ":"); host != addrs[1] {
		t.Errorf("the backend saw %q, want the outside host %s", body, addrs[1])
	}
}
