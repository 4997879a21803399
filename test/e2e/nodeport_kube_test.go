package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// TestKubernetesNodePort: a node of a real API server (its own network
// namespace on an underlay, a second namespace there being a host
// outside the cluster) programs a NodePort Service and a LoadBalancer
// Service with externalTrafficPolicy Local from the objects as the API
// server allocated them (nodePorts, health check port): the outside host
// reaches the NodePort on the node's address and the backend sees its
// address; the health check answers 200 with one local endpoint; the
// LoadBalancer's source ranges refuse the outside host at the address the
// cluster's load balancer controller (`shunt dev lb-ipam`, run by the
// cluster as `dev cluster up --lb-pool` runs it) wrote in its status until
// the host is added to them; an
// internalTrafficPolicy Local ClusterIP reaches the node's endpoint; a
// pod's hostPort answers the outside host on the node's address; and
// `shunt status` names none of them as left out.
func TestKubernetesNodePort(t *testing.T) {
	const lbAddr = "192.0.2.200"
	c := newKubeClusterWith(t, kubecluster.Options{LoadBalancerPool: netip.MustParsePrefix(lbAddr + "/32"),
		LoadBalancerController: []string{filepath.Join(binDir, "shunt"), "dev", "lb-ipam"}})
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

	get := func(url string) (string, string) { return httpGet(outside, url) }
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

	// The source ranges guard the load balancer address the controller
	// writes in the status (routed to the node by the outside host): the
	// outside host is not in them, then it is.
	var err error
	eventually(t, "the controller's load balancer address", lbAddr, func() (string, string) {
		if lb, err = k.cs.CoreV1().Services("default").Get(k.ctx, "ranges", metav1.GetOptions{}); err != nil {
			return "", err.Error()
		}
		if ing := lb.Status.LoadBalancer.Ingress; len(ing) == 1 {
			return ing[0].IP, ""
		}
		return "", fmt.Sprintf("status.loadBalancer %+v", lb.Status.LoadBalancer)
	})
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
	// A hostPort of a pod the API server places on the node: the outside
	// host reaches it on the node's address (no portmap plugin).
	k.runPodOf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hp", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "lab", Command: []string{"shunt", "lab", "serve", "--http", "8080"},
			Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 18080, Protocol: corev1.ProtocolTCP}}}}}})
	if body := eventually(t, "hostPort from outside", "200", func() (string, string) {
		return get(fmt.Sprintf("http://%s:18080/", addrs[0]))
	}); strings.TrimSpace(body) != "hp" {
		t.Errorf("the node's hostPort 18080 answered %q, want the pod hp", body)
	}

	st := k.mustShunt("status")
	if strings.Contains(st, "loadBalancerSourceRanges") || strings.Contains(st, "internalTrafficPolicy") {
		t.Errorf("shunt status names implemented fields as left out:\n%s", st)
	}
	if strings.Contains(st, "TunnelPortConflict") || strings.Contains(st, "overlay endpoint") {
		t.Errorf("shunt status names a tunnel port conflict before any object asks for the overlay's port:\n%s", st)
	}

	// UDP frontends on the overlay's own endpoint (the node's underlay
	// address, VXLAN's port), which the overlay takes before any
	// frontend: an externalIP's port and a hostPort. Each is a problem of
	// its object, not a silent hole.
	vxlan := int32(4789) // agent.VXLANPort
	create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "on-tunnel"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, ExternalIPs: []string{addrs[0]},
			Ports: []corev1.ServicePort{{Name: "dns", Port: vxlan, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolUDP}}}})
	k.runPodOf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hp-tunnel", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "lab", Command: []string{"shunt", "lab", "serve", "--http", "8080"},
			Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: vxlan, Protocol: corev1.ProtocolUDP}}}}}})
	if err := k.waitEvent("on-tunnel", "TunnelPortConflict", fmt.Sprintf("port 4789/UDP at external address %s", addrs[0])); err != nil {
		t.Errorf("no TunnelPortConflict event on the Service with an externalIP's UDP port on the overlay's endpoint: %v", err)
	}
	st = k.mustShunt("status")
	for _, want := range []string{
		fmt.Sprintf("Service default/on-tunnel: port 4789/UDP at external address %s: %s:4789 is this node's overlay endpoint", addrs[0], addrs[0]),
		"Pod default/hp-tunnel: container c: hostPort 4789/UDP: ",
	} {
		if !strings.Contains(st, want) {
			t.Errorf("shunt status does not name %q:\n%s", want, st)
		}
	}
}

