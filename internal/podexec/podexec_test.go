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

// A container of another user with every capability dropped (the e2e
// suites' restricted pod security: runAsUser, drop ALL) starts as that
// user with no capabilities: the change of user needs CAP_SETUID and
// CAP_SETGID, which the exec does not pass on. Root with a group of its
// own and drop ALL keeps none either.
func TestRestrictedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing users needs root")
	}
	uid, gid := uint32(1000), uint32(1000)
	for _, tc := range []struct {
		name string
		sec  Security
		want string
	}{
		{"user 1000, drop ALL", Security{UID: &uid, GID: &gid, Drop: []string{"ALL"}}, "1000 1000 0000000000000000 0000000000000000"},
		{"root, group 1000, drop ALL", Security{GID: &gid, Drop: []string{"ALL"}}, "0 1000 0000000000000000 0000000000000000"},
		{"user 1000, default capabilities", Security{UID: &uid}, "1000 0 0000000000000000 0000000000000000"},
	} {
		cmd := exec.Command("/bin/sh", "-c", `echo $(id -u) $(id -g) $(grep ^CapEff /proc/self/status | cut -f2) $(grep ^CapPrm /proc/self/status | cut -f2)`)
		var out strings.Builder
		cmd.Stdout = &out
		sec := tc.sec
		if err := Start(Target{Security: &sec}, cmd); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if got := strings.TrimSpace(out.String()); got != tc.want {
			t.Errorf("%s: uid, gid, effective and permitted capabilities %q, want %q", tc.name, got, tc.want)
		}
	}
}
