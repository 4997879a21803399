package services

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

const lbDoc = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalTrafficPolicy: %s
  externalIPs: [192.0.2.7, "2001:db8::7"]
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: dns, port: 53, targetPort: 5353, nodePort: 30053, protocol: UDP}
status:
  loadBalancer:
    ingress: [{ip: 192.168.124.1}]
`

func lbService(t *testing.T, policy string) *corev1.Service {
	return parse[*corev1.Service](t, strings.Replace(lbDoc, "%s", policy, 1))
}

// webSlices: 10.0.0.1 on node-1, 10.0.0.2 on node-2, 10.0.0.3 on node-1
// but terminating.
func webSlices() []*discoveryv1.EndpointSlice {
	yes, no := true, false
	n1, n2 := "node-1", "node-2"
	http, dns := "http", "dns"
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p8080, p5353 := int32(8080), int32(5353)
	return []*discoveryv1.EndpointSlice{{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &http, Protocol: &tcp, Port: &p8080}, {Name: &dns, Protocol: &udp, Port: &p5353}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, NodeName: &n1, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.0.0.2"}, NodeName: &n2, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.0.0.3"}, NodeName: &n1, Conditions: discoveryv1.EndpointConditions{Ready: &no, Terminating: &yes}},
		},
	}}
}

var node1 = Node{Name: "node-1", NodePortAddrs: []netip.Addr{netip.MustParseAddr("192.168.123.1"), netip.MustParseAddr("10.244.1.1")}}

type frontendRow struct {
	kind     Kind
	frontend string
	backends []string
	local    bool
}

func rows(ports []Port) []frontendRow {
	var out []frontendRow
	for _, p := range ports {
		r := frontendRow{kind: p.Kind, frontend: netip.AddrPortFrom(p.VIP, p.Port).String() + map[uint8]string{6: "/tcp", 17: "/udp"}[p.Proto], local: p.LocalOnly}
		for _, b := range p.Backends {
			r.backends = append(r.backends, netip.AddrPortFrom(b.IP, b.Port).String())
		}
		out = append(out, r)
	}
	return out
}

// TestPortsForLoadBalancer: a LoadBalancer Service has, per port, its
// ClusterIP, a NodePort on each of the node's addresses, its IPv4
// externalIP and its load balancer ingress address, each balancing over
// every ready endpoint (Cluster); the IPv6 externalIP has none.
func TestPortsForLoadBalancer(t *testing.T) {
	got := rows(PortsFor(lbService(t, "Cluster"), webSlices(), node1))
	both := []string{"10.0.0.1:8080", "10.0.0.2:8080"}
	bothDNS := []string{"10.0.0.1:5353", "10.0.0.2:5353"}
	want := []frontendRow{
		{KindClusterIP, "10.96.0.10:80/tcp", both, false},
		{KindClusterIP, "10.96.0.10:53/udp", bothDNS, false},
		{KindNodePort, "192.168.123.1:30080/tcp", both, false},
		{KindNodePort, "10.244.1.1:30080/tcp", both, false},
		{KindExternalIP, "192.0.2.7:80/tcp", both, false},
		{KindLoadBalancer, "192.168.124.1:80/tcp", both, false},
		{KindNodePort, "192.168.123.1:30053/udp", bothDNS, false},
		{KindNodePort, "10.244.1.1:30053/udp", bothDNS, false},
		{KindExternalIP, "192.0.2.7:53/udp", bothDNS, false},
		{KindLoadBalancer, "192.168.124.1:53/udp", bothDNS, false},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("frontends:\n%v\nwant:\n%v", got, want)
	}
}

// TestPortsForLocal: with externalTrafficPolicy Local the outside
// frontends balance over this node's ready endpoints only (none on a node
// without one: traffic there is dropped, as kube-proxy does), the
// ClusterIP still over all of them.
func TestPortsForLocal(t *testing.T) {
	svc := lbService(t, "Local")
	for _, tc := range []struct {
		node Node
		want []string
	}{
		{node1, []string{"10.0.0.1:8080"}},
		{Node{Name: "node-3", NodePortAddrs: []netip.Addr{netip.MustParseAddr("192.168.123.3")}}, nil},
	} {
		for _, r := range rows(PortsFor(svc, webSlices(), tc.node)) {
			if !strings.HasSuffix(r.frontend, "/tcp") {
				continue
			}
			if r.kind == KindClusterIP {
				if len(r.backends) != 2 || r.local {
					t.Errorf("%s: ClusterIP %v, want both endpoints", tc.node.Name, r)
				}
				continue
			}
			if !r.local || !reflect.DeepEqual(r.backends, tc.want) {
				t.Errorf("%s: %v, want local-only backends %v", tc.node.Name, r, tc.want)
			}
		}
	}
}

// TestPortsForTypes: a ClusterIP Service has no NodePort frontends even
// on a node with addresses, a NodePort Service no load balancer one even
// with a status, and externalIPs count whatever the type.
func TestPortsForTypes(t *testing.T) {
	svc := lbService(t, "Cluster")
	svc.Spec.Type = corev1.ServiceTypeNodePort
	kinds := map[Kind]int{}
	for _, p := range PortsFor(svc, webSlices(), node1) {
		kinds[p.Kind]++
	}
	if !reflect.DeepEqual(kinds, map[Kind]int{KindClusterIP: 2, KindNodePort: 4, KindExternalIP: 2}) {
		t.Errorf("NodePort Service frontends by kind %v", kinds)
	}
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	clear(kinds)
	for _, p := range PortsFor(svc, webSlices(), node1) {
		kinds[p.Kind]++
	}
	if !reflect.DeepEqual(kinds, map[Kind]int{KindClusterIP: 2, KindExternalIP: 2}) {
		t.Errorf("ClusterIP Service with externalIPs: frontends by kind %v", kinds)
	}
}

// TestPortsForBesideKubeProxy: with kube-proxy serving the outside
// frontends (--kube-proxy-replacement=false), a LoadBalancer Service with
// externalIPs keeps only its ClusterIP ports, with the same backends; a
// pod's hostPort (no kube-proxy's) keeps its frontends.
func TestPortsForBesideKubeProxy(t *testing.T) {
	beside := node1
	beside.ExternalByKubeProxy = true
	got := rows(PortsFor(lbService(t, "Cluster"), webSlices(), beside))
	var want []frontendRow
	for _, r := range rows(PortsFor(lbService(t, "Cluster"), webSlices(), node1)) {
		if r.kind == KindClusterIP {
			want = append(want, r)
		}
	}
	if len(want) != 2 || !reflect.DeepEqual(got, want) {
		t.Errorf("beside kube-proxy: %+v, want the ClusterIP ports %+v", got, want)
	}
	pod := parse[*corev1.Pod](t, `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: shop}
