package kubecluster_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// The Go side and scripts/kube-build.sh must agree on the version and the
// cache directory, or tests look for binaries the script never builds.
func TestVersionAndBinDirMatchBuildScript(t *testing.T) {
	mod, err := os.ReadFile("../../tools/kube/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	// A direct requirement (tools/kube/e2e imports it) or an indirect one.
	if pin := "\tk8s.io/kubernetes " + kubecluster.KubeVersion; !strings.Contains(string(mod), pin+"\n") && !strings.Contains(string(mod), pin+" ") {
		t.Errorf("tools/kube/go.mod does not pin k8s.io/kubernetes %s (KubeVersion): change both together", kubecluster.KubeVersion)
	}
	// --check prints the directory and exits 1 when nothing is built yet.
	out, _ := exec.Command("../../scripts/kube-build.sh", "--check").Output()
	if got := strings.TrimSpace(string(out)); got != kubecluster.DefaultBinDir() {
		t.Errorf("scripts/kube-build.sh builds into %q, DefaultBinDir is %q", got, kubecluster.DefaultBinDir())
	}
}

func TestDownIsIdempotentAndLeavesOtherDirectoriesAlone(t *testing.T) {
	gone := filepath.Join(t.TempDir(), "never-created")
	if err := kubecluster.Down(gone); err != nil {
		t.Errorf("Down of a missing directory: %v", err)
	}
	other := t.TempDir()
	if err := kubecluster.Down(other); err == nil || !strings.Contains(err.Error(), "not a cluster directory") {
		t.Errorf("Down of a directory without cluster.json: got %v, want a refusal", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("Down removed a directory that was not a cluster's: %v", err)
	}
}

// A recorded PID whose start time differs is another process now: Down must
// not signal it.
func TestDownNeverSignalsAReusedPID(t *testing.T) {
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	dir := t.TempDir()
	state := `{"components":[{"name":"etcd","pid":` + itoa(sleeper.Process.Pid) + `,"startTime":"1"}]}`
	if err := os.WriteFile(filepath.Join(dir, "cluster.json"), []byte(state), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := kubecluster.Down(dir); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if !running(sleeper.Process.Pid) {
		t.Fatalf("Down signalled pid %d, an unrelated process that only has the recorded PID", sleeper.Process.Pid)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Down left %s: %v", dir, err)
	}
}

// What `shunt dev cluster up` and `down` do: processes that outlive the
// caller, found again and stopped by the PIDs in cluster.json.
func TestDetachedUpThenDown(t *testing.T) {
	bin := kubetest.Binaries(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	t.Cleanup(func() { kubecluster.Down(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := kubecluster.Up(ctx, kubecluster.Options{Dir: dir, BinDir: bin, Detach: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubecluster.Up(ctx, kubecluster.Options{Dir: dir, BinDir: bin}); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("a second Up in the same directory: got %v, want already running", err)
	}
	st, err := kubecluster.ReadStatus(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Running() || st.Server != c.Server || len(st.Components) != 3 {
		t.Fatalf("status after up: %+v", st)
	}
	out, err := exec.CommandContext(ctx, c.Kubectl(), "--kubeconfig", c.Kubeconfig, "get", "--raw", "/readyz").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("kubectl get --raw /readyz: %v: %s", err, out)
	}
	if err := kubecluster.Down(dir); err != nil {
		t.Fatalf("Down: %v", err)
	}
	for _, comp := range st.Components {
		if running(comp.PID) {
			t.Errorf("%s (pid %d) still runs after Down", comp.Name, comp.PID)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Down left %s", dir)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// running says whether pid exists and is not a zombie.
func running(pid int) bool {
	stat, err := os.ReadFile("/proc/" + itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(stat), ") Z ")
}
