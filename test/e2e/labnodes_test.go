package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/netnsrun"
)

// newLabNodes starts a lab of n nodes (`shunt lab up --nodes n`): each an
// agent in a network namespace of its own on an underlay, the first
// serving the lab's control plane. Its name has 8 characters: the nodes
// are instances NAMEn2 …. Cleanup removes it and checks that nothing of
// any node is left.
func newLabNodes(t *testing.T, n int, flags []string, manifests ...string) *lab {
	t.Helper()
	requireRoot(t)
	l := &lab{t: t, instance: fmt.Sprintf("e2m%05d", rand.IntN(100000)), cidr: "10.244.0.0/16"}
	// What runs "on the node" (the CLI, probes from the node) runs on
	// node-1, in its namespace.
	l.netns = l.instance + "-node1"
	t.Cleanup(func() {
		for k := 1; k <= n; k++ {
			if t.Failed() {
				t.Logf("agent log of node-%d:\n%s", k, readFile("/var/lib/shunt/"+l.node(k).instance+"/shuntd.log"))
			}
		}
		down := *l
		down.netns = "" // removed by the command
		down.shunt("lab", "down")
		for k := 1; k <= n; k++ {
			nl := l.node(k)
			nl.cidr = "" // the nodes' pod routes live in their own namespaces
			nl.assertGone()
		}
	})
	args := append([]string{"lab", "up", "--nodes", fmt.Sprint(n)}, flags...)
	for _, m := range manifests {
		args = append(args, "-f", m)
	}
	// The nodes' namespaces do not exist before the first `lab up`.
	first := *l
	first.netns = ""
	first.mustShunt(args...)
	return l
}

// node is the lab of node k's own agent (its status, its flows).
func (l *lab) node(k int) *lab {
	nl := *l
	if k > 1 {
		nl.instance = fmt.Sprintf("%sn%d", l.instance, k)
	}
	return &nl
}

const labNodesPods = "testdata/lab-nodes.yaml"

