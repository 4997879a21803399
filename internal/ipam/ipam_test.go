package ipam

import (
	"net/netip"
	"strings"
	"testing"
)

func TestAllocateSkipsReservedAndUsed(t *testing.T) {
	p, err := NewPool("10.1.2.0/29")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.NodeIP(); got != netip.MustParseAddr("10.1.2.1") {
		t.Fatalf("node IP %s", got)
	}
	used := map[netip.Addr]bool{}
	var got []string
	for range p.Size() {
		ip, err := p.Allocate(used)
		if err != nil {
			t.Fatal(err)
		}
		used[ip] = true
		got = append(got, ip.String())
	}
	if want := "10.1.2.2 10.1.2.3 10.1.2.4 10.1.2.5 10.1.2.6"; strings.Join(got, " ") != want {
		t.Fatalf("allocated %v, want %s", got, want)
	}
	if _, err := p.Allocate(used); err == nil || !strings.Contains(err.Error(), "full") {
		t.Fatalf("full pool: err = %v", err)
	}
	delete(used, netip.MustParseAddr("10.1.2.4"))
	if ip, _ := p.Allocate(used); ip != netip.MustParseAddr("10.1.2.4") {
		t.Fatalf("freed address not reused: got %s", ip)
	}
}

func TestNewPoolRejects(t *testing.T) {
	for _, c := range []string{"10.0.0.0/30", "fd00::/64", "nonsense", "10.0.0.0/33"} {
		if _, err := NewPool(c); err == nil {
			t.Errorf("%s accepted", c)
		}
	}
	p, _ := NewPool("10.0.0.7/24")
	if p.CIDR.String() != "10.0.0.0/24" {
		t.Errorf("not masked: %s", p.CIDR)
	}
	if p.Contains(netip.MustParseAddr("10.0.0.255")) || p.Contains(netip.MustParseAddr("10.0.0.0")) || !p.Contains(netip.MustParseAddr("10.0.0.254")) {
		t.Error("Contains wrong at the edges")
	}
}
