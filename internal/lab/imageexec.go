package lab

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/shuntnet/shunt/internal/podexec"
)

// imageExecTarget is where an exec (a probe's) runs in a container of an
// image (rootfs.go): the mount namespace of its process, chrooted in its
// root, finding the command on the image's PATH there. The process is the
// shim's child, looked up at each exec: a restarted container is another.
func imageExecTarget(t podexec.Target, shimPID int, command string, env []string) (podexec.Target, string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", shimPID, shimPID))
	if err != nil {
		return t, "", fmt.Errorf("the container's shim %d: %w", shimPID, err)
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return t, "", fmt.Errorf("the container of shim %d has no process", shimPID)
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return t, "", err
	}
	proc := fmt.Sprintf("/proc/%d", pid)
	t.MountNsPath, t.Chroot, t.Hide = proc+"/ns/mnt", proc+"/root", nil
	path := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v // the last one: the image's (kubelet.startContainer)
		}
	}
	p, err := podexec.LookPathIn(t.Chroot, command, path)
	return t, p, err
}
