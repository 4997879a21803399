package podnet

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// namedNetnsWithPrefix are the paths of the named network namespaces whose
// names start with prefix.
func namedNetnsWithPrefix(prefix string) []string {
	paths, _ := filepath.Glob(filepath.Join(NetnsDir, prefix+"*"))
	return paths
}

// StopProcesses notes the network namespaces at paths (the absent ones are
// skipped) and returns what ends every process whose network namespace is
// one of them, wherever its cgroup: what `lab exec`, `ip netns exec` or
// nsenter started there would otherwise outlive the lab, holding a deleted
// namespace alive. The namespaces are noted now, by device and inode, so
// the returned function still finds their processes after the namespaces'
// names are gone (an agent's teardown unmounts them); each is held open
// until then, or a namespace freed meanwhile could hand its inode number
// to a new one (another lab's pod) whose processes would be taken for its.
// Processes are found by /proc/PID/ns/net and killed by PID (SIGTERM, then
// SIGKILL after 2s), never this process or its parent.
func StopProcesses(paths []string) func() {
	type nsID struct{ dev, ino uint64 }
	noted := map[nsID]bool{}
	var held []*os.File
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &st) != nil {
			f.Close()
			continue
		}
		noted[nsID{st.Dev, st.Ino}] = true
		held = append(held, f)
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
			if syscall.Stat(filepath.Join("/proc", e.Name(), "ns/net"), &st) == nil && noted[nsID{st.Dev, st.Ino}] {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	return func() {
		defer func() {
			for _, f := range held {
				f.Close()
			}
		}()
		if len(noted) == 0 {
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
