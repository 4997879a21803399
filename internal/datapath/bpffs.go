package datapath

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// EnsureBPFFS mounts bpffs at dir unless one is there already: pins only
// survive the agent if they live on a bpffs.
func EnsureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting bpffs at %s (needs CAP_SYS_ADMIN): %w", dir, err)
	}
	return nil
}
