package relay

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/kubetest"
	"github.com/shuntnet/shunt/internal/testpki"
)

// TestKubernetesAgentsFromAPIServer: against a real API server, the agents
// are the running pods the selector picks, each at its pod address and
// the agent port, named by its node; a pending pod, a pod of another
// selector and a terminating one are not followed. Through them the relay
// reads the agents' flows by mutual TLS.
func TestKubernetesAgentsFromAPIServer(t *testing.T) {
	kc := kubetest.Start(t)
	ca := testpki.NewCA(t)
	agentDir, relayDir := ca.Issue(t, "agent", true), ca.Issue(t, "relay", false)
	a := startAgent(t, "node-a", agentDir)
	a.history.Add(flowAt(time.Now(), 0, "default/a"))
	_, portText, _ := net.SplitHostPort(a.addr)
	port, _ := strconv.Atoi(portText)

	ctx := context.Background()
	pods := kc.Client.CoreV1().Pods("default")
	mk := func(name, node string, labels map[string]string, phase corev1.PodPhase, ip string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "shuntd", Image: "shunt"}}}}
		p, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if phase == "" {
			return
		}
		p.Status.Phase = phase
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agentLabels := map[string]string{"app.kubernetes.io/name": "shunt"}
	mk("shunt-a", "node-a", agentLabels, corev1.PodRunning, "127.0.0.1")
	mk("shunt-b", "node-b", agentLabels, "", "")                                                              // not started
	mk("other", "node-a", map[string]string{"app.kubernetes.io/name": "web"}, corev1.PodRunning, "127.0.0.2") // not an agent

	relayTLS, err := api.LoadTLS(relayDir, false)
	if err != nil {
		t.Fatal(err)
	}
	discover := KubernetesAgents(pods, "app.kubernetes.io/name=shunt", port, relayTLS)
	peers, err := discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(peers) != 1 || peers[0].Node != "node-a" || peers[0].Addr != a.addr {
		t.Fatalf("agents found %+v, want only node-a at %s", peers, a.addr)
	}
	r := New(discover, Options{Rescan: 100 * time.Millisecond})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(rctx)
	waitFor(t, "node-a's flow through the relay", func() bool { return r.History().Len() == 1 })

	// The agent pod goes: the relay lets the node go.
	if err := pods.Delete(ctx, "shunt-a", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node-a let go", func() bool { return len(r.Nodes()) == 0 })
}
