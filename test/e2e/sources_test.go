package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/kubetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// The suite's main tests run twice: against the lab's own control plane
// (objects through `shunt apply`), and against a real Kubernetes API server
// and controller-manager (objects through kubectl, the lab playing only the
// node's kubelet and scheduler, EndpointSlices from the real controller).

// labStarter starts a lab with the given manifests in one of the modes.
type labStarter func(manifests ...string) *lab

// inBothSources runs body as subtest "lab" and subtest "kubernetes".
func inBothSources(t *testing.T, body func(t *testing.T, startLab labStarter)) {
	t.Run("lab", func(t *testing.T) {
		body(t, func(manifests ...string) *lab { return newLab(t, "redirect-peer", manifests...) })
	})
	t.Run("kubernetes", func(t *testing.T) {
		body(t, func(manifests ...string) *lab { return newKubeLab(t, manifests...) })
	})
}

// newKubeLab starts a control plane with shunt's CRDs, a Node, and the
// node's agent (`lab up --kubeconfig`, which runs the API's pods); the
// manifests are applied with kubectl and their pods awaited.
func newKubeLab(t *testing.T, manifests ...string) *lab {
	t.Helper()
	return newKubeLabOn(t, newKubeCluster(t), manifests...)
}

// newKubeLabOn adds a node to the cluster and starts its agent.
func newKubeLabOn(t *testing.T, c *kubetest.Cluster, manifests ...string) *lab {
	t.Helper()
	l := &lab{t: t, instance: fmt.Sprintf("e2e%06d", rand.IntN(1000000)), serviceCIDR: c.ServiceCIDR, kube: c}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: l.instance}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", readFile("/var/lib/shunt/"+l.instance+"/shuntd.log"))
		}
		l.shunt("lab", "down")
		l.assertGone()
	})
	l.mustShunt("lab", "up", "--kubeconfig", c.Kubeconfig, "--node-name", l.instance, "--service-cidr", c.ServiceCIDR, "--mode", "redirect-peer")
	l.cidr = l.status().PodCIDR
	if len(manifests) > 0 {
		l.apply(manifests...)
		l.waitPodsStarted()
	}
	return l
}

// kubectl runs kubectl as the cluster's admin; stdin may be nil.
func (l *lab) kubectl(stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.Command(l.kube.Kubectl(), append([]string{"--kubeconfig", l.kube.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// apply creates or updates objects and returns once this node's datapath
// reflects them: `shunt apply` in the lab; in Kubernetes mode `kubectl
// apply`, then `shunt wait` on the objects the API server returned.
func (l *lab) apply(files ...string) {
	l.t.Helper()
	if l.kube == nil {
		l.mustShunt(withFiles("apply", files)...)
		return
	}
	for _, f := range files {
		manifest := kubeManifest(l.t, f)
		var out []byte
		// A new namespace's default service account (which admission
		// wants for its pods) comes from the controller-manager a moment
		// after the namespace.
		err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			var err error
			out, err = l.kubectl(manifest, "apply", "-f", "-", "-o", "json")
			if err != nil && strings.Contains(err.Error(), "serviceaccount") {
				return false, nil
			}
			return err == nil, err
		})
		if err != nil {
			l.t.Fatalf("applying %s: %v", f, err)
		}
		l.waitReflected(out)
	}
}

// delete removes the objects the files name: `shunt delete` in the lab;
// in Kubernetes mode `kubectl delete` and `shunt wait --deleted`.
func (l *lab) delete(files ...string) {
	l.t.Helper()
	if l.kube == nil {
		l.mustShunt(withFiles("delete", files)...)
		return
	}
	for _, f := range files {
		manifest := kubeManifest(l.t, f)
		if _, err := l.kubectl(manifest, "delete", "-f", "-"); err != nil {
			l.t.Fatal(err)
		}
		l.waitReflected(manifest, "--deleted")
	}
}

// withFiles is a command with "-f FILE" for each file.
func withFiles(command string, files []string) []string {
	args := []string{command}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	return args
}

func (l *lab) waitReflected(objects []byte, flags ...string) {
	l.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "shunt"), append([]string{"--instance", l.instance, "wait", "-f", "-"}, flags...)...)
	cmd.Stdin = bytes.NewReader(objects)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("shunt wait %v: %v\n%s", flags, err, out)
	}
}

// waitPodsStarted waits until every pod of the cluster has left Pending
// (the lab's kubelet ran it), as `shunt lab up -f` does in the lab.
func (l *lab) waitPodsStarted() {
	l.t.Helper()
	var pending []string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := l.kube.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		pending = pending[:0]
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodPending || p.Status.Phase == "" {
				pending = append(pending, p.Namespace+"/"+p.Name)
			}
		}
		return len(pending) == 0, nil
	})
	if err != nil {
		l.t.Fatalf("pods not started: %v: %v", pending, err)
	}
}

// kubeManifest reads a lab manifest and gives it what the API server
// requires and the lab does not: an image for every container (the lab's
// kubelet runs commands, not images).
func kubeManifest(t *testing.T, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, doc := range strings.Split(string(data), "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if obj == nil {
			continue
		}
		if obj["kind"] == "Pod" {
			spec, _ := obj["spec"].(map[string]any)
			containers, _ := spec["containers"].([]any)
			for _, c := range containers {
				if c, ok := c.(map[string]any); ok && c["image"] == nil {
					c["image"] = "lab"
				}
			}
		}
		j, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(j))
	}
	return []byte(strings.Join(out, "---\n"))
}
