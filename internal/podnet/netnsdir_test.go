package podnet

import (
	"os"
	"strings"
	"testing"
)

// TestNetnsDirShared: NetnsDir is a shared mount of itself after
// ensureNetnsDir, as `ip netns add` leaves it (so iproute2 run later mounts
// nothing over the namespaces made here), and a second call stacks no
// second mount.
func TestNetnsDirShared(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts")
	}
	mounts := func() (n int, shared bool) {
		data, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) > 6 && f[4] == NetnsDir {
				n++
				shared = strings.Contains(line, " shared:")
			}
		}
		return n, shared
	}
	if err := ensureNetnsDir(); err != nil {
		t.Fatal(err)
	}
	n, shared := mounts()
	if n == 0 || !shared {
		t.Fatalf("%s: %d mounts, shared %v; want a shared mount", NetnsDir, n, shared)
	}
	if err := ensureNetnsDir(); err != nil {
		t.Fatal(err)
	}
	if again, _ := mounts(); again != n {
		t.Errorf("a second ensureNetnsDir made %d mounts of %s from %d", again, NetnsDir, n)
	}
}
