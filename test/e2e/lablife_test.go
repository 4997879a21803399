package e2e

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLabLifecycle: a refused `lab up --nodes 2` leaves nothing; a
// process started on the external host does not outlive `lab down`; a
// second `lab down` says there was nothing to remove.
func TestLabLifecycle(t *testing.T) {
	requireRoot(t)
	l := &lab{t: t, instance: fmt.Sprintf("e2l%05d", rand.IntN(100000))}
	t.Cleanup(func() {
		l.shunt("lab", "down")
		l.assertGone()
		l.node(2).assertGone()
	})
	if out, code := l.shunt("lab", "up", "--nodes", "2", "--masquerade-ports", "bad"); code == 0 || !strings.Contains(out, "masquerade-ports") {
		t.Errorf("lab up with a bad --masquerade-ports: exit %d:\n%s", code, out)
	}
	l.assertGone()
	l.node(2).assertGone()

	l.mustShunt("lab", "up", "--nodes", "2")
	ext := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", "--external", "--", "sleep", "300")
	if err := ext.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ext.Wait() }()
	time.Sleep(500 * time.Millisecond)
	if out := l.mustShunt("lab", "down"); !strings.Contains(out, "removed") {
		t.Errorf("lab down: %s", out)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		syscall.Kill(ext.Process.Pid, syscall.SIGKILL)
		t.Errorf("lab exec --external's command outlived lab down")
	}
	l.assertGone()
	l.node(2).assertGone()
	if out := l.mustShunt("lab", "down"); !strings.Contains(out, "nothing to remove") {
		t.Errorf("second lab down: %q, want it to say there was nothing to remove", out)
	}
}
