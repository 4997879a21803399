package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/podexec"
)

// ExitStatus is what a shim writes when its container ends.
type ExitStatus struct {
	ExitCode   int       `json:"exitCode"`
	Signal     string    `json:"signal,omitempty"`
	FinishedAt time.Time `json:"finishedAt"`
	Error      string    `json:"error,omitempty"`
}

// RunShim is the body of `shuntd shim`: it starts one container process in
// the pod's network namespace (the shim itself already runs in the pod's
// cgroup) with the privileges of its securityContext (a runtime's default
// capabilities unless it asks for others), forwards termination signals,
// waits and records the exit status.
// It outlives agent restarts, so no exit status is ever lost.
func RunShim(netnsPath, exitFile, hostname string, sec podexec.Security, binds []podexec.Bind, argv []string) int {
	return RunShimIn(netnsPath, exitFile, hostname, sec, ContainerFS{Binds: binds}, argv)
}

// ContainerFS is the file system of a container that runs from an image
// (rootfs.go): its unpacked root and its volumes; or, Rootfs empty, the
// node's with Binds.
type ContainerFS struct {
	Rootfs string
	Mounts []podexec.Mount
	// Binds are bind mounts into the node's file system a container
	// without an image of its own sees (podfiles.go: resolv.conf, hosts,
	// its volumes).
	Binds []podexec.Bind
}

// RunShimIn is RunShim for a container with a file system of its own.
func RunShimIn(netnsPath, exitFile, hostname string, sec podexec.Security, fs ContainerFS, argv []string) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	status := ExitStatus{}
	target := podexec.Target{NetnsPath: netnsPath, Security: &sec, Hostname: hostname, Binds: fs.Binds}
	switch {
	case fs.Rootfs != "":
		// The image's program, found on the container's PATH in the image.
		target.Rootfs, target.Mounts = fs.Rootfs, fs.Mounts
		p, err := podexec.LookPathIn(fs.Rootfs, argv[0], os.Getenv("PATH"))
		cmd = &exec.Cmd{Path: p, Args: argv, Env: os.Environ(), Err: err}
	case !sec.Privileged:
		// A privileged container has the node's access, as in Kubernetes.
		target.Hide = instance.NodeOnlyDirs()
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := podexec.Start(target, cmd); err != nil {
		fmt.Fprintf(os.Stderr, "shunt: starting %q: %v\n", argv, err)
		status.ExitCode, status.Error = 127, err.Error()
	} else {
		go func() {
			for s := range sigs {
				cmd.Process.Signal(s)
			}
		}()
		err := cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			ws := ee.Sys().(syscall.WaitStatus)
			status.ExitCode = ee.ExitCode()
			if ws.Signaled() {
				status.Signal = ws.Signal().String()
				status.ExitCode = 128 + int(ws.Signal())
			}
		} else if err != nil {
			status.ExitCode, status.Error = 1, err.Error()
		}
	}
	status.FinishedAt = time.Now().UTC()
	data, _ := json.Marshal(status)
	tmp := exitFile + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err == nil {
		os.Rename(tmp, exitFile)
	}
	return status.ExitCode
}

func readExitStatus(path string) (*ExitStatus, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	var s ExitStatus
	if json.Unmarshal(data, &s) != nil {
		return nil, false
	}
	return &s, true
}
