package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/shuntnet/shunt/internal/kubetest"
)

// TestClusterDNS: the cluster DNS of `shunt dev cluster up --dns` (CoreDNS
// built from its module, its kubernetes plugin reading the API server)
// runs on a lab node as Service kube-system/kube-dns, and a pod of that
// node, whose resolv.conf the lab kubelet writes for dnsPolicy
// ClusterFirst, resolves a Service by its full name and by its short name
// from its namespace (the search list), a headless Service's pods and a
// pod's hostname.subdomain record; kube-dns answers over UDP and TCP. The
// pod's /etc/hosts is kubelet's.
func TestClusterDNS(t *testing.T) {
	c := newKubeCluster(t)
	kubetest.Program(t, "coredns") // before the agent starts: it maps the image then
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dnsIP, err := c.DeployDNS(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	netns, addrs, _ := newUnderlay(t, 1)
	n := newCrossNode(t, c, netns[0], addrs[0], overlayRouting, "--cluster-dns", dnsIP.String())

	const ns = "shop"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := map[string]string{"app": "web"}
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: web, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-hl"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: web, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sleeper := func(name string, labels map[string]string, hostname, subdomain string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Spec: corev1.PodSpec{
			NodeName: n.node, Hostname: hostname, Subdomain: subdomain,
			Containers: []corev1.Container{{Name: "c", Image: "lab", Command: []string{"sleep", "infinity"}}}}}
	}
	webIP := createPodAndWait(t, n, sleeper("web-0", web, "web-0", "web-hl"))
	createPodAndWait(t, n, sleeper("client", nil, "", ""))
	waitDNSReady(t, n)

	inPod := func(pod string, argv ...string) (string, error) {
		out, code := n.shunt(append([]string{"lab", "exec", pod, "-n", ns, "--"}, argv...)...)
		if code != 0 {
			return out, fmt.Errorf("exit %d", code)
		}
		return out, nil
	}
	resolv, err := inPod("client", "cat", "/etc/resolv.conf")
	if err != nil {
		t.Fatalf("cat /etc/resolv.conf in the pod: %v\n%s", err, resolv)
	}
	if !strings.HasPrefix(resolv, "search shop.svc.cluster.local svc.cluster.local cluster.local") ||
		!strings.Contains(resolv, "nameserver "+dnsIP.String()+"\n") || !strings.Contains(resolv, "options ndots:5\n") {
		t.Errorf("the pod's resolv.conf is not ClusterFirst's:\n%s", resolv)
	}
	hosts, err := inPod("web-0", "cat", "/etc/hosts")
	if err != nil || !strings.Contains(hosts, webIP+"\tweb-0.web-hl.shop.svc.cluster.local\tweb-0\n") {
		t.Errorf("web-0's /etc/hosts (%v) has not its FQDN line:\n%s", err, hosts)
	}

	server := "@" + dnsIP.String()
	for _, q := range []struct {
		what string
		argv []string
		want string
	}{
		{"a Service by its full name (the pod's resolver)", []string{"getent", "hosts", "web.shop.svc.cluster.local"}, svc.Spec.ClusterIP + " "},
		{"a Service by its short name, through the search list", []string{"getent", "hosts", "web"}, svc.Spec.ClusterIP + " "},
		{"a Service over UDP", []string{"dig", "+short", "+notcp", "+time=2", "+tries=1", server, "web.shop.svc.cluster.local"}, svc.Spec.ClusterIP + "\n"},
		{"a Service over TCP", []string{"dig", "+short", "+tcp", "+time=2", "+tries=1", server, "web.shop.svc.cluster.local"}, svc.Spec.ClusterIP + "\n"},
		{"a headless Service's pods", []string{"dig", "+short", "+time=2", "+tries=1", server, "web-hl.shop.svc.cluster.local"}, webIP + "\n"},
		{"a pod by hostname.subdomain", []string{"getent", "hosts", "web-0.web-hl"}, webIP + " "},
		{"the kubernetes Service", []string{"getent", "hosts", "kubernetes.default"}, ""},
	} {
		var out string
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			out, err = inPod("client", q.argv...)
			return err == nil && strings.Contains(out, q.want), nil
		})
		if err != nil {
			t.Errorf("%s: %q gave %q, want %q", q.what, strings.Join(q.argv, " "), out, q.want)
		}
	}
}

// createPodAndWait creates the pod and waits until it runs; its address.
func createPodAndWait(t *testing.T, n *kubeNode, pod *corev1.Pod) string {
	t.Helper()
	pods := n.cs.CoreV1().Pods(pod.Namespace)
	if err := wait.PollUntilContextCancel(n.ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "serviceaccount") {
			return false, nil // the namespace's default service account comes a moment later
		}
		return err == nil, err
	}); err != nil {
		t.Fatalf("creating pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return n.podIPOf(pod.Namespace, waitPodRunning(t, n, pod.Namespace, pod.Name, false).Name)
}

// waitPodRunning waits until the pod runs (and, with ready, is Ready).
func waitPodRunning(t *testing.T, n *kubeNode, ns, name string, ready bool) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	if err := wait.PollUntilContextTimeout(n.ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if p, err = n.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, nil
		}
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return false, nil
		}
		if !ready {
			return true, nil
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("pod %s/%s never ran (ready %v): %v (status %+v)", ns, name, ready, err, p)
	}
	return p
}

// waitDNSReady waits until CoreDNS runs and is Ready (its ready plugin
// answers once the kubernetes plugin has listed the API).
func waitDNSReady(t *testing.T, n *kubeNode) {
	t.Helper()
	waitPodRunning(t, n, metav1.NamespaceSystem, "coredns", true)
}
