package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/shuntnet/shunt/internal/kubetest"
)

// newUnderlay makes one network namespace per node, joined by veth pairs
// to an underlay bridge in a namespace of its own (underlay), node i at
// 192.168.77.(i+1)/24. Everything is removed when the test ends.
func newUnderlay(t *testing.T, nodes int) (netns []string, addrs []string, underlay string) {
	t.Helper()
	requireRoot(t)
	id := fmt.Sprintf("%05d", rand.IntN(100000))
	ul := "e2eul" + id
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ul).Run() })
	ip("netns", "add", ul)
	ip("-n", ul, "link", "add", "br0", "type", "bridge")
	ip("-n", ul, "link", "set", "br0", "up")
	for i := range nodes {
		ns, addr := fmt.Sprintf("e2en%d%s", i+1, id), fmt.Sprintf("192.168.77.%d", i+1)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		ip("netns", "add", ns)
		ip("-n", ns, "link", "set", "lo", "up")
		ip("-n", ns, "link", "add", "ul0", "type", "veth", "peer", "name", fmt.Sprintf("n%d", i+1), "netns", ul)
		ip("-n", ns, "addr", "add", addr+"/24", "dev", "ul0")
		ip("-n", ns, "link", "set", "ul0", "up")
		ip("-n", ul, "link", "set", fmt.Sprintf("n%d", i+1), "master", "br0", "up")
		netns, addrs = append(netns, ns), append(addrs, addr)
	}
	return netns, addrs, ul
}

// crossNodeRouting is how the nodes of a cross-node test reach each
// other's pods: the agent's flags, and where the receiving node's program
// reports what arrives.
type crossNodeRouting struct {
	flags   []string
	receive string // the flow point of the receiving node's program
	// noMasquerade: the node runs without --masquerade (pods keep their
	// own address to the underlay).
	noMasquerade bool
	podMTU       int // the pods' MTU over the underlay's 1500
}

var (
	overlayRouting = crossNodeRouting{flags: []string{"--tunnel", "vxlan"}, receive: "from-overlay", podMTU: 1450}
	nativeRouting  = crossNodeRouting{flags: []string{"--routing", "native"}, receive: "from-uplink", podMTU: 1500}
)

// newCrossNode starts a node of cluster c whose host side is netns, with
// its Node at underlay address addr, routing to other nodes' pods as r
// says; extra are more flags of its `lab up`.
func newCrossNode(t *testing.T, c *kubetest.Cluster, netns, addr string, r crossNodeRouting, extra ...string) *kubeNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	l := &lab{t: t, instance: fmt.Sprintf("e2e%06d", rand.IntN(1000000)), serviceCIDR: c.ServiceCIDR, kube: c, netns: netns}
	nodes := c.Client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: l.instance}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What a kubelet reports: where other nodes reach this one (the
	// controller-manager writes the pod CIDR meanwhile: retry conflicts).
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, l.instance, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log of %s:\n%s", l.instance, readFile("/var/lib/shunt/"+l.instance+"/shuntd.log"))
		}
		l.shunt("lab", "down")
		l.assertGone()
	})
	relay, err := c.RelayInto("/run/netns/" + netns) // the node's loopback is its own
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	up := []string{"lab", "up", "--kubeconfig", c.Kubeconfig, "--node-name", l.instance, "--service-cidr", c.ServiceCIDR,
		"--mode", "redirect-peer", "--cluster-cidr", c.ClusterCIDR}
	if !r.noMasquerade {
		up = append(up, "--masquerade")
	}
	l.mustShunt(slices.Concat(up, r.flags, extra)...)
	l.cidr = l.status().PodCIDR
	k := &kubeNode{t: t, cs: c.Client, ctx: ctx, lab: l}
	k.node = k.instance
	return k
}

