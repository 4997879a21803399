package kubecluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/procstat"
)

// stateFile records what Up started, written after each process starts, so
// that Down can stop exactly those processes by PID even when Up failed half
// way or the command that ran Up has long exited.
const stateFile = "cluster.json"

type state struct {
	KubeVersion string `json:"kubeVersion"`
	Server      string `json:"server"`
	Kubeconfig  string `json:"kubeconfig"`
	ServiceCIDR string `json:"serviceCIDR"`
	ClusterCIDR string `json:"clusterCIDR"`
	// BinDir has the binaries it runs, kubectl among them (empty in files
	// of older versions: DefaultBinDir).
	BinDir string `json:"binDir,omitempty"`
	// Components in start order; stopped in reverse.
	Components []component `json:"components"`
}

// component is one process of the control plane.
type component struct {
	Name string `json:"name"`
	PID  int    `json:"pid"`
	// StartTime is field 22 of /proc/PID/stat: a PID reused by a later,
	// unrelated process has another start time, and is never signalled.
	StartTime string `json:"startTime"`
	Log       string `json:"log"`
}

func readState(dir string) (*state, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, stateFile), err)
	}
	return &s, nil
}

func (s *state) write(dir string) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, stateFile), append(data, '\n'))
}

// proc is a process this Go program started: exited is closed once it has
// been reaped, so a crash during start-up is seen at once.
type proc struct {
	component
	exited  chan struct{}
	waitErr error
}

// start runs bin with args, output appended to logPath. detach puts it in
// its own session so it outlives the caller (shunt dev cluster up);
// otherwise the kernel kills it when the caller dies (tests: nothing
// outlives a test binary, even one killed by a timeout).
func start(name, bin string, args []string, logPath string, detach bool) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	if detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		// Pdeathsig fires when the thread that forked exits, not the
		// process: forkThread forks from a thread that lives as long as
		// the process (a thread of the runtime's pool could be taken by a
		// goroutine that locks it, enters a network namespace and lets it
		// end, killing the control plane with it).
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	fmt.Fprintf(logf, "--- %s %s\n", bin, strings.Join(args, " "))
	if err := onForkThread(cmd.Start); err != nil {
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &proc{
		component: component{Name: name, PID: cmd.Process.Pid, Log: logPath},
		exited:    make(chan struct{}),
	}
	p.StartTime, _ = startTime(p.PID)
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// startTime reads the start time of PID from /proc; "" when it is gone.
func startTime(pid int) (string, error) {
	f, err := procstat.Fields(pid)
	if err != nil {
		return "", err
	}
	return f[19], nil
}

// alive says whether the recorded process still runs: same PID, same start
// time, not a zombie.
func (c component) alive() bool {
	f, err := procstat.Fields(c.PID)
	if err != nil {
		return false
	}
	return !procstat.Exited(f[0]) && (c.StartTime == "" || f[19] == c.StartTime)
}

// stop ends the recorded process by PID: SIGTERM, then SIGKILL after grace.
func (c component) stop(grace time.Duration) error {
	if c.PID <= 0 || !c.alive() {
		return nil
	}
	if err := syscall.Kill(c.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stopping %s (pid %d): %w", c.Name, c.PID, err)
	}
	if c.waitGone(grace) {
		return nil
	}
	if err := syscall.Kill(c.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing %s (pid %d): %w", c.Name, c.PID, err)
	}
	if c.waitGone(5 * time.Second) {
		return nil
	}
	return fmt.Errorf("%s (pid %d) is still running after SIGKILL", c.Name, c.PID)
}

func (c component) waitGone(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !c.alive() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return !c.alive()
}

// LogTail is the last lines of a component's log, for error messages.
func LogTail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	l := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

var (
	forkOnce  sync.Once
	forkCalls chan func()
)

// onForkThread runs f on one OS thread, locked and kept for the life of
// the process, so children started with Pdeathsig die with the process
// and only then.
func onForkThread(f func() error) error {
	forkOnce.Do(func() {
		forkCalls = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread stays this goroutine's
			for call := range forkCalls {
				call()
			}
		}()
	})
	done := make(chan error)
	forkCalls <- func() { done <- f() }
	return <-done
}
