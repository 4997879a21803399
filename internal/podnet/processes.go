package podnet

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// NamedNetnsWithPrefix are the paths of the named network namespaces whose
// names start with prefix (an instance's pods': "NAME-").
func NamedNetnsWithPrefix(prefix string) []string {
	paths, _ := filepath.Glob(filepath.Join(NetnsDir, prefix+"*"))
	return paths
}

// StopProcesses notes the network namespaces at paths (the absent ones are
// skipped) and returns what ends every process whose network namespace is
// one of them, wherever its cgroup: what `lab exec`, `ip netns exec` or
// nsenter started there would otherwise outlive the lab, holding a deleted
// namespace alive. The namespaces are noted now, by inode, so the returned
// function still finds their processes after the namespaces' names are gone
// (an agent's teardown unmounts them). Processes are found by
// /proc/PID/ns/net and killed by PID (SIGTERM, then SIGKILL after 2s),
// never this process or its parent.
func StopProcesses(paths []string) func() {
	inodes := map[uint64]bool{}
	for _, p := range paths {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil {
			inodes[st.Ino] = true
		}
	}
	find := func() []int {
		var pids []int
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() || pid == os.Getppid() {
				continue
			}
			var st syscall.Stat_t
			if syscall.Stat(filepath.Join("/proc", e.Name(), "ns/net"), &st) == nil && inodes[st.Ino] {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	return func() {
		if len(inodes) == 0 {
			return
		}
		for _, pid := range find() {
			syscall.Kill(pid, syscall.SIGTERM)
		}
		for i := 0; i < 40 && len(find()) > 0; i++ {
			time.Sleep(50 * time.Millisecond)
		}
		for _, pid := range find() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
