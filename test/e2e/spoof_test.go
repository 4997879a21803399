package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/podnet"
)

// Attacks from inside a pod, run as a container with the capabilities a
// container runtime grants by default (CAP_NET_RAW, no NET_ADMIN), by
// testdata/spoof.py.

// spoofPort marks the attack's packets, so the capture sees only them.
const spoofPort = 4242

func spoofScript(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("testdata/spoof.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// attackerPod is a pod manifest whose container runs script (sh -c, with
// $SHUNT_POD_IP its own address), then sleeps.
func attackerPod(t *testing.T, name, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".yaml")
	writeFile(t, p, fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec:\n  containers:\n  - name: c\n    command: [sh, -c, %q]\n",
		name, script+"; sleep infinity"))
	return p
}

// TestPodCannotForgeIPv4Source: a pod sends, from a raw socket, a TCP SYN,
// a UDP datagram and an ICMP echo with another pod's address and with the
// node's address as source: none reaches the target pod (a capture on its
// eth0 sees only what the attacker sent from its own address, sent in the
// same rounds), and each is counted and reported as spoofed.
func TestPodCannotForgeIPv4Source(t *testing.T) {
	script := spoofScript(t)
	manifest := filepath.Join(t.TempDir(), "pods.yaml")
	writeFile(t, manifest, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: target}
spec:
  containers:
  - {name: capture, command: [python3, %s, capture, "%d"]}
---
apiVersion: v1
kind: Pod
metadata: {name: victim}
spec:
  containers:
  - {name: serve, command: [shunt, lab, serve, --tcp, "7000"]}
`, script, spoofPort))
	l := newLab(t, "redirect-peer", manifest)
	target, victim, node := l.podIP("target"), l.podIP("victim"), l.status().NodeIP
	if out := l.waitLogs("target", "capturing"); !strings.Contains(out, "capturing") {
		t.Fatalf("the capture in the target pod did not start:\n%s", out)
	}
	before := l.status().counter("spoofed", "from-pod")

	l.mustShunt("apply", "-f", attackerPod(t, "attacker", fmt.Sprintf(`python3 %s send %s %d %s %s "$SHUNT_POD_IP"`,
		script, target, spoofPort, victim, node)))
	if out := l.waitLogs("attacker", "sent"); !strings.Contains(out, "sent") {
		t.Fatalf("the attacker did not send:\n%s", out)
	}
	own := l.podIP("attacker")
	// The attacker's own packets went in the same rounds, after the forged
	// ones: once they are all in, so would the forged ones be.
	var seen string
	for _, proto := range []string{"tcp", "udp", "icmp"} {
		want := fmt.Sprintf("seen %s %s %s", proto, own, target)
		if seen = l.waitLogs("target", want); !strings.Contains(seen, want) {
			t.Fatalf("the attacker's %s packet from its own address did not reach the target (the attack proves nothing):\n%s", proto, seen)
		}
	}
	for _, forged := range []string{victim, node} {
		if strings.Contains(seen, " "+forged+" "+target) {
			t.Errorf("a packet with forged source %s reached the target:\n%s", forged, seen)
		}
	}

	// 3 rounds x 3 protocols x 2 forged sources.
	if n := l.status().counter("spoofed", "from-pod") - before; n != 18 {
		t.Errorf("spoofed counter rose by %d, want 18", n)
	}
	if n := l.metric("shunt_datapath_packets_total", `reason="spoofed"`); n < 18 {
		t.Errorf("metric shunt_datapath_packets_total{reason=\"spoofed\"} = %v, want at least 18", n)
	}
	reported := map[string]bool{}
	for _, f := range l.observe("--verdict", "DROPPED", "--last", "1000") {
		if f.Reason == "spoofed" && f.Destination.IP == target {
			reported[f.Protocol+" from "+f.Source.IP] = true
		}
	}
	for _, forged := range []string{victim, node} {
		for _, proto := range []string{"TCP", "UDP", "ICMP"} {
			if !reported[proto+" from "+forged] {
				t.Errorf("no spoofed flow for %s from %s (reported: %v)", proto, forged, reported)
			}
		}
	}
}

// TestPodCannotClaimAddressesWithARP: a pod sends gratuitous ARP, ARP
// replies and ARP requests for its gateway claiming another pod's address,
// the gateway's and 200 others. The node learns none of them (before, each
// request for the gateway added a neighbour entry on the attacker's veth: a
// few thousand overflowed the node's neighbour table), the other pod stays
// reachable through its own veth, and every frame is counted as
// arp-spoofed.
func TestPodCannotClaimAddressesWithARP(t *testing.T) {
	l := newLab(t, "redirect-peer", twoPods)
	victim, node := l.podIP("server"), l.status().NodeIP
	victimNeigh := neighbours(t, l.hostVeth("server"))
	before := l.status().counter("arp-spoofed", "from-pod")

	claims := []string{victim, node}
	for i := 1; i <= 200; i++ {
		claims = append(claims, fmt.Sprintf("198.18.0.%d", i))
	}
	l.mustShunt("apply", "-f", attackerPod(t, "attacker", fmt.Sprintf("python3 %s arp %s %s", spoofScript(t), node, strings.Join(claims, " "))))
	if out := l.waitLogs("attacker", "sent"); !strings.Contains(out, "sent") {
		t.Fatalf("the attacker did not send:\n%s", out)
	}
	own := l.podIP("attacker")

	if got := neighbours(t, l.hostVeth("attacker")); len(got) != 1 || !strings.HasPrefix(got[0], own+" PERMANENT ") {
		t.Errorf("%d neighbours on the attacker's veth (first: %v), want only its own address %s", len(got), got[:min(len(got), 4)], own)
	}
	if got := neighbours(t, l.hostVeth("server")); !slices.Equal(got, victimNeigh) {
		t.Errorf("neighbours on the victim's veth changed: %v, before %v", got, victimNeigh)
	}
	l.probe("", "connected", "--tcp", victim+":7000")
	l.probe("client", "connected", "--tcp", victim+":7000")
	// 202 claims x 3 frames x 3 rounds.
	if n := l.status().counter("arp-spoofed", "from-pod") - before; n != 1818 {
		t.Errorf("arp-spoofed counter rose by %d, want 1818", n)
	}
	found := false
	for _, f := range l.observe("--verdict", "DROPPED", "--last", "2000") {
		found = found || (f.Reason == "arp-spoofed" && f.Source.IP == victim && f.Destination.IP == node)
	}
	if !found {
		t.Error("no arp-spoofed flow claiming the victim's address toward the gateway")
	}
}

// hostVeth names the node side of a pod's veth (found by its alias).
func (l *lab) hostVeth(pod string) string {
	l.t.Helper()
	names, err := podnet.LinksWithAliasPrefix("shunt:" + l.instance + ":default/" + pod)
	if err != nil || len(names) != 1 {
		l.t.Fatalf("host veth of pod %s: %v %v", pod, names, err)
	}
	return names[0]
}

// neighbours lists the node's IPv4 neighbour entries on an interface as
// "ADDRESS STATE MAC", sorted.
func neighbours(t *testing.T, ifName string) []string {
	t.Helper()
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		t.Fatal(err)
	}
	list, err := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range list {
		out = append(out, n.IP.String()+" "+neighState(n.State)+" "+net.HardwareAddr(n.HardwareAddr).String())
	}
	slices.Sort(out)
	return out
}

func neighState(s int) string {
	switch s {
	case netlink.NUD_PERMANENT:
		return "PERMANENT"
	case netlink.NUD_REACHABLE:
		return "REACHABLE"
	case netlink.NUD_STALE:
		return "STALE"
	case netlink.NUD_FAILED:
		return "FAILED"
	case netlink.NUD_INCOMPLETE:
		return "INCOMPLETE"
	}
	return fmt.Sprintf("state-%#x", s)
}

// TestPodReachesAgentOnlyAsAllowed: the agent's API is a Unix socket only
// root can open (a container running as another user cannot); its metrics
// listener, here on all the node's addresses, answers a pod as any service
// of the node does (Kubernetes: pods reach their node unless an egress
// policy says otherwise), and not a pod whose egress is isolated, neither
// at the node's address nor over IPv6 at its veth's link-local address,
// until a policy allows that port.
func TestPodReachesAgentOnlyAsAllowed(t *testing.T) {
	manifest := filepath.Join(t.TempDir(), "pods.yaml")
	writeFile(t, manifest, `
apiVersion: v1
kind: Pod
metadata: {name: free}
spec:
  containers:
  - {name: c, command: [sleep, infinity]}
---
apiVersion: v1
kind: Pod
metadata: {name: isolated, labels: {role: isolated}}
spec:
  containers:
  - {name: c, command: [sleep, infinity]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: no-egress}
spec:
  podSelector: {matchLabels: {role: isolated}}
  policyTypes: [Egress]
`)
	l := newLabWith(t, []string{"--mode", "redirect-peer", "--metrics-addr", ":0"}, manifest)
	var st struct {
		NodeIP      string `json:"nodeIP"`
		MetricsAddr string `json:"metricsAddr"`
	}
	if err := json.Unmarshal([]byte(l.mustShunt("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(st.MetricsAddr)
	if err != nil {
		t.Fatalf("metrics address %q: %v", st.MetricsAddr, err)
	}
	metrics := "http://" + net.JoinHostPort(st.NodeIP, port) + "/metrics"
	// The address the isolated pod's host veth would have (EUI-64 of its
	// MAC) if IPv6 were on: where it used to answer.
	veth, err := netlink.LinkByName(l.hostVeth("isolated"))
	if err != nil {
		t.Fatal(err)
	}
	mac := veth.Attrs().HardwareAddr
	linkLocal := fmt.Sprintf("fe80::%02x%02x:%02xff:fe%02x:%02x%02x", mac[0]^2, mac[1], mac[2], mac[3], mac[4], mac[5])
	metricsV6 := "http://" + net.JoinHostPort(linkLocal+"%25eth0", port) + "/metrics"

	l.probe("free", "connected", "--http", metrics)
	l.probe("isolated", "timeout", "--http", metrics)
	for _, pod := range []string{"free", "isolated"} {
		for _, r := range l.probeJSON(pod, "--http", metricsV6) {
			if r.Result == "connected" {
				t.Errorf("pod %s reached the metrics listener over IPv6 at %s", pod, metricsV6)
			}
		}
	}
	allow := filepath.Join(t.TempDir(), "allow.yaml")
	writeFile(t, allow, fmt.Sprintf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: metrics}
spec:
  podSelector: {matchLabels: {role: isolated}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: %s/32}}]
    ports: [{protocol: TCP, port: %s}]
`, st.NodeIP, port))
	l.mustShunt("apply", "-f", allow)
	l.probe("isolated", "connected", "--http", metrics)

	user := filepath.Join(t.TempDir(), "user.yaml")
	writeFile(t, user, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: user}
spec:
  securityContext: {runAsUser: 1000, runAsGroup: 1000}
  containers:
  - name: c
    command: [python3, -c, "import socket, time\ntry:\n  socket.socket(socket.AF_UNIX).connect('%s'); print('connected', flush=True)\nexcept OSError as e: print('refused:', e, flush=True)\ntime.sleep(3600)"]
`, instance.Instance{Name: l.instance}.Socket()))
	l.mustShunt("apply", "-f", user)
	if out := l.waitLogs("user", "refused:"); !strings.Contains(out, "refused: [Errno 13] Permission denied") {
		t.Errorf("a container running as uid 1000 asked the agent's API for its status: want permission denied:\n%s", out)
	}
}
