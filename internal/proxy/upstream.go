package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SetMark is the default way upstream sockets get their mark: SO_MARK,
// which needs CAP_NET_ADMIN.
func SetMark(fd uintptr, mark uint32) error {
	return unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
}

// upstreams holds the upstream transports, one pair per mark: the mark
// carries the client's identity, so a connection opened for one client is
// never reused for a client of another identity, and L3/L4 policy judges
// each upstream connection as its client.
type upstreams struct {
	setMark     func(fd uintptr, mark uint32) error
	dialTimeout func() time.Duration

	mu     sync.Mutex
	byMark map[uint32]*transports
}

// transports are the two ways to an upstream: HTTP/1.1 for HTTP/1
// clients, h2c (prior knowledge) for HTTP/2 clients, so gRPC stays HTTP/2
// end to end with its trailers.
// The fast path (fastpath.go) has its own pool of HTTP/1.1 connections.
type transports struct {
	h1, h2 *http.Transport
	fast   *fastPool
}

// dialError is an upstream connect that failed: the answer is 503 (an
// L3/L4 policy dropping the SYN looks like this too).
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return fmt.Sprintf("connecting to %s: %v", e.addr, e.err) }
func (e *dialError) Unwrap() error { return e.err }

func (u *upstreams) get(mark uint32) *transports {
	u.mu.Lock()
	defer u.mu.Unlock()
	if t := u.byMark[mark]; t != nil {
		return t
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: u.dialTimeout(), Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = u.setMark(fd, mark) }); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("setting SO_MARK %#x on the upstream socket (the proxy needs CAP_NET_ADMIN): %w", mark, serr)
			}
			return nil
		}}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, &dialError{addr: addr, err: err}
		}
		return c, nil
	}
	t := &transports{h1: newTransport(dial, false), h2: newTransport(dial, true), fast: newFastPool(dial)}
	u.byMark[mark] = t
	return t
}

func newTransport(dial func(context.Context, string, string) (net.Conn, error), h2c bool) *http.Transport {
	var protos http.Protocols
	if h2c {
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	return &http.Transport{
		DialContext:           dial,
		Protocols:             &protos,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// A proxy passes bodies as they are: no Accept-Encoding of its own
		// and no transparent decompression.
		DisableCompression: true,
	}
}

// retain forgets the transports of marks no client has any more, closing
// their idle connections; requests in flight finish on theirs.
func (u *upstreams) retain(keep map[uint32]bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for mark, t := range u.byMark {
		if !keep[mark] {
			t.h1.CloseIdleConnections()
			t.h2.CloseIdleConnections()
			t.fast.closeIdle()
			delete(u.byMark, mark)
		} else {
			t.fast.closeExpired()
		}
	}
}

// sweep closes, every interval until stop, the fast path's idle upstream
// connections that expired or that their backend closed.
func (u *upstreams) sweep(interval time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-stop:
			return
		}
		u.mu.Lock()
		pools := make([]*fastPool, 0, len(u.byMark))
		for _, t := range u.byMark {
			pools = append(pools, t.fast)
		}
		u.mu.Unlock()
		for _, p := range pools {
			p.closeExpired()
		}
	}
}

// marks are the marks with transports (the event loops drop the idle
// connections of the others).
func (u *upstreams) marks() map[uint32]bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := make(map[uint32]bool, len(u.byMark))
	for mark := range u.byMark {
		m[mark] = true
	}
	return m
}

// closeIdle closes every idle upstream connection (at shutdown).
func (u *upstreams) closeIdle() {
	u.retain(nil)
}
