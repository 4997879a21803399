package proxy

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// SliceSetting reads SHUNT_PROXY_SLICE: unset, the default; 0, none; a
// malformed value, an error naming the variable.
func TestSliceSetting(t *testing.T) {
	for _, c := range []struct {
		env  string
		want time.Duration
		ok   bool
	}{{"0", 0, true}, {"150us", 150 * time.Microsecond, true}, {"soon", 0, false}, {"-1ms", 0, false}} {
		t.Setenv("SHUNT_PROXY_SLICE", c.env)
		got, err := SliceSetting(DefaultSlice)
		if got != c.want || (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), "SHUNT_PROXY_SLICE")) {
			t.Errorf("SHUNT_PROXY_SLICE=%q: SliceSetting = %s, %v; want %s (ok %v)", c.env, got, err, c.want, c.ok)
		}
	}
}

// SetSlice gives every thread of the process the slice, or says why the
// kernel would not; 0 leaves the default.
func TestSetSlice(t *testing.T) {
	if got, err := SetSlice(0); got != 0 || err != nil {
		t.Errorf("SetSlice(0) = %s, %v; want 0, nil", got, err)
	}
	before, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Put this test process's threads back as they were.
		tids, _ := threads()
		for _, tid := range tids {
			setThreadSlice(tid, time.Duration(before.Runtime))
		}
	}()
	got, err := SetSlice(150 * time.Microsecond)
	if err != nil {
		var uts unix.Utsname
		unix.Uname(&uts)
		if strings.Contains(err.Error(), "6.12") {
			t.Skipf("kernel %s: %v", unix.ByteSliceToString(uts.Release[:]), err)
		}
		t.Fatal(err)
	}
	if got != 150*time.Microsecond {
		t.Errorf("SetSlice = %s, want 150µs", got)
	}
	tids, err := threads()
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range tids {
		attr, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			continue // gone since
		}
		if attr.Runtime != uint64(150*time.Microsecond) || attr.Nice != before.Nice {
			t.Errorf("thread %d: slice %d ns, nice %d; want 150000 ns and nice %d", tid, attr.Runtime, attr.Nice, before.Nice)
		}
	}
	if clampSlice(time.Microsecond) != 100*time.Microsecond || clampSlice(time.Second) != 100*time.Millisecond {
		t.Error("clampSlice does not clamp as the kernel does (100 µs to 100 ms)")
	}
}
