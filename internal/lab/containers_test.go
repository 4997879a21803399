package lab

import (
	"log/slog"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestShimZombieIsAnEndedContainer: a shim that died without recording an
// exit status and was not reaped yet (after an agent restart its parent is
// init, which on some machines reaps every few seconds) is a container
// that ended, not one that runs: signal 0 still reaches a zombie.
func TestShimZombieIsAnEndedContainer(t *testing.T) {
	shim := exec.Command("true")
	if err := shim.Start(); err != nil {
		t.Fatal(err)
	}
	defer shim.Wait()
	rec := &ContainerRecord{Name: "c", ShimPID: shim.Process.Pid, ExitFile: filepath.Join(t.TempDir(), "c.exit")}

	// Not waited for: it stays a zombie, a child of this process.
	deadline := time.Now().Add(5 * time.Second)
	for !containerEnded(rec) {
		if time.Now().After(deadline) {
			t.Fatalf("shim PID %d exited without an exit file and is still taken for a running container", rec.ShimPID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	es, reason, ended := exitOf(rec)
	if !ended || es == nil || es.ExitCode != 137 || reason != "Unknown" {
		t.Fatalf("exitOf(zombie shim) = %+v, %q, %v; want exit code 137, reason Unknown, ended", es, reason, ended)
	}
	// A sandbox waiting for its containers to stop may go.
	k := &kubelet{cfg: Config{Log: slog.New(slog.DiscardHandler)}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}}
	if !k.stopGracefully(pod, &PodRecord{Namespace: "default", Name: "p", Containers: []ContainerRecord{*rec}}) {
		t.Fatal("a pod whose only shim is a zombie is taken for one with a container still running")
	}
}