// TestKubernetesBesideKubeProxy: a node of a real API server whose agent
// runs with --kube-proxy-replacement=false translates the ClusterIP at the
// socket layer and leaves the NodePort to the real kube-proxy (iptables
// mode) running on the node: before kube-proxy starts, the ClusterIP
// answers from the node and a pod while the NodePort answers nobody
// outside; once it runs, the outside host reaches the NodePort through
// kube-proxy's rules (their counters move) while the ClusterIP's rule of
// kube-proxy sees no packet (shunt translated the connect first: the two
// never translate one flow); `shunt node check` calls the node fine and
// `shunt status` says who serves what.
func TestKubernetesBesideKubeProxy(t *testing.T) {
	for _, bin := range []string{"iptables", "iptables-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed: run scripts/setup.sh", bin)
		}
	}
	c, k, netns, addrs, np := besideKubeProxy(t)
	outside := netns[1]
	clusterURL := "http://" + np.Spec.ClusterIP + "/"
	nodePortURL := fmt.Sprintf("http://%s:%d/remote", addrs[0], np.Spec.Ports[0].NodePort)
	eventually(t, "ClusterIP from the node (shunt's socket layer)", "200", func() (string, string) { return httpGet(netns[0], clusterURL) })
	if st, detail := httpGet(outside, nodePortURL); st != "" {
		t.Fatalf("NodePort answered from outside (%s %s) before kube-proxy runs: shunt serves it although told to leave it to kube-proxy", st, detail)
	}
	if st := k.mustShunt("status"); !strings.Contains(st, "by kube-proxy (--kube-proxy-replacement=false)") {
		t.Errorf("shunt status does not say kube-proxy serves the NodePorts:\n%s", st)
	}

	c.StartKubeProxy(t, netns[0], k.node, "iptables", c.ClusterCIDR)
	eventually(t, "NodePort from outside through kube-proxy", "200", func() (string, string) { return httpGet(outside, nodePortURL) })
	eventually(t, "ClusterIP from a pod", "200", func() (string, string) { return httpGet(k.instance+"-default-client", clusterURL) })
	eventually(t, "ClusterIP from the node", "200", func() (string, string) { return httpGet(netns[0], clusterURL) })

	// kube-proxy's own counters: its NodePort rule took the outside
	// host's connection, its ClusterIP rule none of the node's or the pod's.
	out, err := exec.Command("ip", "netns", "exec", netns[0], "iptables-save", "-c", "-t", "nat").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-save: %v\n%s", err, out)
	}
	var nodePortRule, clusterRule string
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.Contains(line, "-A KUBE-NODEPORTS") && strings.Contains(line, fmt.Sprintf("--dport %d ", np.Spec.Ports[0].NodePort)):
			nodePortRule = line
		case strings.Contains(line, "-A KUBE-SERVICES") && strings.Contains(line, "-d "+np.Spec.ClusterIP+"/32") && strings.Contains(line, "--dport 80 "):
			clusterRule = line
		}
	}
	if !strings.HasPrefix(nodePortRule, "[") || strings.HasPrefix(nodePortRule, "[0:") {
		t.Errorf("kube-proxy's NodePort rule took no packet: %q", nodePortRule)
	}
	if !strings.HasPrefix(clusterRule, "[0:0]") {
		t.Errorf("kube-proxy's ClusterIP rule took packets (%q): a connection shunt translates at the socket must never reach it", clusterRule)
	}

	check, code := k.shunt("node", "check")
	if code != 0 || !strings.Contains(check, "shunt translates ClusterIPs, kube-proxy NodePorts") {
		t.Errorf("shunt node check (exit %d):\n%s", code, check)
	}
}

