package e2e

import (
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/datapath"
)

// TestAccelAsTheKernelAllows: `lab up --socket-acceleration` turns
// acceleration on where the kernel can hold a fast writer back (6.18), and
// where it cannot (6.1: make test-kernel-6.1 runs this test there) leaves
// it off and says why, refuses `shunt accel on`, and lets
// `--without-backpressure` turn it on with the caveat shown (issue 31: a
// writer blocks, never gets ENOMEM, unless the user accepted that).
func TestAccelAsTheKernelAllows(t *testing.T) {
	k, err := datapath.ProbeAccelKernel()
	if err != nil {
		t.Fatal(err)
	}
	l := newLabWith(t, []string{"--mode", "redirect-peer", "--socket-acceleration"}, "testdata/two-pods.yaml")
	st := l.status()
	t.Logf("kernel %s: backpressure %v", st.Kernel.Release, k.Backpressure)
	if k.Backpressure {
		if !st.Accel.Enabled || st.Accel.Refused != "" {
			t.Fatalf("acceleration %+v on a kernel with backpressure, want on", st.Accel)
		}
		if out := l.mustShunt("accel", "on"); strings.Contains(out, "backpressure") {
			t.Errorf("shunt accel on: %q, want no caveat about backpressure", out)
		}
		return
	}
	if st.Accel.Enabled || !strings.Contains(st.Accel.Refused, "msg_tot_len") || !strings.Contains(st.Accel.Refused, "--accelerate-without-backpressure") {
		t.Errorf("acceleration %+v asked for at start on a kernel without backpressure, want off with the reason and the flag", st.Accel)
	}
	if out := l.mustShunt("accel"); !strings.Contains(out, "off") || !strings.Contains(out, "refused") {
		t.Errorf("shunt accel: %q, want off and refused", out)
	}
	out, code := l.shunt("accel", "on")
	if code == 0 || !strings.Contains(out, "refusing socket acceleration") || !strings.Contains(out, "--without-backpressure") {
		t.Errorf("shunt accel on: exit %d %q, want refused with the reason and --without-backpressure", code, out)
	}
	if st := l.status(); st.Accel.Enabled {
		t.Errorf("acceleration on after a refused `shunt accel on`")
	}
	out = l.mustShunt("accel", "on", "--without-backpressure")
	if !strings.HasPrefix(out, "on for pods") || !strings.Contains(out, "no backpressure") {
		t.Errorf("shunt accel on --without-backpressure: %q, want on with the caveat", out)
	}
	if st := l.status(); !st.Accel.Enabled || st.Accel.Refused != "" {
		t.Errorf("acceleration %+v after --without-backpressure, want on and no longer refused", st.Accel)
	}
}
