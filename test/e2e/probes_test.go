package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The lab kubelet's probes and restarts, as a kubelet's: readiness decides
// whether a pod is a Service's backend (through the lab's EndpointSlice
// controller, and kube-controller-manager's with an API server), liveness
// restarts a container, restartPolicy decides what follows an exit.

// writeManifest writes a manifest into the test's directory.
func writeManifest(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// pod returns a pod of the default namespace as the API holds it.
func (l *lab) pod(name string) corev1.Pod {
	l.t.Helper()
	if l.kube != nil {
		p, err := l.kube.Client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			l.t.Fatal(err)
		}
		return *p
	}
	var list corev1.PodList
	if err := json.Unmarshal([]byte(l.mustShunt("get", "pods", "-o", "json")), &list); err != nil {
		l.t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.Name == name {
			return p
		}
	}
	l.t.Fatalf("pod %s not listed", name)
	return corev1.Pod{}
}

// waitPod waits until the pod is as ok says, and returns it.
func (l *lab) waitPod(name, what string, timeout time.Duration, ok func(corev1.Pod) bool) corev1.Pod {
	l.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p := l.pod(name)
		if ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			st, _ := json.MarshalIndent(p.Status, "", "  ")
			l.t.Fatalf("pod %s: not %s after %s; status:\n%s", name, what, timeout, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitReady waits until the pods are Ready: their readiness probes passed
// and the status says so.
func (l *lab) waitReady(pods ...string) {
	l.t.Helper()
	for _, name := range pods {
		l.waitPod(name, "Ready", 30*time.Second, podReady)
	}
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func TestReadinessProbeGatesEndpoints(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		readyFile := filepath.Join(t.TempDir(), "ready")
		// Each kind of probe once: startup tcpSocket, readiness exec (the
		// file) and gRPC health, liveness httpGet; all must pass for the
		// pod to serve, and none may restart it.
		manifest := writeManifest(t, "gated.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: gated, labels: {app: gated}}
spec:
  containers:
  - name: serve
    command: [shunt, lab, serve, --tcp, "8080", --http, "9090"]
    ports: [{name: api, containerPort: 8080}, {name: http, containerPort: 9090}]
    startupProbe: {tcpSocket: {port: api}, periodSeconds: 1, failureThreshold: 30}
    readinessProbe: {exec: {command: [test, -f, %q]}, periodSeconds: 1}
    livenessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 1, failureThreshold: 2}
  - name: grpc
    command: [shunt, lab, serve, --grpc, "9091"]
    readinessProbe: {grpc: {port: 9091}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: gated}
spec:
  selector: {app: gated}
  ports: [{name: api, port: 80, targetPort: api}]
---
apiVersion: v1
kind: Service
metadata: {name: gated-all}
spec:
  selector: {app: gated}
  publishNotReadyAddresses: true
  ports: [{name: api, port: 80, targetPort: api}]
`, readyFile))
		l := startLab(manifest)
		ip := l.podIP("gated")
		backend := ip + ":8080 (#"
		// Started (the TCP port answers), the gRPC container ready, the
		// serving one not: its file is missing.
		p := l.waitPod("gated", "started with serve unready and grpc ready", 30*time.Second, func(p corev1.Pod) bool {
			var serveStarted, grpcReady bool
			for _, c := range p.Status.ContainerStatuses {
				switch c.Name {
				case "serve":
					serveStarted = c.Started != nil && *c.Started && !c.Ready
				case "grpc":
					grpcReady = c.Ready
				}
			}
			return serveStarted && grpcReady
		})
		if podReady(p) {
			t.Fatal("pod Ready while its serve container's readiness probe fails")
		}
		time.Sleep(3 * time.Second) // three more failed readiness periods
		if p := l.pod("gated"); podReady(p) {
			t.Fatal("pod Ready while its readiness probe fails")
		}
		if dump := l.mustShunt("map", "dump", "services"); strings.Count(dump, backend) != 1 {
			t.Fatalf("the unready pod is a backend of %d services, want 1 (gated-all, which publishes not-ready addresses; not gated):\n%s",
				strings.Count(dump, backend), dump)
		}
		// The Service without endpoints refuses; the one that publishes
		// not-ready addresses reaches the pod (marked ready by the
		// EndpointSlice controller, the lab's as Kubernetes').
		l.probeRefusedByHooks("", "--tcp", l.clusterIP("gated")+":80")
		l.probe("", "connected", "--tcp", l.clusterIP("gated-all")+":80")

		if err := os.WriteFile(readyFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		l.waitPod("gated", "Ready", 15*time.Second, podReady)
		deadline := time.Now().Add(15 * time.Second)
		for strings.Count(l.mustShunt("map", "dump", "services"), backend) != 2 {
			if time.Now().After(deadline) {
				t.Fatalf("the ready pod is not a backend of both its services after 15 s:\n%s", l.mustShunt("map", "dump", "services"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Ready means serving: no wait for the server to listen.
		l.probe("", "connected", "--tcp", l.clusterIP("gated")+":80")

		// Unready again: out of the service.
		if err := os.Remove(readyFile); err != nil {
			t.Fatal(err)
		}
		l.waitPod("gated", "not Ready", 15*time.Second, func(p corev1.Pod) bool { return !podReady(p) })
		deadline = time.Now().Add(15 * time.Second)
		for strings.Count(l.mustShunt("map", "dump", "services"), backend) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("the unready pod is still a backend of gated after 15 s (or no longer of gated-all):\n%s", l.mustShunt("map", "dump", "services"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, c := range l.pod("gated").Status.ContainerStatuses {
			if c.RestartCount != 0 {
				t.Errorf("container %s restarted %d times; its liveness probe passes", c.Name, c.RestartCount)
			}
		}
	})
}

func TestLivenessProbeRestartsContainer(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		sick := filepath.Join(t.TempDir(), "sick")
		manifest := writeManifest(t, "live.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: live}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    command: [sleep, infinity]
    livenessProbe: {exec: {command: [sh, -c, "! test -f %s"]}, initialDelaySeconds: 2, periodSeconds: 1, failureThreshold: 2}
`, sick))
		l := startLab(manifest)
		l.waitPod("live", "Ready", 15*time.Second, podReady)
		if err := os.WriteFile(sick, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		p := l.waitPod("live", "restarted", 20*time.Second, func(p corev1.Pod) bool {
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
		})
		os.Remove(sick) // before the new instance's first probe, 2 s after its start
		c := p.Status.ContainerStatuses[0]
		last := c.LastTerminationState.Terminated
		if last == nil || last.ExitCode != 128+15 {
			t.Errorf("last state %+v, want terminated by SIGTERM (exit code 143)", c.LastTerminationState)
		}
		p = l.waitPod("live", "running again and Ready", 15*time.Second, func(p corev1.Pod) bool {
			return podReady(p) && p.Status.ContainerStatuses[0].State.Running != nil
		})
		time.Sleep(4 * time.Second) // the new instance's probes pass
		if n := l.pod("live").Status.ContainerStatuses[0].RestartCount; n != 1 {
			t.Errorf("restartCount %d, want 1", n)
		}
	})
}

