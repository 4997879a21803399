package proxy

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
)

// Upstream connections for steered clients leave from the client's own
// address (original source): one set of transports per (mark, address),
// the connection bound to that address, and those of an address unused
// for longer than the idle timeout forgotten at the next retain, while the
// node-address ones of a kept mark stay.
func TestUpstreamOriginalSource(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: IP_TRANSPARENT needs CAP_NET_ADMIN")
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	u := &upstreams{setMark: func(uintptr, uint32) error { return nil }, byMark: map[upstreamKey]*transports{},
		dialTimeout: func() time.Duration { return time.Second }}
	mark := uint32(0x5e000002)
	client := netip.MustParseAddr("127.0.0.77")
	node, fromClient := u.get(mark, netip.Addr{}), u.get(mark, client)
	if node == fromClient || u.get(mark, client) != fromClient || len(u.byMark) != 2 {
		t.Fatalf("transports: node %p, client %p, %d sets; want two, the client's reused", node, fromClient, len(u.byMark))
	}
	uc, err := fromClient.fast.dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if got := uc.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); got != client {
		t.Errorf("upstream connection from %s, want the client's %s", got, client)
	}
	fromClient.lastUsed.Store(time.Now().Add(-2 * fastIdleTimeout).UnixNano())
	u.retain(map[uint32]bool{mark: true})
	if _, ok := u.byMark[upstreamKey{mark: mark, source: client}]; ok || u.byMark[upstreamKey{mark: mark}] != node {
		t.Errorf("after retain: %v; want the node's transports only (the client's went quiet)", u.byMark)
	}
}