// TestLabNodes: a lab of two nodes without Kubernetes, in both routing
// modes: pods on different nodes reach each other (TCP, UDP, ping) and a
// ClusterIP whose only backend is on the other node (UDP unconnected, as
// a resolver); a NetworkPolicy is judged on the receiving node with the
// sender's identity, and the drop is in the merged flows with the node's
// name; a relabelled pod gets through; pods' traffic to the host outside
// the cluster leaves from their node's address; the path MTU holds.
func TestLabNodes(t *testing.T) {
	for _, routing := range []string{"tunnel", "native"} {
		t.Run(routing, func(t *testing.T) {
			l := newLabNodes(t, 2, []string{"--routing", routing}, labNodesPods)
			server, client := l.podIP("server"), l.podIP("client")
			nodeOf := podNodes(t, l)
			if nodeOf["client"] != "node-1" || nodeOf["intruder"] != "node-1" || nodeOf["server"] != "node-2" || nodeOf["backup"] != "node-1" {
				t.Fatalf("pods on nodes %v, want client, intruder and backup on node-1, server on node-2", nodeOf)
			}
			// Pods that name no node go where there are fewest: node-2
			// (2 pods to 3), then node-1 (the first of two with 3).
			if nodeOf["spread-a"] != "node-2" || nodeOf["spread-b"] != "node-1" {
				t.Errorf("spread-a on %s, spread-b on %s: want node-2 and node-1, where the fewest pods were", nodeOf["spread-a"], nodeOf["spread-b"])
			}
			checkLabNodesListed(t, l)

			l.probe("client", "connected", "--tcp", server+":7000", "--udp", server+":7000")
			l.probe("server", "connected", "--tcp", client+":7000")
			l.ping("client", server)
			// The ClusterIP of pods on node-2 only (its selector leaves out
			// the backup on node-1): TCP, and UDP from an unconnected
			// socket, whose replies must come from the ClusterIP.
			vip := serviceIP(t, l, "server")
			l.probe("client", "connected", "--tcp", vip+":80", "--udp", vip+":53")

			// Policy: only app=client may reach the server; the intruder,
			// on the client's node, is dropped on the server's node.
			l.mustShunt("apply", "-f", "testdata/lab-nodes-policy.yaml")
			l.probe("intruder", "timeout", "--tcp", server+":7000")
			l.probe("client", "connected", "--tcp", server+":7000")
			receive := map[string]string{"tunnel": "from-overlay", "native": "from-uplink"}[routing]
			flows := l.mustShunt("observe", "--node", "node-2", "--last", "200", "--verdict", "DROPPED", "-o", "json")
			if !strings.Contains(flows, `"node":"node-2"`) || !strings.Contains(flows, `"`+receive+`"`) || !strings.Contains(flows, "default/intruder") {
				t.Errorf("no drop of the intruder at %s in node-2's flows:\n%s", receive, flows)
			}
			merged := l.mustShunt("observe", "--last", "500")
			if !strings.Contains(merged, "[node-1]") || !strings.Contains(merged, "[node-2]") {
				t.Errorf("observe did not merge both nodes' flows:\n%s", merged)
			}
			if routing == "tunnel" {
				checkRelay(t, l, server)
			}
			start := time.Now()
			l.mustShunt("apply", "-f", "testdata/lab-nodes-relabel.yaml")
			applied := time.Since(start)
			l.probe("intruder", "connected", "--tcp", server+":7000")
			t.Logf("relabelled pod allowed across nodes: apply returned after %s (every node enforcing it), connected after %s",
				applied.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

			// Masquerade: the host outside the cluster sees the nodes'
			// addresses only, from pods on both nodes.
			ext := labExternal(t, l)
			peers := serveOutside(t, ext.netns, ext.addr, 7100)
			l.probe("client", "connected", "--tcp", ext.addr+":7100", "--udp", ext.addr+":7100")
			onlyFrom(t, peers, "192.168.123.1")
			l.probe("server", "connected", "--tcp", ext.addr+":7100")
			onlyFrom(t, peers, "192.168.123.2")
			if out := l.mustShunt("lab", "exec", "--external", "--", "ping", "-c", "1", "-W", "2", "192.168.123.2"); !strings.Contains(out, "1 received") {
				t.Errorf("the external host cannot reach node-2:\n%s", out)
			}

			// Path MTU: with the overlay pods get 1500 less 50 bytes.
			mtu := map[string]int{"tunnel": 1450, "native": 1500}[routing]
			if out, code := l.shunt("lab", "exec", "client", "--", "ping", "-c", "1", "-W", "2", "-M", "do", "-s", fmt.Sprint(mtu-28), server); code != 0 {
				t.Errorf("ping with DF at the pod MTU %d across nodes: %s", mtu, out)
			}
			if _, code := l.shunt("lab", "exec", "client", "--", "ping", "-c", "1", "-W", "2", "-M", "do", "-s", fmt.Sprint(mtu-27), server); code == 0 {
				t.Errorf("ping with DF one byte over the pod MTU got through")
			}
		})
	}
}

// TestLabNodesMasqueradeLoad: 1 000 TCP connections at once, half from a
// pod on each node, to one address and port outside the cluster: every one
// is answered, and the host sees only the two nodes' addresses.
func TestLabNodesMasqueradeLoad(t *testing.T) {
	l := newLabNodes(t, 2, nil, labNodesPods)
	ext := labExternal(t, l)
	peers := serveOutside(t, ext.netns, ext.addr, 7200)
	seen := map[string]int{}
	var seenMu sync.Mutex
	go func() {
		for a := range peers {
			seenMu.Lock()
			seen[a.String()]++
			seenMu.Unlock()
		}
	}()
	target := ext.addr + ":7200"
	var wg sync.WaitGroup
	failures := make(chan error, 1000)
	for _, pod := range []string{"client", "server"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns := l.podNetnsPath("default", pod)
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			// Open all 500 first, so they are in the NAT table together.
			if err := netnsrun.Do(ns, func() error {
				for range 500 {
					c, err := net.DialTimeout("tcp4", target, 5*time.Second)
					if err != nil {
						failures <- fmt.Errorf("%s: dial: %w", pod, err)
						continue
					}
					conns = append(conns, c)
				}
				return nil
			}); err != nil {
				failures <- err
				return
			}
			for _, c := range conns {
				c.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 64)
				if _, err := c.Write([]byte("hi")); err != nil {
					failures <- fmt.Errorf("%s: write: %w", pod, err)
					continue
				}
				if _, err := c.Read(buf); err != nil {
					failures <- fmt.Errorf("%s: read: %w", pod, err)
				}
			}
		}()
	}
	wg.Wait()
	close(failures)
	n := 0
	for err := range failures {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Errorf("%d of 1000 concurrent connections failed", n)
	}
	time.Sleep(200 * time.Millisecond)
	seenMu.Lock()
	defer seenMu.Unlock()
	if len(seen) != 2 || seen["192.168.123.1"] == 0 || seen["192.168.123.2"] == 0 {
		t.Errorf("the outside host saw peers %v, want only the two nodes' addresses", seen)
	}
}

