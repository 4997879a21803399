package procstat

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestRunningSeesZombiesAsExited: a process that exited and was not reaped
// yet (a zombie, which signal 0 still reaches) is not running.
func TestRunningSeesZombiesAsExited(t *testing.T) {
	if !Running(os.Getpid()) {
		t.Fatal("this process is not running")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	// Not waited for: it stays a zombie, a child of this process.
	deadline := time.Now().Add(5 * time.Second)
	for Running(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("PID %d, exited and not reaped, still taken for running", cmd.Process.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Wait()
	if Running(cmd.Process.Pid) {
		t.Fatalf("PID %d, reaped, taken for running", cmd.Process.Pid)
	}
}
