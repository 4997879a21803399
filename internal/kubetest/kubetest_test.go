package kubetest_test

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// TestControlPlane plays the kubelet against the real control plane: the API
// server assigns the ClusterIP, node IPAM the node's pod CIDR, and the
// EndpointSlice controller publishes the pod once its status says Ready.
func TestControlPlane(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := c.Client

	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "shunt-test-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}

	// A Node as a kubelet registers it: no pod CIDR, node IPAM fills it in.
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "shunt-node-"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "192.0.2.10"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a node: %v", err)
	}
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		node, err = cs.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		return err == nil && node.Spec.PodCIDR != "", err
	}); err != nil {
		t.Fatalf("node %s got no spec.podCIDR from the node IPAM controller: %v", node.Name, err)
	}
	_, podNet, err := net.ParseCIDR(node.Spec.PodCIDR)
	if err != nil {
		t.Fatalf("node %s: spec.podCIDR %q: %v", node.Name, node.Spec.PodCIDR, err)
	}
	_, clusterNet, _ := net.ParseCIDR(kubecluster.DefaultClusterCIDR)
	if ones, _ := podNet.Mask.Size(); ones != kubecluster.NodeCIDRMaskSize || !clusterNet.Contains(podNet.IP) {
		t.Fatalf("node %s: spec.podCIDR %s is not a /%d of %s", node.Name, node.Spec.PodCIDR, kubecluster.NodeCIDRMaskSize, clusterNet)
	}

	svc, err := cs.CoreV1().Services(ns.Name).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a service: %v", err)
	}
	_, svcNet, _ := net.ParseCIDR(c.ServiceCIDR)
	if ip := net.ParseIP(svc.Spec.ClusterIP); ip == nil || !svcNet.Contains(ip) {
		t.Fatalf("service %s/%s: clusterIP %q is not in the service CIDR %s", ns.Name, svc.Name, svc.Spec.ClusterIP, svcNet)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeName: node.Name,
			Containers: []corev1.Container{{
				Name: "web", Image: "lab",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			}},
		},
	}
	// Pod admission needs the namespace's default ServiceAccount, which the
	// service-account controller creates a moment after the namespace.
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pod, err = cs.CoreV1().Pods(ns.Name).Create(ctx, pod, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "serviceaccount") {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		t.Fatalf("creating pod %s/web-0: %v", ns.Name, err)
	}

	// What a kubelet writes once the pod's sandbox and containers run.
	base := podNet.IP.To4()
	podIP := net.IPv4(base[0], base[1], base[2], 10).String()
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		HostIP: "192.0.2.10", HostIPs: []corev1.HostIP{{IP: "192.0.2.10"}},
		PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}},
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "web", Image: "lab", ImageID: "lab", Ready: true, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	if _, err := cs.CoreV1().Pods(ns.Name).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("writing the status of pod %s/web-0: %v", ns.Name, err)
	}

	var slice discoveryv1.EndpointSlice
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := cs.DiscoveryV1().EndpointSlices(ns.Name).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		if err != nil {
			return false, err
		}
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				if len(ep.Addresses) == 1 && ep.Addresses[0] == podIP && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					slice = s
					return true, nil
				}
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no EndpointSlice of service %s/web lists %s as ready: %v", ns.Name, podIP, err)
	}
	ep := slice.Endpoints[0]
	if ep.NodeName == nil || *ep.NodeName != node.Name || ep.TargetRef == nil || ep.TargetRef.Name != "web-0" {
		t.Errorf("endpoint %+v: want nodeName %s and targetRef pod web-0", ep, node.Name)
	}
	if len(slice.Ports) != 1 || slice.Ports[0].Port == nil || *slice.Ports[0].Port != 8080 {
		t.Errorf("EndpointSlice %s ports %+v: want 8080", slice.Name, slice.Ports)
	}

	// kubectl, as a user types it.
	out, err := exec.CommandContext(ctx, c.Kubectl(), "--kubeconfig", c.Kubeconfig, "get", "ns", "-o", "name").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get ns: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "namespace/"+ns.Name+"\n") {
		t.Errorf("kubectl get ns does not list %s:\n%s", ns.Name, out)
	}
}

func ptr[T any](v T) *T { return &v }

// A kubeconfig issued for system:kube-proxy gets that user's RBAC from the
// bootstrap policy (system:node-proxier), not the admin's.
func TestIssuedKubeconfigHasItsUsersRBAC(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "kube-proxy.kubeconfig")
	if err := kubecluster.IssueKubeconfig(c.Dir, path, "system:kube-proxy"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("kube-proxy listing EndpointSlices: %v", err)
	}
	if _, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("kube-proxy listing Services: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("kube-proxy listing Secrets: got %v, want forbidden", err)
	}
}
