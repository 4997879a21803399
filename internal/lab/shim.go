package lab

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
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
	return RunShimIn(netnsPath, exitFile, "", hostname, sec, ContainerFS{Binds: binds}, argv)
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

// RunShimIn is RunShim for a container with a file system of its own,
// its output written to logFile in the CRI's format (crilog.go); logFile
// "": the container writes to the shim's stdout and stderr.
func RunShimIn(netnsPath, exitFile, logFile, hostname string, sec podexec.Security, fs ContainerFS, argv []string) int {
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
	var shimErr io.Writer = os.Stderr
	started, drained := func() {}, func() {}
	if logFile != "" {
		out, s, d, err := logStreams(logFile, cmd)
		if err != nil {
			fmt.Fprintf(os.Stderr, "shunt: the container's log %s: %v\n", logFile, err)
		} else {
			shimErr, started, drained = out, s, d
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := podexec.Start(target, cmd); err != nil {
		started()
		fmt.Fprintf(shimErr, "shunt: starting %q: %v\n", argv, err)
		status.ExitCode, status.Error = 127, err.Error()
	} else {
		started()
		go func() {
			for s := range sigs {
				cmd.Process.Signal(s)
			}
		}()
		err := cmd.Wait()
		drained()
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

// logStreams gives cmd pipes for stdout and stderr whose lines go into
// the CRI log at path. started closes the shim's copies of the pipes'
// write ends (call it once the container started, or failed to); drained
// waits until what the container wrote is in the log, at most
// logDrainWait (a process the container left running may hold the
// pipes). The writer writes the shim's own messages as stderr lines.
func logStreams(path string, cmd *exec.Cmd) (shimErr io.Writer, started, drained func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, nil, err
	}
	log := &criLogWriter{w: f, now: time.Now}
	var wg sync.WaitGroup
	var writeEnds []*os.File
	for _, s := range []struct {
		name string
		dst  *io.Writer
	}{{criStdout, &cmd.Stdout}, {criStderr, &cmd.Stderr}} {
		r, w, err := os.Pipe()
		if err != nil {
			f.Close()
			return nil, nil, nil, err
		}
		*s.dst = w
		writeEnds = append(writeEnds, w)
		wg.Go(func() { log.copy(s.name, r); r.Close() })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	started = func() {
		for _, w := range writeEnds {
			w.Close()
		}
	}
	drained = func() {
		select {
		case <-done:
		case <-time.After(logDrainWait):
		}
	}
	return shimStderr{log}, started, drained, nil
}

const logDrainWait = 2 * time.Second

// shimStderr writes the shim's own messages into the log as stderr.
type shimStderr struct{ log *criLogWriter }

func (s shimStderr) Write(p []byte) (int, error) {
	s.log.copy(criStderr, bytes.NewReader(p))
	return len(p), nil
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
