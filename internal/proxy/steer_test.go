package proxy

import (
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// A connection the tc programs steered to the transparent listener has its
// original destination as its local address: the listener takes it from
// there (no SO_ORIGINAL_DST), and refuses one that dialled the listener's
// own address (nothing to forward to).
func TestSteeredConnectionsOriginalDestination(t *testing.T) {
	p := New(Options{OriginalDst: func(net.Conn) (netip.AddrPort, error) {
		t.Error("the transparent listener asked for SO_ORIGINAL_DST")
		return netip.AddrPort{}, nil
	}})
	accept := func(bind, dial string) (*clientConn, error) {
		t.Helper()
		ln, err := listen(netip.MustParseAddrPort(bind), false) // IP_TRANSPARENT matters to the kernel only
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		l := &listener{Listener: ln, p: p, transparent: true}
		c, err := net.Dial("tcp4", net.JoinHostPort(dial, strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		got := make(chan net.Conn, 1)
		go func() {
			ac, err := l.Accept()
			if err == nil {
				got <- ac
			}
		}()
		select {
		case ac := <-got:
			return ac.(*clientConn), nil
		case <-time.After(500 * time.Millisecond):
			return nil, errNotAccepted
		}
	}

	// Bound to any address, as a stand-in for a pod's address: the
	// destination the client dialled is the local address.
	cc, err := accept("0.0.0.0:0", "127.0.0.5")
	if err != nil {
		t.Fatal(err)
	}
	if cc.orig.Addr() != netip.MustParseAddr("127.0.0.5") || cc.orig.Port() != cc.LocalAddr().(*net.TCPAddr).AddrPort().Port() {
		t.Errorf("original destination %s, want 127.0.0.5 and the dialled port", cc.orig)
	}
	cc.Close()

	before := p.stats.origDstErrors.Load()
	if _, err := accept("127.0.0.1:0", "127.0.0.1"); err != errNotAccepted {
		t.Errorf("a connection to the listener's own address was handed on")
	}
	if p.stats.origDstErrors.Load() != before+1 {
		t.Errorf("original destination errors %d, want %d", p.stats.origDstErrors.Load(), before+1)
	}
}

var errNotAccepted = &net.OpError{Op: "accept", Err: net.ErrClosed}
