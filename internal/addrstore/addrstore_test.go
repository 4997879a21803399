package addrstore

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/shuntnet/shunt/internal/ipam"
)

func TestAllocateReleaseRetain(t *testing.T) {
	s, err := Open(t.TempDir(), "net")
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := ipam.NewPool("10.1.0.0/29") // .2 to .6 for pods
	a, err := s.Allocate(pool, "a", "eth0")
	if err != nil || a != netip.MustParseAddr("10.1.0.2") {
		t.Fatalf("first: %v %v", a, err)
	}
	again, err := s.Allocate(pool, "a", "eth0")
	if err != nil || again != a {
		t.Fatalf("a retried ADD got %v (%v), want %v", again, err, a)
	}
	b, _ := s.Allocate(pool, "b", "eth0")
	if b == a {
		t.Fatalf("b got a's address %v", b)
	}
	if err := s.Release("a", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release("a", "eth0"); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if _, ok, _ := s.Get("a", "eth0"); ok {
		t.Error("a still holds an address after release")
	}
	if c, _ := s.Allocate(pool, "c", "eth0"); c != a {
		t.Errorf("freed address not reused: got %v want %v", c, a)
	}
	freed, err := s.Retain(func(r Reservation) bool { return r.ContainerID == "b" })
	if err != nil || len(freed) != 1 || freed[0].ContainerID != "c" {
		t.Errorf("retain freed %+v (%v), want c", freed, err)
	}
	for i := range 4 {
		s.Allocate(pool, fmt.Sprint("fill", i), "eth0")
	}
	if _, err := s.Allocate(pool, "late", "eth0"); err == nil {
		t.Error("allocating from a full pool succeeded")
	}
}

// TestConcurrentAllocate: many allocators at once (as concurrent plugin
// processes would be) never share an address.
func TestConcurrentAllocate(t *testing.T) {
	dir := t.TempDir()
	pool, _ := ipam.NewPool("10.1.0.0/24")
	var wg sync.WaitGroup
	got := make([]netip.Addr, 50)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Open(dir, "net") // a store per "process"
			if err != nil {
				t.Error(err)
				return
			}
			if got[i], err = s.Allocate(pool, fmt.Sprint("c", i), "eth0"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i, ip := range got {
		if j, dup := seen[ip]; dup {
			t.Errorf("containers %d and %d both got %v", j, i, ip)
		}
		seen[ip] = i
	}
}
