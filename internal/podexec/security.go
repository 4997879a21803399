package podexec

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/capability"
)

// Security is what a container runtime takes from a container's
// securityContext: the capabilities its process keeps and the user it runs
// as. The zero value is a runtime's default for a root container.
type Security struct {
	Privileged bool     // every capability, as the node's root has
	Add, Drop  []string // capability names, as Kubernetes writes them ("NET_ADMIN"; "ALL" in Drop)
	UID, GID   *uint32  // nil: root
	Groups     []uint32 // supplementary groups; none unless set
	// Kept is the capability set itself, as a bit mask, read from a
	// running container (Join); it overrides Privileged, Add and Drop.
	Kept *uint64
}

// kept is the set of capabilities the process keeps, as a bit mask,
// computed as containerd's CRI plugin does: the defaults (none after a
// drop of ALL), plus what is added (ALL: every one), less what is dropped.
func (s Security) kept() (uint64, error) {
	if s.Kept != nil {
		return *s.Kept, nil
	}
	if s.Privileged {
		return ^uint64(0), nil
	}
	var mask uint64
	names := capability.Defaults
	if slices.ContainsFunc(s.Drop, func(n string) bool { return strings.EqualFold(n, "ALL") }) {
		names = nil
	}
	for _, n := range append(slices.Clone(names), s.Add...) {
		if strings.EqualFold(n, "ALL") {
			mask = ^uint64(0)
			continue
		}
		c, err := capability.Number(n)
		if err != nil {
			return 0, err
		}
		mask |= 1 << c
	}
	for _, n := range s.Drop {
		if strings.EqualFold(n, "ALL") {
			continue
		}
		c, err := capability.Number(n)
		if err != nil {
			return 0, err
		}
		mask &^= 1 << c
	}
	return mask, nil
}

// restrictThread leaves the calling (locked, never reused) thread only the
// capabilities in mask, in its bounding set too, so a child it forks and
// execs as root gets exactly them and can never regain the others.
//
// A child that changes its user first (Security.UID, GID: Go's fork does
// setgroups, setgid, setuid before exec) needs CAP_SETUID and CAP_SETGID
// for that: withCredential keeps them in the thread's permitted and
// effective sets, not in its bounding or inheritable sets, so the exec
// still leaves the process only mask (a root process gets its bounding
// set; a process that is no longer root none, as a runtime's non-root
// container).
func restrictThread(mask uint64, withCredential bool) error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if mask&(1<<c) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	keep := mask
	if withCredential {
		keep |= 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID
	}
	for i := range data {
		part, keepPart := uint32(mask>>(32*i)), uint32(keep>>(32*i))
		data[i].Effective &= keepPart
		data[i].Permitted &= keepPart
		data[i].Inheritable = data[i].Permitted & part
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("setting capabilities: %w", err)
	}
	return nil
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("reading the kernel's last capability: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
