package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// kubeNode is a shunt node driven by a real API server: the agent's lab
// plays the node's kubelet (it runs the API's pods through shunt-cni and
// writes their status back).
type kubeNode struct {
	*lab
	t    *testing.T
	cs   kubernetes.Interface
	node string
	ctx  context.Context
}

// newKubeCluster starts a control plane with shunt's CRDs installed, as a
// cluster operator would before deploying shunt. It watches its nodes as
// Kubernetes does (kubecluster.Options.NodeLifecycle, Kubernetes' grace
// period): every node of these tests has an agent that plays its kubelet
// (`lab up --kubeconfig` runs the pods) and heartbeats for it.
func newKubeCluster(t *testing.T) *kubetest.Cluster {
	t.Helper()
	return newKubeClusterWith(t, kubecluster.Options{})
}

// newKubeClusterWith is newKubeCluster with options (a grace period); the
// CIDRs are chosen here.
func newKubeClusterWith(t *testing.T, o kubecluster.Options) *kubetest.Cluster {
	t.Helper()
	requireRoot(t)
	// CIDRs no lab test uses (labs take 10.200-249.x.0/24 and
	// 10.100-149.x.0/24), so a kube test can run beside them; not 10.252,
	// which the k8s benchmark's agent routes on this host (make test runs
	// it, bench/smoke_test.go, while this package runs).
	o.ClusterCIDR = fmt.Sprintf("10.%d.0.0/16", []int{250, 251, 253, 254}[rand.IntN(4)])
	o.ServiceCIDR = fmt.Sprintf("10.%d.%d.0/24", 150+rand.IntN(50), rand.IntN(250))
	o.NodeLifecycle = true
	c := kubetest.StartWith(t, o)
	c.Apply(t, "../../deploy/crds/")
	return c
}

// newKubeNode starts a control plane and an agent for one node of it.
func newKubeNode(t *testing.T) *kubeNode {
	t.Helper()
	return newKubeNodeOn(t, newKubeCluster(t))
}

// newKubeNodeOn adds a node to the cluster and starts its agent.
func newKubeNodeOn(t *testing.T, c *kubetest.Cluster) *kubeNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	k := &kubeNode{t: t, cs: c.Client, ctx: ctx, lab: newKubeLabOn(t, c)}
	k.node = k.instance
	return k
}

// runPod creates the pod in the API for this node and waits until the
// lab's kubelet runs it; it returns the pod's address.
func (k *kubeNode) runPod(ns, name string, labels map[string]string, cmd ...string) string {
	k.t.Helper()
	return k.runPodOf(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "lab", Command: cmd}}},
	})
}

// runPodOf is runPod of a Pod object of the caller's (ports, say), placed
// on this node.
func (k *kubeNode) runPodOf(pod *corev1.Pod) string {
	k.t.Helper()
	ns, name := pod.Namespace, pod.Name
	pod.Spec.NodeName = k.node
	if err := wait.PollUntilContextCancel(k.ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := k.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "serviceaccount") {
			return false, nil // the namespace's default service account comes a moment later
		}
		return err == nil, err
	}); err != nil {
		k.t.Fatalf("creating pod %s/%s: %v", ns, name, err)
	}
	var ip string
	if err := wait.PollUntilContextCancel(k.ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := k.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ip = p.Status.PodIP
		return p.Status.Phase == corev1.PodRunning && ip != "", nil
	}); err != nil {
		k.t.Fatalf("pod %s/%s never ran: %v", ns, name, err)
	}
	return ip
}

