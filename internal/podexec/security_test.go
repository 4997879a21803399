package podexec

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestKeptCapabilities(t *testing.T) {
	has := func(m uint64, c int) bool { return m&(1<<c) != 0 }
	def, err := Security{}.kept()
	if err != nil || !has(def, unix.CAP_NET_RAW) || has(def, unix.CAP_NET_ADMIN) || has(def, unix.CAP_SYS_ADMIN) || has(def, unix.CAP_BPF) {
		t.Errorf("default set %x, %v: want NET_RAW, not NET_ADMIN, SYS_ADMIN or BPF", def, err)
	}
	add, _ := Security{Add: []string{"NET_ADMIN"}, Drop: []string{"NET_RAW"}}.kept()
	if !has(add, unix.CAP_NET_ADMIN) || has(add, unix.CAP_NET_RAW) || !has(add, unix.CAP_CHOWN) {
		t.Errorf("add NET_ADMIN, drop NET_RAW: %x", add)
	}
	none, _ := Security{Drop: []string{"ALL"}, Add: []string{"cap_net_bind_service"}}.kept()
	if none != 1<<unix.CAP_NET_BIND_SERVICE {
		t.Errorf("drop ALL, add NET_BIND_SERVICE: %x", none)
	}
	if all, _ := (Security{Privileged: true}).kept(); all != ^uint64(0) {
		t.Errorf("privileged: %x", all)
	}
	if _, err := (Security{Add: []string{"NET_ADMINN"}}).kept(); err == nil {
		t.Error("an unknown capability was accepted")
	}
}
