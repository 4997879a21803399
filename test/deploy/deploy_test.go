// Package deploy tests deploy/ against a real API server: the CRDs install
// and validate, the manifests are valid objects, and the agent's RBAC is
// what it needs and no more.
package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// kubectl runs kubectl with a kubeconfig and returns its output and error.
func kubectl(c *kubetest.Cluster, kubeconfig string, stdin string, args ...string) (string, error) {
	cmd := exec.Command(c.Kubectl(), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestDeployManifests(t *testing.T) {
	c := kubetest.Start(t)
	admin := func(stdin string, args ...string) string {
		t.Helper()
		out, err := kubectl(c, c.Kubeconfig, stdin, args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	c.Apply(t, "../../deploy/crds/")
	// A server-side dry run validates every object (a namespaced object's
	// namespace must exist for it).
	admin("", "create", "namespace", "shunt-system")
	admin("", "apply", "--dry-run=server", "-f", "../../deploy/shunt.yaml")
	admin("", "apply", "-f", "../../deploy/shunt.yaml")

	// The chart with values other than the defaults deploy/shunt.yaml
	// holds: every variant must be objects the API server accepts (e.g.
	// Bidirectional mounts only for a privileged container).
	t.Run("chart variants", func(t *testing.T) {
		for _, sets := range [][]string{
			{"securityContext.privileged=true", "routingMode=native", "masquerade=true", "masqueradeExclude={10.0.0.0/8}",
				"socketAcceleration=true", "image.digest=sha256:" + strings.Repeat("ab", 32), "k8sServiceHost=192.0.2.1", "k8sServicePort=6443"},
			{"routingMode=", "prometheus.enabled=false", "cni.install=false", "resources.limits.memory=512Mi"},
		} {
			args := []string{"run", ".", "template"}
			for _, s := range sets {
				args = append(args, "-set", s)
			}
			cmd := exec.Command("go", append(args, "../../deploy/helm/shunt")...)
			cmd.Dir = "../../tools/helm"
			cmd.Env = append(os.Environ(), "GOWORK=off")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("tools/helm template %v: %v", sets, err)
			}
			if out, err := kubectl(c, c.Kubeconfig, string(out), "apply", "--dry-run=server", "-f", "-"); err != nil {
				t.Errorf("the chart with %v: the API server refuses it: %v\n%s", sets, err, out)
			}
		}
	})

	t.Run("ShuntNetworkPolicy validation", func(t *testing.T) {
		admin("", "apply", "-f", "../e2e/testdata/shunt-policy.yaml")
		out := admin("", "get", "snp", "-o", "name")
		if !strings.Contains(out, "web-shunt") {
			t.Errorf("kubectl get snp: %q", out)
		}
		for _, bad := range []struct{ doc, field string }{
			{`{"apiVersion":"shunt.io/v1alpha1","kind":"ShuntNetworkPolicy","metadata":{"name":"b1"},"spec":{"podSelector":{},"ingress":[{"action":"maybe"}]}}`, "spec.ingress[0].action"},
			{`{"apiVersion":"shunt.io/v1alpha1","kind":"ShuntNetworkPolicy","metadata":{"name":"b2"},"spec":{"podSelector":{},"egress":[{"peers":[{"entity":"moon"}]}]}}`, "spec.egress[0].peers[0].entity"},
			{`{"apiVersion":"shunt.io/v1alpha1","kind":"ShuntNetworkPolicy","metadata":{"name":"b3"},"spec":{"ingress":[]}}`, "spec.podSelector"},
		} {
			out, err := kubectl(c, c.Kubeconfig, bad.doc, "apply", "-f", "-")
			if err == nil || !strings.Contains(out, bad.field) {
				t.Errorf("invalid policy accepted or refused without naming %s: %v\n%s", bad.field, err, out)
			}
		}
	})

	t.Run("ShuntIdentity never changes meaning", func(t *testing.T) {
		admin(`{"apiVersion":"shunt.io/v1alpha1","kind":"ShuntIdentity","metadata":{"name":"4242"},"spec":{"namespace":"default","labels":{"app":"a"}}}`, "apply", "-f", "-")
		out, err := kubectl(c, c.Kubeconfig, `{"apiVersion":"shunt.io/v1alpha1","kind":"ShuntIdentity","metadata":{"name":"4242"},"spec":{"namespace":"default","labels":{"app":"b"}}}`, "apply", "-f", "-")
		if err == nil || !strings.Contains(out, "never changes") {
			t.Errorf("an identity's spec was changed: %v\n%s", err, out)
		}
	})

	t.Run("the agent's RBAC", func(t *testing.T) {
		kc := filepath.Join(t.TempDir(), "agent.kubeconfig")
		if err := kubecluster.IssueKubeconfig(c.Dir, kc, "system:serviceaccount:shunt-system:shunt", "system:serviceaccounts", "system:authenticated"); err != nil {
			t.Fatal(err)
		}
		for _, want := range []struct {
			verb, resource string
			allowed        bool
		}{
			{"watch", "pods", true}, {"list", "services", true}, {"watch", "endpointslices.discovery.k8s.io", true},
			{"watch", "namespaces", true}, {"get", "nodes", true}, {"watch", "networkpolicies.networking.k8s.io", true},
			{"watch", "shuntnetworkpolicies.shunt.io", true}, {"watch", "httproutes.gateway.networking.k8s.io", true},
			{"create", "shuntidentities.shunt.io", true}, {"delete", "shuntidentities.shunt.io", true}, {"create", "events", true},
			{"get", "secrets", false}, {"create", "pods", false}, {"update", "networkpolicies.networking.k8s.io", false},
			{"delete", "nodes", false}, {"patch", "shuntnetworkpolicies.shunt.io/status", true},
			{"patch", "shuntnetworkpolicies.shunt.io", false}, {"update", "httproutes.gateway.networking.k8s.io/status", true},
			{"update", "httproutes.gateway.networking.k8s.io", false},
			// A node's heartbeat is its kubelet's (the DaemonSet's agent
			// runs beside one, without --run-pods): an agent that could
			// write it could keep any node alive, or kill it.
			{"update", "leases.coordination.k8s.io", false}, {"create", "leases.coordination.k8s.io", false},
			{"patch", "nodes/status", false}, {"update", "nodes/status", false},
			// Its DaemonSet gone means helm uninstall (shuntd
			// --uninstall-when-removed); reading it is all it may do.
			{"watch", "daemonsets.apps", true}, {"update", "daemonsets.apps", false}, {"delete", "daemonsets.apps", false},
		} {
			args := []string{"auth", "can-i", want.verb, want.resource, "--all-namespaces"}
			if res, sub, ok := strings.Cut(want.resource, "/"); ok {
				args = []string{"auth", "can-i", want.verb, res, "--subresource", sub, "--all-namespaces"}
			}
			out, _ := kubectl(c, kc, "", args...)
			if got := strings.TrimSpace(out) == "yes"; got != want.allowed {
				t.Errorf("agent can %s %s: %q, want allowed=%v", want.verb, want.resource, strings.TrimSpace(out), want.allowed)
			}
		}
	})
}
