package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestKubernetesTerminatingEndpointsServe: a Service whose only pod is
// being deleted but still serves (its EndpointSlice says ready false,
// serving true, terminating true, as the real controller writes it) keeps
// taking new connections on that pod, as kube-proxy does when no endpoint
// is ready anywhere, instead of refusing them during the pod's grace
// period.
func TestKubernetesTerminatingEndpointsServe(t *testing.T) {
	l := newKubeLab(t, "testdata/slowstop.yaml")
	vip := l.clusterIP("slowstop")
	if got := peers(l.probeJSON("client", "--tcp", vip+":80", "--count", "3")); got["slowstop"] != 3 {
		t.Fatalf("before the deletion: %v, want 3 connections to slowstop", got)
	}
	if _, err := l.kubectl(nil, "delete", "pod", "slowstop", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	// Once the node's agent sees the endpoint terminating, and has had a
	// moment to program it.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(l.mustShunt("get", "endpointslices"), "(terminating)") {
		if time.Now().After(deadline) {
			t.Fatalf("the slowstop endpoint never showed as terminating:\n%s", l.mustShunt("get", "endpointslices"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	if got := peers(l.probeJSON("client", "--tcp", vip+":80", "--count", "5")); got["slowstop"] != 5 {
		t.Errorf("while slowstop terminates, still serving, with no other endpoint: %v, want 5 connections to it", got)
	}
	// Not left to the lab's removal, which would wait for its grace period.
	if _, err := l.kubectl(nil, "delete", "pod", "slowstop", "--grace-period=0", "--force"); err != nil {
		t.Error(err)
	}
}
