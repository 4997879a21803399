package agent

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/cgroup"
)

// Preflight checks privileges and kernel features up front, so a missing
// one is named with the kernel version that has it instead of surfacing as
// an obscure error half way through setting up a node.
func Preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("shuntd must run as root (or with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN)")
	}
	if _, err := cgroup.Root(); err != nil {
		return err
	}
	checks := []struct {
		what, kernel string
		probe        func() error
	}{
		{"BPF programs of type sched_cls (tc)", "4.1", func() error { return features.HaveProgramType(ebpf.SchedCLS) }},
		{"the bpf_redirect_peer helper", "5.10", func() error { return features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectPeer) }},
		// The overlay's answer to packets too big for the tunnel.
		{"the bpf_check_mtu helper", "5.12", func() error { return features.HaveProgramHelper(ebpf.SchedCLS, asm.FnCheckMtu) }},
	}
	for _, c := range checks {
		if err := c.probe(); err != nil {
			var uts unix.Utsname
			unix.Uname(&uts)
			return fmt.Errorf("this kernel (%s) lacks %s, which shunt needs (Linux %s or later): %w",
				unix.ByteSliceToString(uts.Release[:]), c.what, c.kernel, err)
		}
	}
	return nil
}