// TestLabNodeGoesAway: a node whose agent stops (SIGKILL) for longer than
// the grace period is NotReady and its pods leave the Service on the other
// node, whose clients then reach the backend that is left; its agent back,
// its pod returns; the Node deleted, its pods are removed. A pod naming a
// node that does not exist stays Pending with the reason. Restarting
// node-2's agent while connections run loses none.
func TestLabNodeGoesAway(t *testing.T) {
	l := newLabNodes(t, 2, []string{"--node-grace", "3s"}, labNodesPods)
	vip := serviceIP(t, l, "both")
	backends := func() string {
		out, _ := l.shunt("lab", "exec", "client", "--", filepath.Join(binDir, "shunt"), "lab", "probe", "--count", "30", "--tcp", vip+":80")
		return out
	}
	// The lab waits for the pods' processes to run, not for their
	// servers to listen: node-2's may refuse the first connections.
	deadline := time.Now().Add(15 * time.Second)
	for first := backends(); !strings.Contains(first, "server") || !strings.Contains(first, "backup"); first = backends() {
		if time.Now().After(deadline) {
			t.Fatalf("both backends should answer through the ClusterIP within 15s:\n%s", first)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Connections through the ClusterIP while node-2's agent restarts
	// (SIGTERM, then `lab up`): none fails.
	n2 := l.node(2)
	load := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", "client", "--",
		filepath.Join(binDir, "shunt"), "lab", "probe", "--for", "6s", "--interval", "20ms", "--tcp", vip+":80", "--tcp", l.podIP("server")+":7000")
	out := &strings.Builder{}
	load.Stdout, load.Stderr = out, out
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := syscall.Kill(n2.status().PID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	l.mustShunt("lab", "up")
	if err := load.Wait(); err != nil {
		t.Errorf("connections while node-2's agent restarted: %v\n%s", err, out)
	}

	start := time.Now()
	pid := n2.status().PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	waitFor(t, 20*time.Second, "node-2's pod out of the Service on node-1", func() bool {
		return !strings.Contains(backends(), "server")
	})
	if st := nodeStatus(t, l)["node-2"]; st != "Unknown" {
		t.Errorf("node-2 Ready=%s with its agent killed, want Unknown", st)
	}
	t.Logf("node-2's pod left the Service %s after its agent was killed (grace 3s)", time.Since(start).Round(100*time.Millisecond))
	if out := backends(); strings.Contains(out, "server") || !strings.Contains(out, "backup") {
		t.Errorf("with node-2 gone, only the backup should answer:\n%s", out)
	}
	l.mustShunt("lab", "up")
	waitFor(t, 20*time.Second, "node-2 Ready and its pod back in the Service", func() bool {
		return strings.Contains(backends(), "server")
	})

	// The Node deleted: its pods go (the pod garbage collector).
	l.mustShunt("delete", "node", "node-2")
	waitFor(t, 10*time.Second, "node-2's pods removed", func() bool {
		return !strings.Contains(l.mustShunt("get", "pods"), "server")
	})
	if out := backends(); strings.Contains(out, "server") {
		t.Errorf("the deleted node's pod still answers through the ClusterIP:\n%s", out)
	}

	// A pod for a node that does not exist waits, with the reason.
	l.mustShunt("apply", "-f", "testdata/lab-nodes-nowhere.yaml")
	var p struct {
		Status struct{ Phase, Reason, Message string }
	}
	if err := json.Unmarshal([]byte(l.mustShunt("get", "pod", "nowhere", "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != "Pending" || p.Status.Reason != "NodeNotFound" || !strings.Contains(p.Status.Message, "node-9") {
		t.Errorf("pod for node-9: status %+v, want Pending, NodeNotFound, naming node-9", p.Status)
	}

	// A node that would overlap node-1's pods, or take node-1's address,
	// cannot join: its agent refuses to start and says why.
	joinRefused(t, l, "10.244.0.0/24", "192.168.123.50", "overlaps node node-1's 10.244.0.0/24")
	joinRefused(t, l, "10.244.7.0/24", "192.168.123.1", "InternalIP 192.168.123.1 is node node-1's")
}

// joinRefused starts one more agent (in a namespace of its own) that asks
// to join lab l with a Node of that pod CIDR and address, and checks that
// it exits with the control plane's refusal.
func joinRefused(t *testing.T, l *lab, podCIDR, addr, want string) {
	t.Helper()
	extra := &lab{t: t, instance: l.instance + "x", netns: fmt.Sprintf("e2ej%06d", rand.IntN(1000000))}
	// The joining node holds its underlay address, as a node does (the
	// agent serves NodePorts on it and refuses an address it lacks).
	mustIP(t, [][]string{{"netns", "add", extra.netns}, {"-n", extra.netns, "link", "set", "lo", "up"},
		{"-n", extra.netns, "link", "add", "ul0", "type", "veth", "peer", "name", "ul1"},
		{"-n", extra.netns, "addr", "add", addr + "/24", "dev", "ul0"},
		{"-n", extra.netns, "link", "set", "ul0", "up"}, {"-n", extra.netns, "link", "set", "ul1", "up"}})
	t.Cleanup(func() {
		extra.shunt("lab", "down")
		exec.Command("ip", "netns", "del", extra.netns).Run()
		extra.assertGone()
	})
	out, err := exec.Command("nsenter", "--net=/run/netns/"+extra.netns, filepath.Join(binDir, "shuntd"), "--instance", extra.instance,
		"--lab-join", "/run/shunt/"+l.instance+"/shuntd.sock", "--node-name", "node-x", "--pod-cidr", podCIDR,
		"--underlay-addr", addr, "--service-cidr", "10.96.0.0/16").CombinedOutput()
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("joining with pod CIDR %s and address %s: %v, want a refusal saying %q:\n%s", podCIDR, addr, err, want, out)
	}
	if strings.Contains(l.mustShunt("get", "nodes"), "node-x") {
		t.Errorf("the refused node-x was stored")
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// podNodes maps every pod's name to its node.
func podNodes(t *testing.T, l *lab) map[string]string {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
			Spec     struct{ NodeName string }
		}
	}
	if err := json.Unmarshal([]byte(l.mustShunt("get", "pods", "-A", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range list.Items {
		out[p.Metadata.Name] = p.Spec.NodeName
	}
	return out
}

// nodeStatus maps every node to its Ready condition's status.
func nodeStatus(t *testing.T, l *lab) map[string]string {
	t.Helper()
	var nodes struct {
		Items []struct {
			Metadata struct{ Name string }
			Status   struct {
				Conditions []struct{ Type, Status string }
			}
		}
	}
	if err := json.Unmarshal([]byte(l.mustShunt("get", "nodes", "-o", "json")), &nodes); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == "Ready" {
				out[n.Metadata.Name] = c.Status
			}
		}
	}
	return out
}

// checkLabNodesListed: both nodes Ready with their pod CIDRs and
// addresses, and each node's status lists the other as a ready peer.
func checkLabNodesListed(t *testing.T, l *lab) {
	t.Helper()
	if st := nodeStatus(t, l); st["node-1"] != "True" || st["node-2"] != "True" {
		t.Errorf("nodes %v, want node-1 and node-2 Ready", st)
	}
	wide := l.mustShunt("get", "nodes", "-o", "wide")
	for _, want := range []string{"10.244.0.0/24", "10.244.1.0/24", "192.168.123.1", "192.168.123.2"} {
		if !strings.Contains(wide, want) {
			t.Errorf("get nodes -o wide lacks %s:\n%s", want, wide)
		}
	}
	var st struct {
		Routing struct {
			Peers []struct {
				Node, Address string
				Ready         bool
			}
		}
	}
	if err := json.Unmarshal([]byte(l.node(2).mustShunt("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Routing.Peers) != 1 || st.Routing.Peers[0].Node != "node-1" || st.Routing.Peers[0].Address != "192.168.123.1" || !st.Routing.Peers[0].Ready {
		t.Errorf("node-2's peers %+v, want node-1 at 192.168.123.1, ready", st.Routing.Peers)
	}
}

func serviceIP(t *testing.T, l *lab, name string) string {
	t.Helper()
	var svc struct{ Spec struct{ ClusterIP string } }
	if err := json.Unmarshal([]byte(l.mustShunt("get", "service", name, "-o", "json")), &svc); err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

type externalHost struct{ netns, addr string }

// labExternal is the lab's host outside the cluster.
func labExternal(t *testing.T, l *lab) externalHost {
	t.Helper()
	out := l.mustShunt("lab", "exec", "--external", "--", "ip", "-4", "-o", "addr", "show", "dev", "ul0")
	f := strings.Fields(out)
	for i, w := range f {
		if w == "inet" && i+1 < len(f) {
			p, err := netip.ParsePrefix(f[i+1])
			if err != nil {
				t.Fatal(err)
			}
			return externalHost{netns: l.instance + "-external", addr: p.Addr().String()}
		}
	}
	t.Fatalf("the external host has no address:\n%s", out)
	return externalHost{}
}

// TestLabNodesL7: examples/l7 with its clients on node-1 and every server
// on node-2. The client's node sends the connections to its own proxy: the
// HTTPRoute splits 90/10 over backends of the other node, and the HTTP
// rules of a pod of the other node decide each request (before, a client
// of another node reached that port with no HTTP rule applied); the
// proxy's connection carries its client's identity in the VNI, which the
// server's node admits at L4.
func TestLabNodesL7(t *testing.T) {
	l := newLabNodes(t, 2, nil, "testdata/lab-nodes-l7.yaml")
	backend, reviews := l.podIP("backend"), serviceIP(t, l, "reviews")
	get := func(pod string, args ...string) string {
		t.Helper()
		out, _ := l.shunt(append([]string{"lab", "exec", pod, "--", filepath.Join(binDir, "shunt"), "lab", "http-get"}, args...)...)
		return out
	}
	waitFor(t, 10*time.Second, "the backend answering through node-1's proxy", func() bool {
		return strings.HasPrefix(get("frontend", "http://"+backend+":8080/metrics"), "200")
	})
	if out := get("frontend", "http://"+backend+":8080/admin"); !strings.HasPrefix(out, "403") || !strings.Contains(out, "ShuntNetworkPolicy default/backend-http") {
		t.Errorf("frontend GET /admin on the other node's backend: %q, want 403 naming the policy", out)
	}
	if out := get("frontend", "http://"+serviceIP(t, l, "backend")+":8080/admin"); !strings.HasPrefix(out, "403") {
		t.Errorf("frontend GET /admin through the ClusterIP: %q, want 403", out)
	}
	if out := get("monitoring", "-X", "POST", "http://"+backend+":8080/admin"); !strings.HasPrefix(out, "200") {
		t.Errorf("monitoring POST /admin: %q, want 200", out)
	}
	var load struct{ ByPod, ByStatus map[string]int }
	out := l.mustShunt("lab", "exec", "frontend", "--", filepath.Join(binDir, "shunt"), "lab", "http-load", "--url", "http://"+reviews+":9080/", "-n", "100", "-c", "1")
	if err := json.Unmarshal([]byte(out), &load); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if load.ByPod["reviews-v1"] != 90 || load.ByPod["reviews-v2"] != 10 || load.ByStatus["200"] != 100 {
		t.Errorf("100 requests split %v (%v), want reviews-v1 90, reviews-v2 10, all 200", load.ByPod, load.ByStatus)
	}
	var st struct {
		Counters []struct{ Reason, Direction string }
	}
	if err := json.Unmarshal([]byte(l.mustShunt("status", "--node", "node-1", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fmt.Sprint(st.Counters), "proxy-identity to-overlay") {
		t.Errorf("node-1 counted no proxy connection carrying its client's identity: %v", st.Counters)
	}
}

// checkRelay: `shunt relay` follows every node of the lab and `observe
// --all-nodes` reads the merged stream through it, in time order, with
// each flow's node and the filters observe has; the relay lists the nodes
// it follows.
func checkRelay(t *testing.T, l *lab, server string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // the relay takes the port (on node-1's loopback, not this one)
	cmd := exec.Command("nsenter", "--net=/run/netns/"+l.netns, filepath.Join(binDir, "shunt"), "--instance", l.instance, "relay", "--listen", addr)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("relay log:\n%s", log.String())
		}
	}()
	// New flows on both nodes while the relay follows: the intruder's
	// drop on node-2, the client's connection from node-1.
	var got string
	deadline := time.Now().Add(20 * time.Second)
	for {
		l.probe("intruder", "timeout", "--tcp", server+":7000")
		out, code := l.shunt("observe", "--all-nodes", "--relay", addr, "--last", "2000", "-o", "json")
		got = out
		if code == 0 && strings.Contains(out, `"node":"node-1"`) && strings.Contains(out, `"node":"node-2"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("observe --all-nodes through the relay at %s: want flows of node-1 and node-2:\n%s", addr, got)
		}
		time.Sleep(500 * time.Millisecond)
	}
	var prev time.Time
	for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
		var fl struct {
			Time time.Time `json:"time"`
		}
		if err := json.Unmarshal([]byte(line), &fl); err != nil {
			t.Fatalf("relay flow %q: %v", line, err)
		}
		if fl.Time.Before(prev) {
			t.Errorf("relay's flows out of time order: %s after %s", fl.Time, prev)
			break
		}
		prev = fl.Time
	}
	dropped := l.mustShunt("observe", "--all-nodes", "--relay", addr, "--node", "node-2", "--verdict", "DROPPED", "--last", "2000", "-o", "json")
	if !strings.Contains(dropped, "default/intruder") || strings.Contains(dropped, `"node":"node-1"`) {
		t.Errorf("observe --all-nodes --node node-2 --verdict DROPPED: want node-2's drops of the intruder only:\n%s", dropped)
	}
}
