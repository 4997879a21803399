package agent

import (
	"errors"
	"os"

	"github.com/shuntnet/shunt/internal/cgroup"
)

// Preflight checks privileges and the cgroup v2 mount up front; the
// kernel's BPF features are checked next, against what this build's
// objects use (datapath.CheckKernel), so a missing one is named with the
// kernel version that has it instead of surfacing as an obscure error half
// way through setting up a node.
func Preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("shuntd must run as root (or with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN)")
	}
	if _, err := cgroup.Root(); err != nil {
		return err
	}
	return nil
}
