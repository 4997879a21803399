// Package capability names Linux capabilities as Kubernetes writes them in
// a securityContext ("NET_ADMIN"), for the lab's API server to validate and
// its container runtime to apply.
package capability

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Defaults are what containerd and Docker grant a container
// unless it asks otherwise: none of them lets a process change the
// network (NET_ADMIN), load BPF programs (BPF, SYS_ADMIN) or leave its
// namespaces.
var Defaults = []string{
	"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
	"SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
}

// capNames are the capabilities by their Kubernetes names (capability(7)
// without CAP_).
var capNames = map[string]int{
	"CHOWN": unix.CAP_CHOWN, "DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH,
	"FOWNER": unix.CAP_FOWNER, "FSETID": unix.CAP_FSETID, "KILL": unix.CAP_KILL, "SETGID": unix.CAP_SETGID,
	"SETUID": unix.CAP_SETUID, "SETPCAP": unix.CAP_SETPCAP, "LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE,
	"NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "NET_BROADCAST": unix.CAP_NET_BROADCAST, "NET_ADMIN": unix.CAP_NET_ADMIN,
	"NET_RAW": unix.CAP_NET_RAW, "IPC_LOCK": unix.CAP_IPC_LOCK, "IPC_OWNER": unix.CAP_IPC_OWNER,
	"SYS_MODULE": unix.CAP_SYS_MODULE, "SYS_RAWIO": unix.CAP_SYS_RAWIO, "SYS_CHROOT": unix.CAP_SYS_CHROOT,
	"SYS_PTRACE": unix.CAP_SYS_PTRACE, "SYS_PACCT": unix.CAP_SYS_PACCT, "SYS_ADMIN": unix.CAP_SYS_ADMIN,
	"SYS_BOOT": unix.CAP_SYS_BOOT, "SYS_NICE": unix.CAP_SYS_NICE, "SYS_RESOURCE": unix.CAP_SYS_RESOURCE,
	"SYS_TIME": unix.CAP_SYS_TIME, "SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG, "MKNOD": unix.CAP_MKNOD,
	"LEASE": unix.CAP_LEASE, "AUDIT_WRITE": unix.CAP_AUDIT_WRITE, "AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL,
	"SETFCAP": unix.CAP_SETFCAP, "MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE, "MAC_ADMIN": unix.CAP_MAC_ADMIN,
	"SYSLOG": unix.CAP_SYSLOG, "WAKE_ALARM": unix.CAP_WAKE_ALARM, "BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND,
	"AUDIT_READ": unix.CAP_AUDIT_READ, "PERFMON": unix.CAP_PERFMON, "BPF": unix.CAP_BPF,
	"CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
}

// Number accepts "NET_ADMIN" and "CAP_NET_ADMIN", as runtimes do.
func Number(name string) (int, error) {
	n, ok := capNames[strings.TrimPrefix(strings.ToUpper(name), "CAP_")]
	if !ok {
		return 0, fmt.Errorf("unknown capability %q (see capabilities(7), e.g. NET_ADMIN)", name)
	}
	return n, nil
}

// Check names the first capability that is not one.
func Check(names []string) error {
	for _, n := range names {
		if strings.EqualFold(n, "ALL") {
			continue
		}
		if _, err := Number(n); err != nil {
			return err
		}
	}
	return nil
}
