package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// TestSkMsgAttachAcrossRestarts: an agent that switches between the
// sockmap link and the skmsg-attach fallback (BPF_PROG_ATTACH) across
// restarts, as after a kernel upgrade or a forced fallback, leaves exactly
// one sk_msg program on the sockhash, pinned as the mode has it, and
// accelerated connections keep being redirected in each mode. Uninstall
// (the lab's cleanup) then leaves nothing (assertGone).
func TestSkMsgAttachAcrossRestarts(t *testing.T) {
	t.Setenv("SHUNT_KERNEL_FALLBACKS", "")
	l := newLabWith(t, []string{"--mode", "redirect-peer", "--socket-acceleration"}, "testdata/two-pods.yaml")
	server := l.podIP("server")
	l.probe("client", "connected", "--tcp", server+":7000")
	pin := filepath.Join("/sys/fs/bpf", l.instance, "links", "sockhash-sk_msg")

	for i, mode := range []string{"", "skmsg-attach", ""} {
		if i > 0 {
			pid := l.status().PID
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			waitGone(t, pid)
			t.Setenv("SHUNT_KERNEL_FALLBACKS", mode)
			l.mustShunt("lab", "up", "--socket-acceleration")
		}
		st := l.status()
		fallback := slices.Contains(st.Kernel.Fallbacks, "skmsg-attach")
		if i == 0 && fallback {
			t.Skipf("this kernel (%s) has no sockmap links: nothing to switch from", st.Kernel.Release)
		}
		if fallback != (mode != "") {
			t.Fatalf("SHUNT_KERNEL_FALLBACKS=%q: status says fallbacks %v", mode, st.Kernel.Fallbacks)
		}
		if st.Hooks["sockhash-sk_msg"] != 1 {
			t.Errorf("mode %q: hooks %v, want one sockhash-sk_msg", mode, st.Hooks)
		}
		attached := sockhashPrograms(t, l)
		if len(attached) != 1 {
			t.Errorf("mode %q: sk_msg programs on the sockhash %v, want one", mode, attached)
		}
		if lk, err := link.LoadPinnedLink(pin, nil); err == nil {
			lk.Close()
			if mode != "" {
				t.Errorf("with the skmsg-attach fallback a link is pinned at %s", pin)
			}
		} else if mode == "" {
			t.Errorf("without the fallback no link is pinned at %s: %v", pin, err)
		}

		script, _ := filepath.Abs("testdata/rr.py")
		out, err := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", "client", "--",
			"python3", script, server, "7000", "10", "0.01").Output()
		var rr struct{ OK int }
		if err != nil || json.Unmarshal(out, &rr) != nil || rr.OK != 10 {
			t.Errorf("mode %q: request/response over an accelerated connection: %s (%v)", mode, out, err)
		}
		if moved := l.status().counter("accel-redirected", "sockmsg") - st.counter("accel-redirected", "sockmsg"); moved < 20 {
			t.Errorf("mode %q: accel-redirected went up by %d, want >= 20 (10 requests and 10 replies)", mode, moved)
		}
	}
}

// sockhashPrograms lists the IDs of the sk_msg programs attached to the
// instance's pinned sockhash.
func sockhashPrograms(t *testing.T, l *lab) []ebpf.ProgramID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join("/sys/fs/bpf", l.instance, "shunt_sockhash"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := link.QueryPrograms(link.QueryOptions{Target: m.FD(), Attach: ebpf.AttachSkMsgVerdict})
	if err != nil {
		t.Fatalf("querying the sockhash's programs: %v", err)
	}
	var ids []ebpf.ProgramID
	for _, p := range r.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}