spec:
  nodeName: node-1
  containers: [{name: c, image: x, ports: [{containerPort: 8080, hostPort: 9090}]}]
status: {podIP: 10.0.0.9}
`)
	if n, m := len(HostPortsFor(pod, beside)), len(HostPortsFor(pod, node1)); n == 0 || n != m {
		t.Errorf("hostPort frontends beside kube-proxy: %d, without: %d; want the same, not none", n, m)
	}
}

// TestUnsupportedOutsideFields: every outside-facing field shunt does not
// implement is named, none silently dropped.
func TestUnsupportedOutsideFields(t *testing.T) {
	svc := lbService(t, "Local")
	local := corev1.ServiceInternalTrafficPolicyLocal
	dist := "PreferSomewhereElse" // a value of a later Kubernetes
	svc.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "2001:db8::/64", "bogus"}
	svc.Spec.InternalTrafficPolicy = &local
	svc.Spec.TrafficDistribution = &dist
	svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{Hostname: "lb.example"})
	var reasons []string
	for _, is := range Unsupported(svc) {
		reasons = append(reasons, is.Reason)
	}
	want := []string{"IPv6NotSupported", "LoadBalancerHostnameNotSupported", "IPv6NotSupported", "InvalidSourceRange",
		"TrafficDistributionNotSupported"}
	if !reflect.DeepEqual(reasons, want) {
		t.Errorf("issues %v, want %v", reasons, want)
	}
	if is := Unsupported(lbService(t, "Cluster")); len(is) != 1 || !strings.Contains(is[0].Message, "externalIP 2001:db8::7") {
		t.Errorf("a Service with only its IPv6 externalIP unsupported: %v", is)
	}
	pod := pod(t, "hp", "web", 8080)
	pod.Spec.Containers[0].Ports[0].HostPort = 80
	if is := HostPortIssues(pod); len(is) != 0 {
		t.Errorf("hostPort issues %v, want none (implemented)", is)
	}
	pod.Spec.Containers[0].Ports[0].HostIP = "2001:db8::1"
	if is := HostPortIssues(pod); len(is) != 1 || is[0].Reason != "IPv6NotSupported" || !strings.Contains(is[0].Message, "hostPort 80/TCP") {
		t.Errorf("hostPort issues of an IPv6 hostIP %v", is)
	}
}

// TestHealthChecks: a Local Service's health check counts this node's
// ready endpoints (a terminating one does not count); a Cluster Service
// or one without a health check port has none.
func TestHealthChecks(t *testing.T) {
	local := lbService(t, "Local")
	local.Spec.HealthCheckNodePort = 30500
	cluster := lbService(t, "Cluster")
	cluster.Name = "cluster"
	noPort := lbService(t, "Local")
	noPort.Name = "noport"
	slicesOf := func(ns, name string) []*discoveryv1.EndpointSlice { return webSlices() }
	svcs := []*corev1.Service{local, cluster, noPort}
	if got, want := HealthChecks(svcs, slicesOf, "node-1"), []HealthCheck{{"shop", "web", 30500, 1}}; !reflect.DeepEqual(got, want) {
		t.Errorf("node-1: %v, want %v", got, want)
	}
	if got, want := HealthChecks(svcs, slicesOf, "node-3"), []HealthCheck{{"shop", "web", 30500, 0}}; !reflect.DeepEqual(got, want) {
		t.Errorf("node-3: %v, want %v", got, want)
	}
}

// TestDeriveSlicesNodeName: the lab's endpoint controller writes each
// endpoint's node, as Kubernetes' does: Local reads it.
func TestDeriveSlicesNodeName(t *testing.T) {
	svc := parse[*corev1.Service](t, svcDoc)
	placed, unplaced := pod(t, "a", "web", 8080), pod(t, "b", "web", 8080)
	placed.Spec.NodeName = "node-2"
	slices := DeriveSlices(svc, []Pod{{Pod: placed, IP: "10.0.0.2", Ready: true}, {Pod: unplaced, IP: "10.0.0.3", Ready: true}})
	if len(slices) != 1 || len(slices[0].Endpoints) != 2 {
		t.Fatalf("slices %+v", slices)
	}
	if n := slices[0].Endpoints[0].NodeName; n == nil || *n != "node-2" {
		t.Errorf("placed pod's endpoint node %v, want node-2", n)
	}
	if n := slices[0].Endpoints[1].NodeName; n != nil {
		t.Errorf("unplaced pod's endpoint node %q, want none", *n)
	}
}

// TestPortsForLocalTerminating: with no ready endpoint on the node, a
// Local Service's outside frontends use the node's endpoints that are
// terminating but still serving, as kube-proxy does; the ClusterIP never
// does, nor does a node that has a ready one.
func TestPortsForLocalTerminating(t *testing.T) {
	svc := lbService(t, "Local")
	slices := webSlices()
	yes := true
	eps := slices[0].Endpoints
	eps[2].Conditions.Serving = &yes // 10.0.0.3 on node-1: terminating, serving
	withReady := rows(PortsFor(svc, slices, node1))
	slices[0].Endpoints = eps[1:] // 10.0.0.1, node-1's ready one, gone
	without := rows(PortsFor(svc, slices, node1))
	for _, tc := range []struct {
		rows []frontendRow
		want string
	}{{withReady, "10.0.0.1:8080"}, {without, "10.0.0.3:8080"}} {
		for _, r := range tc.rows {
			if r.frontend == "192.168.123.1:30080/tcp" && (len(r.backends) != 1 || r.backends[0] != tc.want) {
				t.Errorf("NodePort backends %v, want %s", r.backends, tc.want)
			}
			if r.kind == KindClusterIP && strings.HasSuffix(r.frontend, "/tcp") && strings.Contains(strings.Join(r.backends, ","), "10.0.0.3") {
				t.Errorf("the ClusterIP uses a terminating endpoint: %v", r.backends)
			}
		}
	}
}

// TestSourceRanges: the load balancer frontends carry the Service's
// IPv4 source ranges, canonical and sorted (the annotation when the
// field is empty); the NodePorts, externalIPs and ClusterIP none; ranges
// that all fall out admit no client rather than every one.
func TestSourceRanges(t *testing.T) {
	svc := lbService(t, "Cluster")
	svc.Spec.LoadBalancerSourceRanges = []string{"203.0.113.9/24", " 198.51.100.0/24", "198.51.100.0/24", "2001:db8::/64"}
	want := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24")}
	for _, p := range PortsFor(svc, webSlices(), node1) {
		switch {
		case p.Kind == KindLoadBalancer && !reflect.DeepEqual(p.SourceRanges, want):
			t.Errorf("%s %v: ranges %v, want %v", p.Kind, p.Frontend, p.SourceRanges, want)
		case p.Kind != KindLoadBalancer && p.SourceRanges != nil:
			t.Errorf("%s %v: ranges %v, want none (kube-proxy guards the load balancer addresses only)", p.Kind, p.Frontend, p.SourceRanges)
		}
	}
	for _, tc := range []struct {
		field      []string
		annotation string
		want       []string
	}{
		{nil, "", nil},
		{nil, "10.0.0.0/8, 192.0.2.1/32", []string{"10.0.0.0/8", "192.0.2.1/32"}},
		{[]string{"192.0.2.0/24"}, "10.0.0.0/8", []string{"192.0.2.0/24"}},
		{[]string{"2001:db8::/64"}, "", []string{"0.0.0.0/32"}},
	} {
		svc.Spec.LoadBalancerSourceRanges = tc.field
		svc.Annotations = map[string]string{SourceRangesAnnotation: tc.annotation}
		got, _ := SourceRanges(svc)
		var gotS []string
		for _, p := range got {
			gotS = append(gotS, p.String())
		}
		if !reflect.DeepEqual(gotS, tc.want) {
			t.Errorf("field %v, annotation %q: %v, want %v", tc.field, tc.annotation, gotS, tc.want)
		}
	}
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8"}
	if got, _ := SourceRanges(svc); got != nil {
		t.Errorf("a NodePort Service: ranges %v, want none", got)
	}
}

// TestPortsForInternalLocal: internalTrafficPolicy Local makes the
// ClusterIP balance over this node's endpoints only (the serving
// terminating ones when none is ready, as kube-proxy; none on a node
// without any: refused like a Service without endpoints); the outside
// frontends keep their own policy (Cluster here: every endpoint).
func TestPortsForInternalLocal(t *testing.T) {
	svc := lbService(t, "Cluster")
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc.Spec.InternalTrafficPolicy = &local
	yes := true
	terminatingServing := webSlices()
	terminatingServing[0].Endpoints[2].Conditions.Serving = &yes
	terminatingServing[0].Endpoints = terminatingServing[0].Endpoints[1:] // node-1's ready one gone
	for _, tc := range []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		node   Node
		want   []string
	}{
		{"node-1", webSlices(), node1, []string{"10.0.0.1:8080"}},
		{"node-1, only a terminating serving endpoint", terminatingServing, node1, []string{"10.0.0.3:8080"}},
		{"node-3, none", webSlices(), Node{Name: "node-3"}, nil},
	} {
		for _, r := range rows(PortsFor(svc, tc.slices, tc.node)) {
			switch {
			case r.frontend == "10.96.0.10:80/tcp" && !reflect.DeepEqual(r.backends, tc.want):
				t.Errorf("%s: ClusterIP backends %v, want %v", tc.name, r.backends, tc.want)
			case r.kind == KindNodePort && strings.HasSuffix(r.frontend, "/tcp") && len(r.backends) != 2 && tc.name == "node-1":
				t.Errorf("%s: NodePort backends %v, want every ready endpoint (externalTrafficPolicy Cluster)", tc.name, r.backends)
			}
		}
	}
}

// TestHostPortsFor: a pod's hostPort is a frontend on each of its node's
// addresses (or only its hostIP, 127.0.0.1 included) leading to the pod's
// address and container port; none on another node, for a pod without
// an address, or of the host's network.
func TestHostPortsFor(t *testing.T) {
	p := pod(t, "hp", "web", 8080)
	p.Spec.NodeName = "node-1"
	p.Status.PodIP = "10.244.1.5"
	p.Spec.Containers[0].Ports[0].HostPort = 80
	p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports,
		corev1.ContainerPort{ContainerPort: 5353, HostPort: 53, Protocol: corev1.ProtocolUDP, HostIP: "127.0.0.1"})
	got := rows(HostPortsFor(p, node1))
	want := []frontendRow{
		{KindHostPort, "192.168.123.1:80/tcp", []string{"10.244.1.5:8080"}, false},
		{KindHostPort, "10.244.1.1:80/tcp", []string{"10.244.1.5:8080"}, false},
		{KindHostPort, "127.0.0.1:53/udp", []string{"10.244.1.5:5353"}, false},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("frontends:\n%v\nwant:\n%v", got, want)
	}
	if ports := HostPortsFor(p, Node{Name: "node-2"}); ports != nil {
		t.Errorf("on another node: %v", ports)
	}
	hostNet := p.DeepCopy()
	hostNet.Spec.HostNetwork = true
	noIP := p.DeepCopy()
	noIP.Status.PodIP = ""
	for _, q := range []*corev1.Pod{hostNet, noIP} {
		if ports := HostPortsFor(q, node1); ports != nil {
			t.Errorf("%v", ports)
		}
	}
}

// TestTrafficDistribution: PreferSameNode uses this node's endpoints,
// else its zone's; PreferSameZone (and PreferClose) its zone's (an
// endpoint's own zone, else its node's label); with none of them, or no
// zone known, every endpoint, as kube-proxy falls back. An externally
// reached frontend with externalTrafficPolicy Cluster prefers alike.
// allocateLoadBalancerNodePorts false (no nodePort): no NodePort
// frontend.
func TestTrafficDistribution(t *testing.T) {
	zones := map[string]string{"node-1": "a", "node-2": "b", "node-3": "a", "node-4": "c"}
	at := func(name string) Node {
		return Node{Name: name, NodePortAddrs: []netip.Addr{netip.MustParseAddr("192.168.123.9")}, Zones: zones}
	}
	both := []string{"10.0.0.1:8080", "10.0.0.2:8080"}
	for _, tc := range []struct {
		dist string
		node Node
		want []string
	}{
		{"PreferSameNode", at("node-1"), []string{"10.0.0.1:8080"}},
		{"PreferSameNode", at("node-3"), []string{"10.0.0.1:8080"}}, // none here: its zone a has node-1's
		{"PreferSameNode", at("node-4"), both},                      // none in zone c either
		{"PreferSameZone", at("node-3"), []string{"10.0.0.1:8080"}},
		{"PreferClose", at("node-2"), []string{"10.0.0.2:8080"}},
		{"PreferSameZone", at("node-4"), both},
		{"PreferSameZone", Node{Name: "node-1"}, both}, // zones unknown
		{"", at("node-1"), both},
	} {
		svc := lbService(t, "Cluster")
		if tc.dist != "" {
			d := tc.dist
			svc.Spec.TrafficDistribution = &d
		}
		for _, r := range rows(PortsFor(svc, webSlices(), tc.node)) {
			if strings.HasSuffix(r.frontend, "/tcp") && !reflect.DeepEqual(r.backends, tc.want) {
				t.Errorf("%s on %s: %s %s backends %v, want %v", tc.dist, tc.node.Name, r.kind, r.frontend, r.backends, tc.want)
			}
		}
	}
	svc := lbService(t, "Cluster")
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = 0
	}
	for _, p := range PortsFor(svc, webSlices(), node1) {
		if p.Kind == KindNodePort {
			t.Errorf("a LoadBalancer without nodePorts has NodePort frontend %v", p.Frontend)
		}
	}
}

// TestPortsForForwardingMode: the annotation shunt.io/forwarding-mode
// gives every external frontend of the Service (NodePorts, externalIPs,
// load balancer addresses) its mode, never the ClusterIP; without it, or
// with a value shunt does not know (an issue of the Service), the node's
// mode holds ("").
func TestPortsForForwardingMode(t *testing.T) {
	for _, c := range []struct {
		annotation string
		want       dpinfo.NodePortMode
		issue      bool
	}{
		{"", "", false},
		{"dsr", dpinfo.NodePortDSR, false},
		{"snat", dpinfo.NodePortSNAT, false},
		{"hybrid", "", true},
		{"DSR", "", true},
	} {
		svc := lbService(t, "Cluster")
		if c.annotation != "" {
			svc.Annotations = map[string]string{dpinfo.ForwardingModeAnnotation: c.annotation}
		}
		external := 0
		for _, p := range PortsFor(svc, webSlices(), node1) {
			want := c.want
			if p.Kind == KindClusterIP {
				want = ""
			} else {
				external++
			}
			if p.Forwarding != want {
				t.Errorf("annotation %q: %s %s has forwarding %q, want %q", c.annotation, p.Kind, p.Name, p.Forwarding, want)
			}
		}
		if external != 8 {
			t.Errorf("annotation %q: %d external frontends, want 8", c.annotation, external)
		}
		var issues []Issue
		for _, is := range Unsupported(svc) {
			if is.Reason == "InvalidForwardingMode" {
				issues = append(issues, is)
			}
		}
		if got := len(issues) == 1 && strings.Contains(issues[0].Message, c.annotation) && strings.Contains(issues[0].Message, "node's mode"); got != c.issue {
			t.Errorf("annotation %q: issues %v, want an InvalidForwardingMode naming it: %v", c.annotation, issues, c.issue)
		}
	}
}

// TestForwardingIssues: on a node that cannot do DSR, a Service with
// external frontends asking for it is named (its flows are SNATed); one
// asking for SNAT, without the annotation, or with only a ClusterIP is not.
func TestForwardingIssues(t *testing.T) {
	svc := lbService(t, "Cluster")
	svc.Annotations = map[string]string{dpinfo.ForwardingModeAnnotation: "dsr"}
	is := ForwardingIssues(svc, "no native routing")
	if len(is) != 1 || is[0].Reason != "ForwardingModeNotSupported" || !strings.Contains(is[0].Message, "no native routing") || !strings.Contains(is[0].Message, "SNATed") {
		t.Errorf("a dsr Service: %v, want ForwardingModeNotSupported saying why and that it is SNATed", is)
	}
	clusterIP := lbService(t, "Cluster")
	clusterIP.Annotations = svc.Annotations
	clusterIP.Spec.Type, clusterIP.Spec.ExternalIPs = corev1.ServiceTypeClusterIP, nil
	snat := lbService(t, "Cluster")
	snat.Annotations = map[string]string{dpinfo.ForwardingModeAnnotation: "snat"}
	for what, s := range map[string]*corev1.Service{"snat": snat, "no annotation": lbService(t, "Cluster"), "ClusterIP only": clusterIP} {
		if is := ForwardingIssues(s, "no native routing"); len(is) != 0 {
			t.Errorf("%s: %v, want none", what, is)
		}
	}
}

// TestPortsForClusterFallsBackToTerminating: with no ready endpoint
// anywhere, the ClusterIP and the Cluster-policy frontends balance over
// every endpoint that is terminating but still serving (Serving unset
// counts as serving, as the API defines it), on any node, as kube-proxy
// does (CategorizeEndpoints); one ready endpoint anywhere ends that.
func TestPortsForClusterFallsBackToTerminating(t *testing.T) {
	yes, no := true, false
	allTerminating := webSlices()
	eps := allTerminating[0].Endpoints
	eps[0].Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes} // 10.0.0.1, node-1
	eps[1].Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &no, Terminating: &yes}  // 10.0.0.2, node-2: no longer serving
	// 10.0.0.3, node-1: terminating, Serving unset.
	oneReady := webSlices()
	oneReady[0].Endpoints[0].Conditions = eps[0].Conditions // 10.0.0.1 terminating; 10.0.0.2 stays ready
	sameNode := corev1.ServiceTrafficDistributionPreferSameNode

	for _, tc := range []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		node   Node
		dist   *string
		want   []string
	}{
		{"node-1, none ready", allTerminating, node1, nil, []string{"10.0.0.1:8080", "10.0.0.3:8080"}},
		{"node-3, none ready", allTerminating, Node{Name: "node-3"}, nil, []string{"10.0.0.1:8080", "10.0.0.3:8080"}},
		{"node-3, none ready, PreferSameNode", allTerminating, Node{Name: "node-3"}, &sameNode, []string{"10.0.0.1:8080", "10.0.0.3:8080"}},
		{"node-1, one ready on node-2", oneReady, node1, nil, []string{"10.0.0.2:8080"}},
	} {
		svc := lbService(t, "Cluster")
		svc.Spec.TrafficDistribution = tc.dist
		got := map[Kind][]string{}
		for _, r := range rows(PortsFor(svc, tc.slices, tc.node)) {
			if strings.HasSuffix(r.frontend, "/tcp") {
				if prev, ok := got[r.kind]; ok && !reflect.DeepEqual(prev, r.backends) {
					t.Errorf("%s: %s frontends differ: %v and %v", tc.name, r.kind, prev, r.backends)
				}
				got[r.kind] = r.backends
			}
		}
		for _, kind := range []Kind{KindClusterIP, KindNodePort, KindExternalIP, KindLoadBalancer} {
			if _, ok := got[kind]; tc.node.Name == "node-1" && !ok {
				t.Errorf("%s: no %s frontend", tc.name, kind)
			}
			if b, ok := got[kind]; ok && !reflect.DeepEqual(b, tc.want) {
				t.Errorf("%s: %s backends %v, want %v", tc.name, kind, b, tc.want)
			}
		}
		if b := rows(Ports(svc, netip.MustParseAddr("10.96.0.10"), tc.slices))[0].backends; !reflect.DeepEqual(b, tc.want) {
			t.Errorf("%s: Ports (no node) backends %v, want %v", tc.name, b, tc.want)
		}
	}
}