// TestKubeProxyMigration: a node migrates from kube-proxy to shunt while
// clients hold connections: shunt runs beside kube-proxy
// (--kube-proxy-replacement=false), an outside host holds a keep-alive
// connection through a NodePort (kube-proxy's translation) and a pod one
// through the ClusterIP (shunt's); kube-proxy stops, the agent restarts
// as kube-proxy's replacement removing its rules; every request on both
// connections is answered, neither connection is dialled again, and
// `shunt node check` says shunt translates. Then the rollback, with a
// connection shunt translated held through it: the agent goes beside
// kube-proxy again and kube-proxy starts; the connection holds and new
// ones are kube-proxy's.
func TestKubeProxyMigration(t *testing.T) {
	c, k, netns, addrs, np := besideKubeProxy(t)
	outside := netns[1]
	stopKubeProxy := c.StartKubeProxy(t, netns[0], k.node, "iptables", c.ClusterCIDR)
	nodePortURL := fmt.Sprintf("http://%s:%d/", addrs[0], np.Spec.Ports[0].NodePort)
	clusterURL := "http://" + np.Spec.ClusterIP + "/"
	eventually(t, "NodePort through kube-proxy", "200", func() (string, string) { return httpGet(outside, nodePortURL) })
	eventually(t, "ClusterIP from the pod", "200", func() (string, string) { return httpGet(k.instance+"-default-client", clusterURL) })

	// 20 s of requests, 10 a second, each client over one connection.
	type load struct {
		Requests    int            `json:"requests"`
		ByStatus    map[string]int `json:"byStatus"`
		Errors      int            `json:"errors"`
		FirstError  string         `json:"firstError"`
		Connections int            `json:"connections"`
	}
	hold := func(netns, url string) func() load {
		cmd := exec.Command("ip", "netns", "exec", netns, filepath.Join(binDir, "shunt"), "lab", "http-load", "--url", url, "-n", "200", "-c", "1", "--rate", "10")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return func() load {
			if err := cmd.Wait(); err != nil {
				t.Fatalf("http-load to %s: %v\n%s", url, err, out.String())
			}
			var l load
			if err := json.Unmarshal(out.Bytes(), &l); err != nil {
				t.Fatalf("http-load printed %q: %v", out.String(), err)
			}
			return l
		}
	}
	viaNodePort := hold(outside, nodePortURL)
	viaClusterIP := hold(k.instance+"-default-client", clusterURL)
	time.Sleep(4 * time.Second)

	// restartAgent stops the node's agent (SIGTERM: its datapath stays
	// pinned and working) and starts it again with flags.
	restartAgent := func(flags ...string) {
		pid := k.status().PID
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid)
		k.mustShunt(append([]string{"lab", "up", "--kubeconfig", c.Kubeconfig, "--node-name", k.instance, "--service-cidr", c.ServiceCIDR,
			"--mode", "redirect-peer", "--cluster-cidr", c.ClusterCIDR, "--masquerade", "--tunnel", "vxlan"}, flags...)...)
	}

	// The migration of the node.
	stopKubeProxy()
	restartAgent("--remove-kube-proxy-rules")
	if check, code := k.shunt("node", "check"); code != 0 || !strings.Contains(check, "shunt translates Services") {
		t.Errorf("shunt node check after the migration (exit %d):\n%s", code, check)
	}

	// A new connection through the NodePort is shunt's now (its uplink
	// counts a NodePort translation).
	eventually(t, "NodePort through shunt after the migration", "200", func() (string, string) { return httpGet(outside, nodePortURL) })
	var translated uint64
	for _, c := range k.status().Counters {
		if c.Reason == "nodeport-xlate" {
			translated += c.Packets
		}
	}
	if translated == 0 {
		t.Errorf("shunt counted no NodePort translation after the migration")
	}

	held := func(step string, loads map[string]load) {
		t.Helper()
		for what, l := range loads {
			t.Logf("%s, %s: %+v", step, what, l)
			if l.Errors != 0 || l.ByStatus["200"] != l.Requests || l.Requests != 200 {
				t.Errorf("%s across the %s: %d of %d requests answered 200, %d errors (%s)", what, step, l.ByStatus["200"], l.Requests, l.Errors, l.FirstError)
			}
			if l.Connections != 1 {
				t.Errorf("%s across the %s: %d connections, want the one held throughout", what, step, l.Connections)
			}
		}
	}
	held("migration", map[string]load{"NodePort (kube-proxy's, then shunt's)": viaNodePort(), "ClusterIP (shunt's)": viaClusterIP()})

	// The rollback: the agent goes beside kube-proxy again, then kube-proxy
	// starts. The connection shunt translated keeps its translation
	// (shunt's NodePort table, which kube-proxy's rules never see), and a
	// new one is kube-proxy's.
	viaNodePort = hold(outside, nodePortURL)
	time.Sleep(4 * time.Second)
	restartAgent("--kube-proxy-replacement=false")
	c.StartKubeProxy(t, netns[0], k.node, "iptables", c.ClusterCIDR)
	eventually(t, "NodePort through kube-proxy after the rollback", "200", func() (string, string) {
		if st, detail := httpGet(outside, nodePortURL); st != "200" {
			return st, detail
		}
		out, err := exec.Command("ip", "netns", "exec", netns[0], "iptables-save", "-c", "-t", "nat").CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "-A KUBE-NODEPORTS") && strings.Contains(line, fmt.Sprintf("--dport %d ", np.Spec.Ports[0].NodePort)) &&
				!strings.HasPrefix(line, "[0:") {
				return "200", ""
			}
		}
		return "not kube-proxy's", fmt.Sprintf("kube-proxy's NodePort rule took no packet (%v)", err)
	})
	if check, code := k.shunt("node", "check"); code != 0 || !strings.Contains(check, "shunt translates ClusterIPs, kube-proxy NodePorts") {
		t.Errorf("shunt node check after the rollback (exit %d):\n%s", code, check)
	}
	held("rollback", map[string]load{"NodePort (shunt's, then kube-proxy's)": viaNodePort()})
}

