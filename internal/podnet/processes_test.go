package podnet

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestStopProcesses: a process in a noted namespace is ended after the
// namespace's name is gone; one in another namespace is left alone.
func TestStopProcesses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	start := func(name string) *exec.Cmd {
		t.Helper()
		if err := CreateNetns(name, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { DeleteNetns(name) })
		cmd := exec.Command("nsenter", "--net="+NetnsPath(name), "sleep", "100")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	target := fmt.Sprintf("shunt-test-stop-%d", os.Getpid())
	victim := start(target)
	bystander := start(target + "b")
	exited := make(chan error, 1)
	go func() { exited <- victim.Wait() }()

	stop := StopProcesses([]string{NetnsPath(target), NetnsPath("shunt-test-absent")})
	if err := DeleteNetns(target); err != nil { // as an agent's teardown does first
		t.Fatal(err)
	}
	stop()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the process in the noted namespace still runs")
	}
	if err := bystander.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the process in another namespace was ended too: %v", err)
	}
}
