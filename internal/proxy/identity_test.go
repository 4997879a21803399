package proxy

import (
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// Two clients of different identities use the same backend, over HTTP/1.1
// and h2c, concurrently: no upstream connection carries requests of both,
// and each upstream socket has its client's mark.
func TestUpstreamConnectionsArePerIdentity(t *testing.T) {
	b := startBackend(t, "backend", "127.0.4.1", nil)
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(b),
		Services: []proxyapi.Service{svcPort("default/backend", "10.96.0.80", 80, b)}})
	clients := []client{frontend, monitoring}
	var wg sync.WaitGroup
	for _, c := range clients {
		h.dials(c, "10.96.0.80:80")
		for _, h2c := range []bool{false, true} {
			for range 2 {
				hc := h.client(c, h2c)
				wg.Go(func() {
					for range 20 {
						if code, body := get(t, hc, "GET", "http://backend/", "X-Client", c.pod); code != 200 {
							t.Errorf("%s: %d %q", c.pod, code, body)
						}
					}
				})
			}
		}
	}
	wg.Wait()

	clientOf := map[string]string{} // upstream connection (its local address) -> client
	for _, r := range b.requests() {
		if prev, ok := clientOf[r.remote]; ok && prev != r.client {
			t.Fatalf("upstream connection %s carried requests of %s and %s", r.remote, prev, r.client)
		}
		clientOf[r.remote] = r.client
	}
	want := map[uint32]bool{}
	for _, c := range clients {
		m, _ := testMark.For(c.identity)
		want[m] = true
	}
	h.mu.Lock()
	for _, m := range h.marks {
		if !want[m] {
			t.Errorf("an upstream socket got mark %#x, want one of %v", m, want)
		}
	}
	h.mu.Unlock()
	if n := len(h.p.up.byMark); n != 2 {
		t.Errorf("%d transport pairs, want one per identity", n)
	}

	if os.Geteuid() != 0 {
		t.Skip("not root: SO_MARK was recorded, not set; the marks on the sockets are checked as root")
	}
	// The proxy runs in this process: find its upstream sockets among our
	// descriptors by their local address and read their marks.
	marks := socketMarks(t)
	identity := map[string]uint32{frontend.pod: frontend.identity, monitoring.pod: monitoring.identity}
	for conn, who := range clientOf {
		got, ok := marks[netip.MustParseAddrPort(conn)]
		want, _ := testMark.For(identity[who])
		if !ok || got != want {
			t.Errorf("upstream socket %s of %s: mark %#x (found %v), want %#x", conn, who, got, ok, want)
		}
	}
}

// socketMarks maps the local address of each IPv4 socket of this process
// to its SO_MARK.
func socketMarks(t *testing.T) map[netip.AddrPort]uint32 {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.AddrPort]uint32{}
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := unix.Getsockname(fd)
		in4, ok := sa.(*unix.SockaddrInet4)
		if err != nil || !ok {
			continue
		}
		mark, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK)
		if err != nil {
			continue
		}
		out[netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port))] = uint32(mark)
	}
	return out
}
