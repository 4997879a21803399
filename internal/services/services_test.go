package services

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

func parse[T any](t *testing.T, doc string) T {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return objs[0].Obj.(T)
}

func pod(t *testing.T, name, app string, apiPort int) *corev1.Pod {
	return parse[*corev1.Pod](t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, labels: {app: %s}}
spec:
  containers:
  - name: c
    command: [x]
    ports: [{name: api, containerPort: %d}]
`, name, app, apiPort))
}

const svcDoc = `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports:
  - {name: api, port: 80, targetPort: api}
  - {name: dns, port: 53, targetPort: 5353, protocol: UDP}
  - {name: sctp, port: 9, protocol: SCTP}
`

func TestDeriveSlicesResolvesNamedPortsPerPod(t *testing.T) {
	svc := parse[*corev1.Service](t, svcDoc)
	pods := []Pod{
		{Pod: pod(t, "a", "web", 8080), IP: "10.0.0.3", Ready: true},
		{Pod: pod(t, "b", "web", 8081), IP: "10.0.0.2", Ready: true},
		{Pod: pod(t, "c", "web", 8080), IP: "10.0.0.4", Ready: false},
		{Pod: pod(t, "other", "db", 8080), IP: "10.0.0.5", Ready: true},
		{Pod: pod(t, "noip", "web", 8080), IP: "", Ready: false},
	}
	slices := DeriveSlices(svc, pods)
	if len(slices) != 2 {
		t.Fatalf("%d slices, want 2 (one per resolved port set)", len(slices))
	}
	ports := Ports(svc, netip.MustParseAddr("10.96.0.10"), slices)
	if len(ports) != 2 {
		t.Fatalf("%d ports, want 2 (SCTP is not balanced at the socket layer)", len(ports))
	}
	api, dns := ports[0], ports[1]
	if got := fmt.Sprint(api.Backends); got != "[{10.0.0.2 8081} {10.0.0.3 8080}]" {
		t.Errorf("api backends %s: want b on 8081 and a on 8080, not-ready c left out, sorted", got)
	}
	if api.Proto != 6 || dns.Proto != 17 || dns.Port != 53 || len(dns.Backends) != 2 || dns.Backends[0].Port != 5353 {
		t.Errorf("ports %+v", ports)
	}
	if api.Name != "default/web:api" {
		t.Errorf("name %q", api.Name)
	}
}

func TestPortsFromHandWrittenSlices(t *testing.T) {
	svc := parse[*corev1.Service](t, `apiVersion: v1
kind: Service
metadata: {name: manual}
spec:
  sessionAffinity: ClientIP
  ports: [{name: api, port: 80}]
`)
	yes, no := true, false
	name, proto := "api", corev1.ProtocolTCP
	port := int32(9000)
	slice := &discoveryv1.EndpointSlice{
		Ports: []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}}, // ready unset: ready
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Terminating: &yes}}, // terminating
			{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},        // not ready
			{Addresses: []string{"10.0.0.1"}}, // duplicate
		},
	}
	ports := Ports(svc, netip.MustParseAddr("10.96.0.11"), []*discoveryv1.EndpointSlice{slice})
	if len(ports) != 1 || fmt.Sprint(ports[0].Backends) != "[{10.0.0.1 9000}]" {
		t.Fatalf("ports %+v: want only the ready, non-terminating endpoint once", ports)
	}
	if ports[0].AffinityTimeout != 10800 {
		t.Errorf("affinity timeout %d, want the ClientIP default 10800", ports[0].AffinityTimeout)
	}
	if got := Ports(svc, netip.Addr{}, nil); got != nil {
		t.Errorf("headless service (no ClusterIP) got entries %+v", got)
	}
	if got := Ports(svc, netip.MustParseAddr("10.96.0.11"), nil); len(got) != 1 || len(got[0].Backends) != 0 {
		t.Errorf("a service without endpoints must still be programmed (to refuse): %+v", got)
	}
}

// TestUnsupportedParts: SCTP ports and an IPv6 ClusterIP are named, and
// the IPv6 Service gets no entries (the datapath would refuse the whole
// table), while the TCP port of the other Service keeps its entry.
func TestUnsupportedParts(t *testing.T) {
	svc := &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{
		{Port: 80, Protocol: corev1.ProtocolTCP}, {Port: 9999, Protocol: corev1.ProtocolSCTP}}}}
	if got := Unsupported(svc); len(got) != 1 || got[0].Reason != "ProtocolNotSupported" || !strings.Contains(got[0].Message, "9999/SCTP") {
		t.Errorf("Unsupported(SCTP port) = %+v", got)
	}
	if ports := Ports(svc, netip.MustParseAddr(svc.Spec.ClusterIP), nil); len(ports) != 1 || ports[0].Port != 80 {
		t.Errorf("ports %+v, want the TCP one only", ports)
	}
	v6 := &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "fd00::10", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if got := Unsupported(v6); len(got) != 1 || got[0].Reason != "IPv6NotSupported" {
		t.Errorf("Unsupported(IPv6 ClusterIP) = %+v", got)
	}
	if ports := Ports(v6, netip.MustParseAddr(v6.Spec.ClusterIP), nil); ports != nil {
		t.Errorf("an IPv6 Service got entries: %+v", ports)
	}
}

// publishNotReadyAddresses: every selected pod with an address is a ready
// endpoint (terminating ones too), as Kubernetes' EndpointSlice controller
// writes them; without it only ready, non-terminating pods are. A
// finished pod is no endpoint either way.
func TestDeriveSlicesPublishNotReadyAddresses(t *testing.T) {
	finished := pod(t, "done", "web", 8080)
	finished.Status.Phase = corev1.PodSucceeded
	pods := []Pod{
		{Pod: pod(t, "a", "web", 8080), IP: "10.0.0.1", Ready: true},
		{Pod: pod(t, "b", "web", 8080), IP: "10.0.0.2", Ready: false},
		{Pod: pod(t, "c", "web", 8080), IP: "10.0.0.3", Ready: true, Terminating: true},
		{Pod: finished, IP: "10.0.0.4", Ready: false},
	}
	for _, c := range []struct {
		publish bool
		want    string // address:ready/serving/terminating
	}{
		{false, "10.0.0.1:true/true/false 10.0.0.2:false/false/false 10.0.0.3:false/true/true"},
		{true, "10.0.0.1:true/true/false 10.0.0.2:true/false/false 10.0.0.3:true/true/true"},
	} {
		svc := parse[*corev1.Service](t, svcDoc)
		svc.Spec.PublishNotReadyAddresses = c.publish
		slices := DeriveSlices(svc, pods)
		if len(slices) != 1 {
			t.Fatalf("publishNotReadyAddresses %v: %d slices, want 1", c.publish, len(slices))
		}
		var got []string
		for _, e := range slices[0].Endpoints {
			cd := e.Conditions
			got = append(got, fmt.Sprintf("%s:%v/%v/%v", e.Addresses[0], *cd.Ready, *cd.Serving, *cd.Terminating))
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("publishNotReadyAddresses %v: endpoints %s, want %s", c.publish, g, c.want)
		}
		ports := Ports(svc, netip.MustParseAddr("10.96.0.10"), slices)
		wantBackends := "[{10.0.0.1 8080}]"
		if c.publish {
			wantBackends = "[{10.0.0.1 8080} {10.0.0.2 8080} {10.0.0.3 8080}]"
		}
		if got := fmt.Sprint(ports[0].Backends); got != wantBackends {
			t.Errorf("publishNotReadyAddresses %v: backends %s, want %s", c.publish, got, wantBackends)
		}
	}
}
