// Package procstat reads a process's /proc/PID/stat: its state, its start
// time, and whether it still runs.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Fields returns the fields of /proc/PID/stat after the command name
// (which may contain spaces and parentheses): f[0] is the state, f[19] the
// start time.
func Fields(pid int) ([]string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return f, nil
}

// Exited says whether a process's state (Fields' f[0]) is one that has
// exited: a zombie, which stays until its parent reaps it (an init that
// reaps lazily, a parent that has not waited yet) and which signal 0 still
// reaches, or dead.
func Exited(state string) bool { return state == "Z" || state == "X" }

// Running says whether process pid exists and has not exited.
func Running(pid int) bool {
	f, err := Fields(pid)
	return err == nil && !Exited(f[0])
}
