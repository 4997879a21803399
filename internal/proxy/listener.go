package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// listen binds the proxy's listener with SO_REUSEPORT, so a new proxy
// process can listen on the same address before the old one stops
// accepting and drains; transparent adds IP_TRANSPARENT (steer.go).
func listen(addr netip.AddrPort, transparent bool) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); serr != nil || !transparent {
				return
			}
			if err := unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1); err != nil {
				serr = fmt.Errorf("IP_TRANSPARENT (the proxy needs CAP_NET_ADMIN): %w", err)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", addr.String())
	if err != nil {
		if transparent {
			return nil, fmt.Errorf("listening for steered connections on %s: %w", addr, err)
		}
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
	// replay holds what the fast path read before it handed the
	// connection to net/http: read first.
	replay *bufio.Reader
	// steered: tc gave the connection to the transparent listener
	// (steer.go): its client is off the node and its original destination
	// a pod of this node.
	steered bool
}

// upstreamSource is the source address of the connection's upstream
// connections: the client's own for a steered connection (original
// source, upstream.go), so the local backend's policy judges the address
// it would judge without the proxy (an ipBlock, its CIDR identity) and the
// backend sees its client; invalid (the node's address) for a client of
// this node, whose mark alone says who it is, also beyond this node.
func (c *clientConn) upstreamSource() netip.Addr {
	if !c.steered {
		return netip.Addr{}
	}
	return c.remote.Addr()
}

func (c *clientConn) Read(b []byte) (int, error) {
	if c.replay != nil {
		if c.replay.Buffered() > 0 {
			return c.replay.Read(b)
		}
		c.replay = nil
	}
	return c.Conn.Read(b)
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
	// transparent: the tc programs gave the connections to this listener
	// (steer.go), so an accepted socket's local address is the original
	// destination.
	transparent bool
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
		orig, err := l.originalDst(c)
		if err == nil && orig == l.Addr().(*net.TCPAddr).AddrPort() {
			err = fmt.Errorf("the client dialled the proxy itself: nothing to forward to")
		}
		if err != nil {
			p.stats.origDstErrors.Add(1)
			p.log.Warn("closing a connection without its original destination", "client", remote, "err", err)
			c.Close()
			continue
		}
		p.stats.active.Add(1)
		return &clientConn{Conn: c, remote: remote, orig: orig, active: &p.stats.active, steered: l.transparent}, nil
	}
}

// originalDst is where an accepted connection was headed: its local
// address on the transparent listener, else what the socket hooks kept.
func (l *listener) originalDst(c net.Conn) (netip.AddrPort, error) {
	if l.transparent {
		a := c.LocalAddr().(*net.TCPAddr).AddrPort()
		return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()), nil
	}
	return l.p.originalDst(c)
}

// acceptFast accepts connections for the fast path, each served by its own
// goroutine (serveConn), until l is closed.
func (p *Proxy) acceptFast(l *listener) error {
	var pause time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors, say: wait as net/http does.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			p.log.Warn("accepting a connection", "err", err, "retry in", pause)
			time.Sleep(pause)
			continue
		}
		pause = 0
		if cc := c.(*clientConn); !p.loops.take(cc) {
			go p.serveConn(cc)
		}
	}
}

// handoffListener is how connections the fast path does not take reach
// the net/http server.
type handoffListener struct {
	addr      net.Addr
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newHandoffListener() *handoffListener {
	return &handoffListener{addr: &net.TCPAddr{}, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// give hands a connection to the server; closed when it has stopped.
func (l *handoffListener) give(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *handoffListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }
