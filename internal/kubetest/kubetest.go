// Package kubetest gives a test its own real Kubernetes control plane
// (internal/kubecluster) in t.TempDir(), stopped when the test ends, pass or
// fail. Tests need no root for it.
//
// The Kubernetes binaries are built once per version by scripts/kube-build.sh
// (`make test` runs it first, through `make kube`). When they are missing,
// Start builds them if the test's deadline leaves room for a cold build;
// otherwise it fails the test under CI (CI=true) and skips it elsewhere, each
// time saying how to build them.
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/shuntnet/shunt/internal/kubecluster"
)

// Cluster is a running control plane with an admin clientset.
type Cluster struct {
	*kubecluster.Cluster
	Client kubernetes.Interface
}

// Start runs a private control plane for t and registers its stop.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartWith(t, kubecluster.Options{})
}

// StartWith is Start with options (CIDRs); Dir, BinDir and Logf are the
// test's.
func StartWith(t testing.TB, o kubecluster.Options) *Cluster {
	t.Helper()
	bin := Binaries(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o.Dir, o.BinDir, o.Logf = dir, bin, t.Logf
	kc, err := kubecluster.Up(ctx, o)
	if err != nil {
		t.Fatalf("starting the Kubernetes control plane: %v", err)
	}
	c := &Cluster{Cluster: kc}
	// Registered after t.TempDir, so it runs before the directory goes and
	// the logs can still be shown.
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"kube-apiserver", "kube-controller-manager"} {
				log := filepath.Join(dir, "logs", name+".log")
				t.Logf("end of %s:\n%s", log, kubecluster.LogTail(log, 15))
			}
		}
		if err := kc.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	cs, err := kc.Clientset()
	if err != nil {
		t.Fatalf("client for %s: %v", kc.Server, err)
	}
	c.Client = cs
	return c
}

var buildMu sync.Mutex

// coldBuild is how much test time a cold build of the binaries may take.
const coldBuild = 40 * time.Minute

// Binaries returns the directory of the Kubernetes binaries, building them
// when the test's deadline allows, and checks that etcd is installed.
func Binaries(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		unavailable(t, "etcd is not installed: run scripts/setup.sh (it installs Debian's etcd-server)")
	}
	dir := kubecluster.DefaultBinDir()
	buildMu.Lock()
	defer buildMu.Unlock()
	if kubecluster.CheckBinaries(dir) == nil {
		return dir
	}
	missing := kubecluster.CheckBinaries(dir)
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := d.Deadline(); ok && time.Until(deadline) < coldBuild {
			unavailable(t, fmt.Sprintf("%v (not building here: the test deadline is in %v, a cold build needs up to %v)", missing, time.Until(deadline).Round(time.Second), coldBuild))
		}
	}
	script, err := buildScript()
	if err != nil {
		unavailable(t, fmt.Sprintf("%v; and %v", missing, err))
	}
	t.Logf("building the Kubernetes %s binaries with %s (15-20 minutes, once)", kubecluster.KubeVersion, script)
	cmd := exec.Command(script)
	cmd.Stderr = os.Stderr
	if out, err := cmd.Output(); err != nil {
		unavailable(t, fmt.Sprintf("%s failed (%v): %s", script, err, out))
	}
	if err := kubecluster.CheckBinaries(dir); err != nil {
		unavailable(t, fmt.Sprintf("%s ran, yet %v", script, err))
	}
	return dir
}

// unavailable ends a test that cannot get a control plane: a failure under
// CI, where the build is part of `make test`, a skip elsewhere.
func unavailable(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("no Kubernetes control plane: %s", reason)
	}
	t.Skipf("no Kubernetes control plane (set CI=true to fail instead): %s", reason)
}

// buildScript finds scripts/kube-build.sh above the working directory (go
// test runs in the package's directory).
func buildScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "scripts", "kube-build.sh")
		if _, err := os.Stat(filepath.Join(dir, "tools", "kube", "go.mod")); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("scripts/kube-build.sh not found above the working directory")
		}
		dir = parent
	}
}

// Apply runs `kubectl apply -f` on each path (files or directories,
// relative to the test's package) as the admin, and waits until every CRD
// among them is served, as an operator installs shunt's CRDs.
func (c *Cluster) Apply(t testing.TB, paths ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Cluster.Apply(ctx, nil, paths...); err != nil {
		t.Fatal(err)
	}
}

// Program returns the path of an extra program scripts/kube-build.sh
// builds into the Kubernetes binaries' directory (coredns, agnhost, ...),
// building it when missing (make kube builds them before make test).
func Program(t testing.TB, name string) string {
	t.Helper()
	dir := Binaries(t)
	p := filepath.Join(dir, name)
	script, err := buildScript()
	if err != nil {
		unavailable(t, fmt.Sprintf("%s: %v", name, err))
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	// The script returns at once when the program is built (and current).
	cmd := exec.Command(script, name)
	cmd.Stderr = os.Stderr
	if out, err := cmd.Output(); err != nil {
		unavailable(t, fmt.Sprintf("%s %s failed (%v): %s", script, name, err, out))
	}
	return p
}
