package podexec

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A pod's process sees the pod's host name, in a UTS namespace of its own:
// the node's stays as it was.
func TestHostname(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a UTS namespace needs root (CAP_SYS_ADMIN)")
	}
	node, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/cat", "/proc/sys/kernel/hostname")
	var out strings.Builder
	cmd.Stdout = &out
	if err := Start(Target{Hostname: "web-0"}, cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != "web-0" {
		t.Errorf("the process sees host name %q, want web-0", got)
	}
	if after, _ := os.Hostname(); after != node {
		t.Errorf("the node's host name changed from %q to %q", node, after)
	}
}
