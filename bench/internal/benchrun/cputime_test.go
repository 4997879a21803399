package benchrun

import (
	"testing"
	"time"
)

func TestParseCPUTimes(t *testing.T) {
	got, err := parseCPUTimes("cpu  2779 0 1500 11991 325 0 141 307 0 0")
	if err != nil {
		t.Fatal(err)
	}
	want := CPUTimes{Softirq: 1410 * time.Millisecond, Steal: 3070 * time.Millisecond}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3 4 5 6 7", "cpu 1 2 3 4 5 6 x 8"} {
		if _, err := parseCPUTimes(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestReadCPUTimes(t *testing.T) {
	a, err := ReadCPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	b, err := ReadCPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	if d := b.Sub(a); d.Softirq < 0 || d.Steal < 0 {
		t.Fatalf("CPU times went backwards: %+v then %+v", a, b)
	}
}
