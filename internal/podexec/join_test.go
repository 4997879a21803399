package podexec

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/cgroup"
)

// TestJoinRunsAsTheContainer: a process started through Join of a running
// container has that container's capabilities, user, groups, mount
// namespace (with its hidden directory) and cgroup, not its caller's.
func TestJoinRunsAsTheContainer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts processes with other users and capabilities")
	}
	root, err := cgroup.Root()
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(root, fmt.Sprintf("podexec-join-%d", os.Getpid()))
	if err := cgroup.Create(cg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cgroup.Remove(cg) })
	hidden := t.TempDir()
	// The container's user must reach it to list it.
	for _, d := range []string{filepath.Dir(hidden), hidden} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(hidden, "secret"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	uid, gid := uint32(1000), uint32(1000)
	container := exec.Command("sleep", "30")
	container.Env = []string{"PATH=/usr/bin:/bin", "CONTAINER_VAR=yes"}
	sec := &Security{Add: []string{"NET_ADMIN"}, UID: &uid, GID: &gid}
	if err := Start(Target{CgroupPath: cg, Security: sec, Hide: []string{hidden}}, container); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { container.Process.Kill(); container.Wait() })

	j, err := Join(container.Process.Pid, root)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := sec.kept()
	if j.Target.CgroupPath != cg || *j.Target.Security.Kept != want || *j.Target.Security.UID != uid || *j.Target.Security.GID != gid {
		t.Errorf("joined %+v (security %+v), want cgroup %s, capabilities %x, uid and gid 1000", j.Target, *j.Target.Security, cg, want)
	}
	cmd, err := j.Command([]string{"sh", "-c", "echo $CONTAINER_VAR; id -u; id -g; grep -E '^Cap(Bnd|Eff)' /proc/self/status; cat /proc/self/cgroup; ls -A " + hidden})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := Start(j.Target, cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	for _, line := range []string{"yes", "1000", fmt.Sprintf("CapBnd:\t%016x", want), "CapEff:\t0000000000000000", "0::/" + filepath.Base(cg)} {
		if !strings.Contains(out.String(), line+"\n") {
			t.Errorf("want the line %q in the exec's output:\n%s", line, out.String())
		}
	}
	if strings.Contains(out.String(), "secret") {
		t.Errorf("the exec sees what the container's mount namespace hides:\n%s", out.String())
	}
}