// TestCrossNodeOverlay: two nodes of one cluster, each its own network
// namespace joined by an underlay, each with its agent and a VXLAN
// overlay. A pod reaches a pod of the other node (TCP, UDP, ping) through
// the tunnel, in both directions, and so does the node itself; a ClusterIP
// whose only backend is there (TCP, UDP); the server's node keeps delivering while its agent is
// down (SIGKILL) and after it restarts; a NetworkPolicy on the server is judged
// on the server's node with the client's identity carried in the VNI
// (an intruder of the client's node is dropped there, the client not);
// the flows of the receiving node say so. A pod's traffic to a host
// outside the cluster on the underlay leaves from its node's InternalIP
// (--masquerade).
func TestCrossNodeOverlay(t *testing.T) { testCrossNode(t, overlayRouting) }

// TestCrossNodeNative: TestCrossNodeOverlay's cluster with native routing
// (--routing native): no encapsulation, each node routes the other's pod
// CIDR via its InternalIP, the pods' packets leave through bpf_fib_lookup
// and arrive through the uplink program, which judges them with the
// sender's identity from the ipcache; pods keep the underlay's full MTU.
func TestCrossNodeNative(t *testing.T) { testCrossNode(t, nativeRouting) }

func testCrossNode(t *testing.T, r crossNodeRouting) {
	c := newKubeCluster(t)
	netns, addrs, underlay := newUnderlay(t, 2)
	a := newCrossNode(t, c, netns[0], addrs[0], r)
	b := newCrossNode(t, c, netns[1], addrs[1], r)

	// Each node lists both, itself Ready with the address it tunnels from.
	var nodes struct {
		Items []struct {
			Metadata struct{ Name string }
			Spec     struct{ PodCIDR string }
			Status   struct {
				Addresses  []struct{ Type, Address string }
				Conditions []struct{ Type, Status string }
			}
		}
	}
	if err := json.Unmarshal([]byte(a.mustShunt("get", "nodes", "-o", "json")), &nodes); err != nil {
		t.Fatal(err)
	}
	ready := map[string]string{}
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			ready[n.Metadata.Name] = c.Type + "=" + c.Status
		}
		if len(n.Status.Addresses) != 1 || n.Spec.PodCIDR == "" {
			t.Errorf("node %s listed as %+v: want its pod CIDR and InternalIP", n.Metadata.Name, n)
		}
	}
	if len(nodes.Items) != 2 || ready[a.node] != "Ready=True" {
		t.Errorf("get nodes on %s: %+v, want two nodes and itself Ready", a.node, nodes.Items)
	}

	serve := []string{"shunt", "lab", "serve", "--tcp", "7000", "--udp", "7000"}
	server := b.runPod("default", "server", map[string]string{"app": "server"}, serve...)
	client := a.runPod("default", "client", map[string]string{"app": "client"}, serve...)
	a.runPod("default", "intruder", map[string]string{"app": "intruder"}, "sleep", "infinity")

	a.probeFrom("default", "client", "connected", "--tcp", server+":7000", "--udp", server+":7000")
	b.probeFrom("default", "server", "connected", "--tcp", client+":7000")
	if out, err := exec.Command("ip", "netns", "exec", a.instance+"-default-client", "ping", "-c", "1", "-W", "2", server).CombinedOutput(); err != nil {
		t.Errorf("ping across the overlay: %v\n%s", err, out)
	}
	// The node itself (its processes, not a pod) reaches the other node's
	// pod: routed onto the overlay with the remote-node identity.
	a.probe("", "connected", "--tcp", server+":7000", "--udp", server+":7000")
	if r.receive == "from-overlay" {
		if st := a.status(); !strings.Contains(fmt.Sprint(st.Counters), "to-tunnel") {
			t.Errorf("node %s counted nothing into the tunnel: %v", a.node, st.Counters)
		}
	} else {
		// Routed by BPF both ways, never handed to the stack for want
		// of a route.
		st := a.status()
		var received bool
		for _, ct := range st.Counters {
			received = received || (ct.Reason == "forwarded" && ct.Direction == "from-uplink")
			if ct.Reason == "fib-lookup-failed" {
				t.Errorf("node %s: %+v", a.node, ct)
			}
		}
		if !received {
			t.Errorf("node %s received nothing routed from the other node: %v", a.node, st.Counters)
		}
		if st.Routing == nil || st.Routing.Mode != "native" || st.Routing.Device != "ul0" || st.Routing.PodMTU != 1500 {
			t.Errorf("node %s: routing %+v, want native out of ul0, pod MTU 1500", a.node, st.Routing)
		}
	}

	// A ClusterIP whose only backend is on the other node: the client's
	// node picks it at connect (TCP) and send (UDP) and tunnels to it.
	svc := a.createServerService()
	a.probeFrom("default", "client", "connected", "--tcp", svc.Spec.ClusterIP+":80", "--udp", svc.Spec.ClusterIP+":53")

	// Traffic to outside the cluster leaves from the node's InternalIP
	// (--masquerade, no --underlay-addr): a host on the underlay that
	// knows no pod sees node A only, and its answers reach the pod.
	peers := outsideOnBridge(t, underlay, "192.168.77.100", 7000)
	a.probeFrom("default", "client", "connected", "--tcp", "192.168.77.100:7000", "--udp", "192.168.77.100:7000")
	onlyFrom(t, peers, addrs[0])

	// The server's node loses its agent (SIGKILL): its pinned datapath
	// keeps delivering from the overlay, with the policy it had.
	pid := b.status().PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	a.probeFrom("default", "client", "connected", "--tcp", server+":7000", "--tcp", svc.Spec.ClusterIP+":80", "--udp", svc.Spec.ClusterIP+":53")
	b.mustShunt("lab", "up")
	a.probeFrom("default", "client", "connected", "--tcp", server+":7000")

	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: "default"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}},
		},
	}
	if _, err := c.Client.NetworkingV1().NetworkPolicies("default").Create(a.ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.probeFrom("default", "intruder", "timeout", "--tcp", server+":7000")
	a.probeFrom("default", "client", "connected", "--tcp", server+":7000")

	// The drop happened on the server's node, which knew the intruder
	// from the identity in the VNI.
	flows := b.mustShunt("observe", "--last", "500", "--verdict", "DROPPED", "-o", "json")
	var dropped bool
	for _, line := range strings.Split(flows, "\n") {
		if strings.Contains(line, `"`+r.receive+`"`) && strings.Contains(line, "policy") && strings.Contains(line, `"`+a.podIPOf("default", "intruder")+`"`) {
			dropped = true
		}
	}
	if !dropped {
		t.Errorf("no policy drop from the intruder at %s in node %s's flows:\n%s", r.receive, b.node, flows)
	}

	// The intruder relabelled as a client: both nodes give it the
	// client's identity, and the server's node lets it in.
	start := time.Now()
	intruder, err := c.Client.CoreV1().Pods("default").Get(a.ctx, "intruder", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	intruder.Labels["app"] = "client"
	if _, err := c.Client.CoreV1().Pods("default").Update(a.ctx, intruder, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.probeFrom("default", "intruder", "connected", "--tcp", server+":7000")
	t.Logf("relabelled pod allowed across nodes %s after the update", time.Since(start).Round(time.Millisecond))

	// Path MTU: pods have the underlay's 1500 less the 50 bytes of VXLAN
	// (native routing: all of it), so the largest unfragmentable ping
	// (MTU - 28) crosses and one byte more is refused at the pod itself
	// instead of vanishing in the tunnel.
	ping := func(size int) error {
		return exec.Command("ip", "netns", "exec", a.instance+"-default-client", "ping", "-c", "1", "-W", "2", "-M", "do",
			"-s", fmt.Sprint(size), server).Run()
	}
	if err := ping(r.podMTU - 28); err != nil {
		t.Errorf("ping with DF at the pod MTU %d across nodes: %v", r.podMTU, err)
	}
	if err := ping(r.podMTU - 28 + 1); err == nil {
		t.Errorf("ping with DF one byte over the pod MTU got through")
	}
}
