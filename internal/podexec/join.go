package podexec

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Joined is a running container as an exec enters it (kubectl exec,
// `shunt lab exec`): read from its process, so that what runs there gets
// exactly what the container's own process has, whatever the
// securityContext said and however the process was started.
type Joined struct {
	PID    int
	Target Target   // its network and mount namespaces, cgroup, user, capabilities
	Env    []string // its environment, as a runtime gives an exec the container's
	// Root is /proc/PID/root when the container runs chrooted in an
	// image's file system (Target.Rootfs): an exec runs there too.
	Root string
}

// Join reads the running process pid: its namespaces, cgroup (below the
// cgroup v2 mount cgroupRoot), user and groups, and bounding capability
// set. Privileges are taken from the bounding set, not the effective one:
// an exec of a root container then gets the container's set, and one of a
// non-root container none, as the container's own process does (a process
// changing from root to another user loses its capabilities).
func Join(pid int, cgroupRoot string) (Joined, error) {
	proc := fmt.Sprintf("/proc/%d", pid)
	status, err := readStatus(proc)
	if err != nil {
		return Joined{}, err
	}
	cg, err := os.ReadFile(proc + "/cgroup")
	if err != nil {
		return Joined{}, fmt.Errorf("reading the container's cgroup: %w", err)
	}
	cgPath := ""
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			cgPath = filepath.Join(cgroupRoot, rel)
		}
	}
	if cgPath == "" {
		return Joined{}, fmt.Errorf("process %d is in no cgroup v2 (%s/cgroup: %q)", pid, proc, cg)
	}
	environ, err := readEnviron(proc)
	if err != nil {
		return Joined{}, err
	}
	var env []string
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if len(kv) > 0 {
			env = append(env, string(kv))
		}
	}
	uid, err := statusField(status, "Uid", 0)
	if err != nil {
		return Joined{}, err
	}
	gid, err := statusField(status, "Gid", 0)
	if err != nil {
		return Joined{}, err
	}
	bnd, err := statusCaps(status, "CapBnd")
	if err != nil {
		return Joined{}, err
	}
	var groups []uint32
	for _, g := range strings.Fields(status["Groups"]) {
		n, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return Joined{}, fmt.Errorf("process %d: groups %q: %w", pid, status["Groups"], err)
		}
		groups = append(groups, uint32(n))
	}
	u, g := uint32(uid), uint32(gid)
	root := ""
	if r, err := os.Readlink(proc + "/root"); err == nil && r != "/" {
		root = proc + "/root"
	}
	return Joined{
		Root: root,
		PID:  pid,
		Target: Target{
			Chroot:      root,
			NetnsPath:   proc + "/ns/net",
			MountNsPath: proc + "/ns/mnt",
			UTSNsPath:   proc + "/ns/uts",
			CgroupPath:  cgPath,
			Security:    &Security{Kept: &bnd, UID: &u, GID: &g, Groups: groups},
		},
		Env: env,
	}, nil
}

// Command is argv to run in the container: found on the container's PATH
// (a relative name), with the container's environment, from its root.
func (j Joined) Command(argv []string) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command to run")
	}
	path := argv[0]
	if j.Root != "" {
		// The image's program: found in its file system, run chrooted
		// there (after the child joins the container's mount namespace).
		var err error
		if path, err = LookPathIn(j.Root, path, j.env("PATH")); err != nil {
			return nil, err
		}
		// Target.Chroot moves the starting thread there.
		return &exec.Cmd{Path: path, Args: argv, Env: j.Env, Dir: "/"}, nil
	}
	if !strings.Contains(path, "/") {
		var err error
		if path, err = lookPath(fmt.Sprintf("/proc/%d/root", j.PID), path, j.env("PATH")); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = j.Env
	cmd.Dir = "/"
	return cmd, nil
}

func (j Joined) env(name string) string {
	for _, kv := range j.Env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds an executable on the container's PATH, in its mount
// namespace as the process root shows it (root: /proc/PID/root): the
// node's file system less the node's shunt directories, plus what the
// container has bind-mounted (an image's programs at their paths, as
// Istio's echo image has its client in /usr/local/bin). The path returned
// is the container's.
func lookPath(root, name, pathEnv string) (string, error) {
	if pathEnv == "" {
		pathEnv = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		p := filepath.Join(dir, name)
		if isExecutable(filepath.Join(root, p)) {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in the container's PATH (%s)", name, pathEnv)
}

// environWait is how long readEnviron waits for an exec in progress.
const environWait = 100 * time.Millisecond

// readEnviron reads a process's environment. It is empty for a moment
// after the process's exec passed its point of no return (when the
// parent's exec.Cmd.Start returns) and before the kernel has set up the
// new program's stack (create_elf_tables sets env_start and env_end): an
// exec joining a container that has just started would get no environment.
// So an empty one is read again for up to environWait; a process whose
// environment really is empty costs its exec that wait.
func readEnviron(proc string) ([]byte, error) {
	deadline := time.Now().Add(environWait)
	for {
		environ, err := os.ReadFile(proc + "/environ")
		if err != nil {
			return nil, fmt.Errorf("reading the container's environment: %w", err)
		}
		if len(environ) > 0 || time.Now().After(deadline) {
			return environ, nil
		}
		time.Sleep(time.Millisecond)
	}
}

func readStatus(proc string) (map[string]string, error) {
	data, err := os.ReadFile(proc + "/status")
	if err != nil {
		return nil, fmt.Errorf("reading the container's process: %w", err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields, nil
}

// statusField is the i-th number of a status line ("Uid: real eff saved fs").
func statusField(status map[string]string, name string, i int) (uint64, error) {
	f := strings.Fields(status[name])
	if len(f) <= i {
		return 0, fmt.Errorf("process status has no %s line", name)
	}
	return strconv.ParseUint(f[i], 10, 32)
}

func statusCaps(status map[string]string, name string) (uint64, error) {
	v, err := strconv.ParseUint(status[name], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("process status: %s %q: %w", name, status[name], err)
	}
	return v, nil
}
