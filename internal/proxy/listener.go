package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// listen binds the proxy's listener with SO_REUSEPORT, so a new proxy
// process can listen on the same address before the old one stops
// accepting and drains.
func listen(addr netip.AddrPort) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", addr.String())
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return ln, nil
}

// clientConn is an accepted connection with what the proxy learnt of it.
type clientConn struct {
	net.Conn
	remote netip.AddrPort // the client
	orig   netip.AddrPort // where it was headed
	closed atomic.Bool
	active *atomic.Int64
}

func (c *clientConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.active.Add(-1)
	}
	return c.Conn.Close()
}

// listener hands the HTTP server only connections whose original
// destination is known; the others are counted, logged and closed.
type listener struct {
	net.Listener
	p *Proxy
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p := l.p
		p.stats.conns.Add(1)
		remote := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
		orig, err := p.originalDst(c)
		if err == nil && orig == c.LocalAddr().(*net.TCPAddr).AddrPort() {
			err = fmt.Errorf("the client dialled the proxy itself: nothing to forward to")
		}
		if err != nil {
			p.stats.origDstErrors.Add(1)
			p.log.Warn("closing a connection without its original destination", "client", remote, "err", err)
			c.Close()
			continue
		}
		p.stats.active.Add(1)
		return &clientConn{Conn: c, remote: remote, orig: orig, active: &p.stats.active}, nil
	}
}