// createServerService creates, through the API, Service default/server:
// TCP 80 and UDP 53 to port 7000 of the pods labelled app=server.
func (k *kubeNode) createServerService() *corev1.Service {
	k.t.Helper()
	svc, err := k.cs.CoreV1().Services("default").Create(k.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"}, Ports: []corev1.ServicePort{
			{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(7000), Protocol: corev1.ProtocolTCP},
			{Name: "udp", Port: 53, TargetPort: intstr.FromInt32(7000), Protocol: corev1.ProtocolUDP},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	return svc
}

// podIPOf reads a pod's address from the API.
func (k *kubeNode) podIPOf(ns, name string) string {
	k.t.Helper()
	p, err := k.cs.CoreV1().Pods(ns).Get(k.ctx, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	return p.Status.PodIP
}

// waitEvent waits for a Warning event of reason about object name of the
// default namespace whose message holds contains.
func (k *kubeNode) waitEvent(name, reason, contains string) error {
	return wait.PollUntilContextTimeout(k.ctx, 200*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := k.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == reason && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, contains) {
				return true, nil
			}
		}
		return false, nil
	})
}

// probeFrom runs `shunt lab probe` inside a pod's sandbox until it gives
// want (a few seconds: servers start, changes propagate).
func (k *kubeNode) probeFrom(ns, name, want string, targets ...string) {
	k.t.Helper()
	args := append([]string{"netns", "exec", k.instance + "-" + ns + "-" + name, filepath.Join(binDir, "shunt"),
		"lab", "probe", "--timeout", "1s", "--expect", want}, targets...)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("probe from %s/%s, want %s: %v\n%s", ns, name, want, err, out)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestKubernetesNode: shuntd with --kubeconfig takes its objects from a
// real API server and controller-manager (ClusterIPs, EndpointSlices,
// NetworkPolicies written with client-go), its pod CIDR from its Node, and
// its pods from shunt-cni as a container runtime calls it: pod to pod and
// through a ClusterIP, a NetworkPolicy applied and removed through the API,
// the lab's own apply refused with what to do instead.
func TestKubernetesNode(t *testing.T) {
	k := newKubeNode(t)
	st := k.status()
	if !strings.HasPrefix(st.Source, "kubernetes https://127.0.0.1:") {
		t.Errorf("status source %q, want the API server", st.Source)
	}
	serverIP := k.runPod("default", "server", map[string]string{"app": "server"}, "shunt", "lab", "serve", "--tcp", "7000", "--udp", "7000")
	k.runPod("default", "client", map[string]string{"app": "client"}, "sleep", "infinity")
	k.probeFrom("default", "client", "connected", "--tcp", serverIP+":7000")

	svc := k.createServerService()
	// The EndpointSlice comes from the controller-manager.
	k.probeFrom("default", "client", "connected", "--tcp", svc.Spec.ClusterIP+":80", "--udp", svc.Spec.ClusterIP+":53")

	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-server"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
	if _, err := k.cs.NetworkingV1().NetworkPolicies("default").Create(k.ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.probeFrom("default", "client", "timeout", "--tcp", svc.Spec.ClusterIP+":80")
	found := false
	for _, f := range k.observe("--verdict", "DROPPED", "--last", "200") {
		found = found || (f.Source.Pod == "default/client" && f.Destination.Pod == "default/server")
	}
	if !found {
		t.Error("no flow naming the client and server pods for the drop")
	}
	if err := k.cs.NetworkingV1().NetworkPolicies("default").Delete(k.ctx, "deny-server", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.probeFrom("default", "client", "connected", "--tcp", svc.Spec.ClusterIP+":80")

	// Bad input the API server accepts: an IPv6 block beside an IPv4 one.
	// The IPv4 part is enforced, the rest of the node works, the IPv6 block
	// is an Event on the policy, a line of `shunt status` and a metric.
	clientIP := k.podIPOf("default", "client")
	mixed := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "mixed-blocks"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "2001:db8::/32"}},
				{IPBlock: &networkingv1.IPBlock{CIDR: clientIP + "/32"}},
			}}}},
	}
	if _, err := k.cs.NetworkingV1().NetworkPolicies("default").Create(k.ctx, mixed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.probeFrom("default", "client", "connected", "--tcp", svc.Spec.ClusterIP+":80")
	if err := k.waitEvent("mixed-blocks", "IPv6NotSupported", "2001:db8::/32"); err != nil {
		t.Errorf("no IPv6NotSupported Warning event on the NetworkPolicy: %v", err)
	}
	if st := k.mustShunt("status"); !strings.Contains(st, "left out:  NetworkPolicy default/mixed-blocks: ipBlock 2001:db8::/32") {
		t.Errorf("shunt status does not name the problem:\n%s", st)
	}
	if n := k.metric("shunt_object_problems", `kind="NetworkPolicy"`); n != 1 {
		t.Errorf("shunt_object_problems for NetworkPolicy = %v, want 1", n)
	}
	// A Service port of a protocol the socket layer does not balance.
	if _, err := k.cs.CoreV1().Services("default").Create(k.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sctp"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"}, Ports: []corev1.ServicePort{
			{Name: "tcp", Port: 81, TargetPort: intstr.FromInt32(7000), Protocol: corev1.ProtocolTCP},
			{Name: "sctp", Port: 9999, Protocol: corev1.ProtocolSCTP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.waitEvent("sctp", "ProtocolNotSupported", "9999/SCTP"); err != nil {
		t.Errorf("no ProtocolNotSupported event on the SCTP Service: %v", err)
	}
	// A forwarding mode shunt does not know (the API server takes any
	// annotation): the node's mode holds, and the Service is told.
	if _, err := k.cs.CoreV1().Services("default").Create(k.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "odd-mode", Annotations: map[string]string{"shunt.io/forwarding-mode": "hybrid"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{{Name: "tcp", Port: 82, TargetPort: intstr.FromInt32(7000), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.waitEvent("odd-mode", "InvalidForwardingMode", `"hybrid": give snat or dsr`); err != nil {
		t.Errorf("no InvalidForwardingMode event on the Service: %v", err)
	}
	if st := k.mustShunt("status"); !strings.Contains(st, "Service default/odd-mode: annotation shunt.io/forwarding-mode") {
		t.Errorf("shunt status does not name the Service's forwarding mode:\n%s", st)
	}

	out, code := k.shunt("apply", "-f", "testdata/two-pods.yaml")
	if code == 0 || !strings.Contains(out, "kubectl") {
		t.Errorf("shunt apply on a Kubernetes node: exit %d, %q; want a refusal pointing to kubectl", code, out)
	}
}

// TestKubernetesNodesAgreeOnIdentities: two agents (two nodes) against one
// API server number every pod's identity alike, wherever the pod runs,
// through ShuntIdentity objects; a pod relabelled on one node gets the
// same new number on both.
func TestKubernetesNodesAgreeOnIdentities(t *testing.T) {
	c := newKubeCluster(t)
	a, b := newKubeNodeOn(t, c), newKubeNodeOn(t, c)
	addrs := map[string]string{}
	for i, n := range []*kubeNode{a, b, a, b} {
		name := fmt.Sprintf("p%d", i)
		app := []string{"web", "web", "db", "cache"}[i]
		addrs[name] = n.runPod("default", name, map[string]string{"app": app}, "sleep", "infinity")
	}
	identities := func(n *kubeNode) map[string]uint32 {
		var rows []struct {
			Prefix   string
			Identity uint32
		}
		out := n.mustShunt("map", "dump", "shunt_ipcache", "-o", "json")
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("ipcache dump: %v\n%s", err, out)
		}
		byIP := map[string]uint32{}
		for _, r := range rows {
			byIP[strings.TrimSuffix(r.Prefix, "/32")] = r.Identity
		}
		got := map[string]uint32{}
		for pod, ip := range addrs {
			got[pod] = byIP[ip]
		}
		return got
	}
	agree := func(what string) map[string]uint32 {
		t.Helper()
		var ia, ib map[string]uint32
		deadline := time.Now().Add(15 * time.Second)
		for {
			ia, ib = identities(a), identities(b)
			same := len(ia) == len(addrs)
			for pod := range addrs {
				same = same && ia[pod] != 0 && ia[pod] == ib[pod]
			}
			if same {
				return ia
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: identities by pod on %s: %v, on %s: %v (pods at %v)\nipcache of %s:\n%s", what, a.node, ia, b.node, ib, addrs,
					a.node, a.mustShunt("map", "dump", "shunt_ipcache"))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	ids := agree("four pods on two nodes")
	if ids["p0"] != ids["p1"] || ids["p0"] == ids["p2"] || ids["p2"] == ids["p3"] {
		t.Errorf("identities %v: want p0 and p1 (both app=web, on different nodes) alike, the others distinct", ids)
	}
	out, err := exec.Command(c.Kubectl(), "--kubeconfig", c.Kubeconfig, "get", "shuntidentities", "-o", "name").CombinedOutput()
	if err != nil || strings.Count(string(out), "shuntidentity") < 3 {
		t.Errorf("ShuntIdentities in the API: %v\n%s", err, out)
	}

	// Relabel p3 (on b) to app=db: both nodes give it p2's number.
	p3, err := c.Client.CoreV1().Pods("default").Get(a.ctx, "p3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p3.Labels["app"] = "db"
	if _, err := c.Client.CoreV1().Pods("default").Update(a.ctx, p3, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for ids = agree("after the relabel"); ids["p3"] != ids["p2"]; ids = agree("after the relabel") {
		if time.Now().After(deadline) {
			t.Fatalf("after relabelling p3 to app=db: %v, want p3 = p2", ids)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubernetesAPIServerOutage: the API server goes away and comes back.
// Meanwhile the datapath keeps its state (a held connection and new ones
// through a ClusterIP keep working) and `shunt status` says the API server
// is unreachable; afterwards the informers catch up (a policy created after
// the outage is enforced) and the status is healthy again.
func TestKubernetesAPIServerOutage(t *testing.T) {
	c := newKubeCluster(t)
	k := newKubeNodeOn(t, c)
	serverIP := k.runPod("default", "server", map[string]string{"app": "server"}, "shunt", "lab", "serve", "--tcp", "7000")
	k.runPod("default", "client", map[string]string{"app": "client"}, "sleep", "infinity")
	svc, err := k.cs.CoreV1().Services("default").Create(k.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(7000)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k.probeFrom("default", "client", "connected", "--tcp", svc.Spec.ClusterIP+":80")

	// A connection held across the outage: probe checks it still works
	// after the hold.
	held := exec.Command("ip", "netns", "exec", k.instance+"-default-client", filepath.Join(binDir, "shunt"),
		"lab", "probe", "--expect", "connected", "--tcp", serverIP+":7000", "--hold", "10s")
	var heldOut strings.Builder
	held.Stdout, held.Stderr = &heldOut, &heldOut
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(strings.Join(k.status().Health, ";"), "unreachable") {
		if time.Now().After(deadline) {
			t.Fatalf("shunt status with the API server down: %v", k.status().Health)
		}
		time.Sleep(300 * time.Millisecond)
	}
	k.probeFrom("default", "client", "connected", "--tcp", svc.Spec.ClusterIP+":80")
	if err := c.StartAPIServer(k.ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.Wait(); err != nil {
		t.Errorf("connection held across the outage: %v\n%s", err, heldOut.String())
	}
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-server"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
	if err := wait.PollUntilContextTimeout(k.ctx, 300*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := k.cs.NetworkingV1().NetworkPolicies("default").Create(ctx, deny, metav1.CreateOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("creating a policy after the outage: %v", err)
	}
	k.probeFrom("default", "client", "timeout", "--tcp", svc.Spec.ClusterIP+":80")
	deadline = time.Now().Add(15 * time.Second)
	for h := k.status().Health; len(h) != 1 || h[0] != "ok"; h = k.status().Health {
		if time.Now().After(deadline) {
			t.Fatalf("shunt status after the API server came back: %v", h)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestKubernetesObjectStatus: each node writes its own entry in a
// ShuntNetworkPolicy's status: enforced at the policy's generation, with
// the parts it cannot program as problems (an IPv6 block), which go when
// the policy no longer has them. An HTTPRoute attached to a Service gets
// the mesh's Accepted and ResolvedRefs conditions, for that parent only:
// its other parent, a Gateway, is another implementation's to answer for.
func TestKubernetesObjectStatus(t *testing.T) {
	l := newKubeLab(t, twoPods)
	dir := t.TempDir()
	policy := func(cidrs ...string) string {
		p := filepath.Join(dir, fmt.Sprintf("policy-%d.yaml", len(cidrs)))
		var peers []string
		for _, c := range cidrs {
			peers = append(peers, fmt.Sprintf("{cidr: %q}", c))
		}
		writeFile(t, p, fmt.Sprintf(`apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: blocks, namespace: default}
spec:
  podSelector: {}
  ingress:
  - peers: [%s]
`, strings.Join(peers, ", ")))
		return p
	}
	type nodeStatus struct {
		Enforced           bool
		ObservedGeneration int64
		Problems           []string
	}
	statusOf := func(want func(nodeStatus, int64) bool) nodeStatus {
		t.Helper()
		var got nodeStatus
		var gen int64
		err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
			out, err := l.kubectl(nil, "get", "shuntnetworkpolicy", "blocks", "-n", "default", "-o", "json")
			if err != nil {
				return false, err
			}
			var obj struct {
				Metadata struct{ Generation int64 }
				Status   struct{ Nodes map[string]nodeStatus }
			}
			if err := json.Unmarshal(out, &obj); err != nil {
				return false, err
			}
			got, gen = obj.Status.Nodes[l.instance], obj.Metadata.Generation
			return want(got, gen), nil
		})
		if err != nil {
			t.Fatalf("status of node %s: %+v (generation %d): %v", l.instance, got, gen, err)
		}
		return got
	}
	l.apply(policy("10.0.0.0/8", "2001:db8::/32"))
	st := statusOf(func(s nodeStatus, gen int64) bool {
		return s.Enforced && s.ObservedGeneration == gen && len(s.Problems) > 0
	})
	if !strings.Contains(st.Problems[0], "2001:db8::/32") {
		t.Errorf("problems %q do not name the IPv6 block", st.Problems)
	}
	l.apply(policy("10.0.0.0/8"))
	statusOf(func(s nodeStatus, gen int64) bool {
		return s.Enforced && s.ObservedGeneration == gen && len(s.Problems) == 0
	})

	route := filepath.Join(dir, "route.yaml")
	writeFile(t, route, `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  ports: [{name: http, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: split, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}, {name: public}]
  rules:
  - backendRefs: [{name: web, port: 80, weight: 90}, {name: absent, port: 80, weight: 10}]
`)
	l.apply(route)
	var conds map[string]string
	var shuntParents []string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		out, err := l.kubectl(nil, "get", "httproute", "split", "-n", "default", "-o", "json")
		if err != nil {
			return false, err
		}
		var rt struct {
			Status struct {
				Parents []struct {
					ParentRef      struct{ Kind, Name string }
					ControllerName string
					Conditions     []struct{ Type, Status string }
				}
			}
		}
		if err := json.Unmarshal(out, &rt); err != nil {
			return false, err
		}
		conds, shuntParents = map[string]string{}, nil
		for _, p := range rt.Status.Parents {
			if p.ControllerName == "shunt.io/mesh" {
				shuntParents = append(shuntParents, p.ParentRef.Kind+"/"+p.ParentRef.Name)
				for _, c := range p.Conditions {
					conds[c.Type] = c.Status
				}
			}
		}
		return conds["Accepted"] == "True" && conds["ResolvedRefs"] == "False", nil
	})
	if err != nil {
		t.Errorf("HTTPRoute conditions of shunt.io/mesh: %v (%v), want Accepted True and ResolvedRefs False (a backend is missing)", conds, err)
	}
	if len(shuntParents) != 1 || shuntParents[0] != "Service/web" {
		t.Errorf("shunt.io/mesh wrote status for parents %v; want Service/web alone (the Gateway is not shunt's)", shuntParents)
	}
}