// besideKubeProxy starts a node of a real API server (its own network
// namespace netns[0] on an underlay with an outside host, netns[1]) whose
// agent runs with --kube-proxy-replacement=false, a pod web serving HTTP on
// 8080, a pod client, and the NodePort Service web in front of web.
func besideKubeProxy(t *testing.T) (*kubetest.Cluster, *kubeNode, []string, []string, *corev1.Service) {
	c := newKubeCluster(t)
	netns, addrs, _ := newUnderlay(t, 2)
	k := newCrossNode(t, c, netns[0], addrs[0], overlayRouting, "--kube-proxy-replacement=false")
	k.runPod("default", "web", map[string]string{"app": "web"}, "shunt", "lab", "serve", "--http", "8080")
	k.runPod("default", "client", nil, "sleep", "infinity")
	port := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
	np, err := k.cs.CoreV1().Services("default").Create(k.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"}, Ports: port}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c, k, netns, addrs, np
}

// httpGet runs `shunt lab http-get URL` in the network namespace netns:
// the status line and the body, or "" and what went wrong.
func httpGet(netns, url string) (string, string) {
	out, err := exec.Command("ip", "netns", "exec", netns, filepath.Join(binDir, "shunt"), "lab", "http-get", "--timeout", "2s", url).CombinedOutput()
	if err != nil {
		return "", string(out)
	}
	status, body, _ := strings.Cut(string(out), "\n")
	return status, strings.TrimSpace(body)
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
		return httpGet(outside, fmt.Sprintf("http://%s:%d/remote", addrs[0], np.Spec.Ports[0].NodePort))
	})
	if host, _, _ := strings.Cut(body, ":"); host != addrs[1] {
		t.Errorf("the backend saw %q, want the outside host %s", body, addrs[1])
	}
}
