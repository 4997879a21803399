package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// TestDevClusterUpRecipe follows the README: eval "$(shunt dev cluster up)"
// leaves a shell whose kubectl (the one built with the server) reaches the
// cluster, whose shunt CRDs are established, so `lab up --kubeconfig` can
// start at once; `dev cluster env` prints the same line again.
func TestDevClusterUpRecipe(t *testing.T) {
	bin := kubetest.Binaries(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	t.Cleanup(func() { kubecluster.Down(dir) })
	run := func(args ...string) (string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		root := newRootCmd()
		root.SetArgs(args)
		root.SetOut(&stdout)
		root.SetErr(&stderr)
		if err := root.Execute(); err != nil {
			t.Fatalf("shunt %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	up, _ := run("dev", "cluster", "up", "--dir", dir, "--kube-bin", bin)
	want := "export KUBECONFIG=" + filepath.Join(dir, "kubeconfig") + " PATH=" + bin + ":$PATH\n"
	if up != want {
		t.Fatalf("dev cluster up printed on stdout %q, want only %q (for eval)", up, want)
	}
	if env, _ := run("dev", "cluster", "env", "--dir", dir); env != up {
		t.Errorf("dev cluster env printed %q, up printed %q", env, up)
	}

	// The shell the README's recipe leaves: no KUBECONFIG, a PATH without
	// kubectl, then eval of what up printed.
	script := `eval "$1" && command -v kubectl && kubectl get crd -o 'jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Established")].status}{"\n"}{end}'`
	cmd := exec.Command("/bin/sh", "-c", script, "sh", up)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("eval and kubectl get crd: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if lines[0] != filepath.Join(bin, "kubectl") {
		t.Errorf("kubectl after eval is %q, want the cluster's %s", lines[0], filepath.Join(bin, "kubectl"))
	}
	got := strings.Join(lines[1:], "\n")
	for _, crd := range []string{"shuntidentities.shunt.io", "shuntnetworkpolicies.shunt.io", "httproutes.gateway.networking.k8s.io"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(crd) + `=True$`).MatchString(got) {
			t.Errorf("CRD %s is not established after dev cluster up; CRDs:\n%s", crd, got)
		}
	}
}