// TestRestartPolicies: never's container runs 2 s before it fails, so that
// the lab's start (which stops early on a pod already failed) has seen
// every pod run first; it failed at once in one CI run, before the
// start's first look.
func TestRestartPolicies(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		manifest := writeManifest(t, "exits.yaml", `apiVersion: v1
kind: Pod
metadata: {name: never}
spec:
  restartPolicy: Never
  containers:
  - {name: c, command: [sh, -c, "sleep 2; exit 3"]}
---
apiVersion: v1
kind: Pod
metadata: {name: onfailure-ok}
spec:
  restartPolicy: OnFailure
  containers:
  - {name: c, command: ["true"]}
---
apiVersion: v1
kind: Pod
metadata: {name: always}
spec:
  containers:
  - {name: c, command: [sh, -c, "exit 1"]}
`)
		l := startLab(manifest)
		p := l.waitPod("never", "Failed", 15*time.Second, func(p corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		if c := p.Status.ContainerStatuses[0]; c.State.Terminated == nil || c.State.Terminated.ExitCode != 3 || c.RestartCount != 0 {
			t.Errorf("never: container %+v, want terminated with exit code 3, no restart", c)
		}
		p = l.waitPod("onfailure-ok", "Succeeded", 15*time.Second, func(p corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
		if c := p.Status.ContainerStatuses[0]; c.RestartCount != 0 {
			t.Errorf("onfailure-ok restarted %d times after exit code 0", c.RestartCount)
		}
		// Always: restarted at once, then after the back-off of 10 s; waiting
		// in CrashLoopBackOff in between, the pod Running and not Ready.
		p = l.waitPod("always", "restarted and in back-off", 15*time.Second, func(p corev1.Pod) bool {
			c := p.Status.ContainerStatuses[0]
			return c.RestartCount == 1 && c.State.Waiting != nil
		})
		c := p.Status.ContainerStatuses[0]
		if c.State.Waiting.Reason != "CrashLoopBackOff" || !strings.Contains(c.State.Waiting.Message, "back-off 10s") ||
			c.LastTerminationState.Terminated == nil || c.LastTerminationState.Terminated.ExitCode != 1 {
			t.Errorf("always: %+v, want waiting in CrashLoopBackOff (back-off 10s), last exit code 1", c)
		}
		if p.Status.Phase != corev1.PodRunning || podReady(p) {
			t.Errorf("always: phase %s ready %v, want Running, not ready", p.Status.Phase, podReady(p))
		}
		time.Sleep(5 * time.Second)
		if n := l.pod("always").Status.ContainerStatuses[0].RestartCount; n != 1 {
			t.Errorf("always: %d restarts 5 s into a 10 s back-off, want 1", n)
		}
		l.waitPod("always", "restarted a second time", 15*time.Second, func(p corev1.Pod) bool {
			return p.Status.ContainerStatuses[0].RestartCount == 2
		})
	})
}

// TestNodeSelectorAndAffinity: a pod whose nodeSelector no node matches
// stays Pending as Unschedulable; one whose required node affinity the
// node meets runs there.
func TestNodeSelectorAndAffinity(t *testing.T) {
	inBothSources(t, func(t *testing.T, startLab labStarter) {
		l := startLab()
		l.apply(writeManifest(t, "placed.yaml", `apiVersion: v1
kind: Pod
metadata: {name: nowhere}
spec:
  nodeSelector: {zone: nowhere}
  containers: [{name: c, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: here}
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: zone, operator: NotIn, values: [nowhere]}]
  containers: [{name: c, command: [sleep, infinity]}]
`))
		p := l.waitPod("here", "Running", 30*time.Second, func(p corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		if p.Spec.NodeName == "" {
			t.Error("the running pod names no node")
		}
		p = l.waitPod("nowhere", "Unschedulable", 30*time.Second, func(p corev1.Pod) bool {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					return true
				}
			}
			return false
		})
		if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
			t.Errorf("unschedulable pod: node %q phase %s, want none, Pending", p.Spec.NodeName, p.Status.Phase)
		}
	})
}

// TestHostNetworkPod: a hostNetwork pod runs in the node's network
// namespace, at the node's address, reachable there from another pod, and
// probed there.
func TestHostNetworkPod(t *testing.T) {
	port := 20000 + rand.IntN(10000) // the machine's own ports: avoid other tests'
	l := newLab(t, "redirect-peer", writeManifest(t, "host.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers: [{name: c, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: on-host}
spec:
  hostNetwork: true
  containers:
  - name: c
    command: [shunt, lab, serve, --tcp, "%d"]
    readinessProbe: {tcpSocket: {port: %d}, periodSeconds: 1}
`, port, port)))
	p := l.waitPod("on-host", "Ready", 30*time.Second, podReady)
	node := l.status().NodeIP
	if p.Status.PodIP != node || p.Status.HostIP != node {
		t.Errorf("hostNetwork pod: podIP %s hostIP %s, want the node's address %s", p.Status.PodIP, p.Status.HostIP, node)
	}
	l.probe("client", "connected", "--tcp", fmt.Sprintf("%s:%d", node, port))
	// It shares the node's namespace: the node reaches it on loopback.
	l.probe("", "connected", "--tcp", fmt.Sprintf("127.0.0.1:%d", port))
}
