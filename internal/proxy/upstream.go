package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SetMark is the default way upstream sockets get their mark: SO_MARK,
// which needs CAP_NET_ADMIN.
func SetMark(fd uintptr, mark uint32) error {
	return unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
}

// upstreamKey is what an upstream connection is made with: the mark, which
// carries the client's identity, and, for a client tc steered to the proxy
// (steer.go), the client's own address as the connection's source
// (original source: IP_TRANSPARENT), so the backend's L3/L4 policy sees the
// address, and its CIDR identity, that it would see without the proxy, and
// the backend sees its client. Invalid source: the node's address.
type upstreamKey struct {
	mark   uint32
	source netip.Addr
}

// upstreams holds the upstream transports, one pair per key: a connection
// opened for one client is never reused for a client of another identity
// (or, with original source, another address), and L3/L4 policy judges
// each upstream connection as its client.
type upstreams struct {
	setMark     func(fd uintptr, mark uint32) error
	dialTimeout func() time.Duration

	mu     sync.Mutex
	byMark map[upstreamKey]*transports
}

// transports are the two ways to an upstream: HTTP/1.1 for HTTP/1
// clients, h2c (prior knowledge) for HTTP/2 clients, so gRPC stays HTTP/2
// end to end with its trailers.
// The fast path (fastpath.go) has its own pool of HTTP/1.1 connections.
type transports struct {
	h1, h2 *http.Transport
	fast   *fastPool
	// lastUsed (unix nanoseconds) tells when the transports of a client
	// address (original source) were last asked for: those of clients
	// gone for longer than the idle timeout are forgotten (sweep).
	lastUsed atomic.Int64
}

// dialError is an upstream connect that failed: the answer is 503 (an
// L3/L4 policy dropping the SYN looks like this too).
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return fmt.Sprintf("connecting to %s: %v", e.addr, e.err) }
func (e *dialError) Unwrap() error { return e.err }

// get returns the transports of mark and source (invalid: the node's
// address).
func (u *upstreams) get(mark uint32, source netip.Addr) *transports {
	key := upstreamKey{mark: mark, source: source}
	u.mu.Lock()
	defer u.mu.Unlock()
	if t := u.byMark[key]; t != nil {
		if source.IsValid() {
			t.lastUsed.Store(time.Now().UnixNano())
		}
		return t
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: u.dialTimeout(), Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				if serr = u.setMark(fd, mark); serr != nil {
					serr = fmt.Errorf("setting SO_MARK %#x on the upstream socket (the proxy needs CAP_NET_ADMIN): %w", mark, serr)
					return
				}
				if source.IsValid() {
					serr = originalSource(fd)
				}
			}); err != nil {
				return err
			}
			return serr
		}}
		if source.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: source.AsSlice()}
		}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, &dialError{addr: addr, err: err}
		}
		return c, nil
	}
	t := &transports{h1: newTransport(dial, false), h2: newTransport(dial, true), fast: newFastPool(dial)}
	t.lastUsed.Store(time.Now().UnixNano())
	u.byMark[key] = t
	return t
}

// originalSource lets an upstream socket bind to its client's address,
// which is no address of the node (IP_TRANSPARENT), and leaves the port to
// connect (IP_BIND_ADDRESS_NO_PORT), which picks one unique for the
// 4-tuple rather than one reserved for the address. The replies, addressed
// to the client, reach this socket because tc hands them to it
// (bpf/lib/steer.h, steer_proxy_reply).
func originalSource(fd uintptr) error {
	if err := unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1); err != nil {
		return fmt.Errorf("IP_TRANSPARENT on the upstream socket, to connect from the client's address (the proxy needs CAP_NET_ADMIN): %w", err)
	}
	if err := unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1); err != nil {
		return fmt.Errorf("IP_BIND_ADDRESS_NO_PORT on the upstream socket (Linux 4.2): %w", err)
	}
	return nil
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

// retain forgets the transports of marks no client has any more, and of
// client addresses unused for longer than the idle timeout, closing their
// idle connections; requests in flight finish on theirs.
func (u *upstreams) retain(keep map[uint32]bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	stale := staleSince()
	for key, t := range u.byMark {
		if !keep[key.mark] || key.stale(t, stale) {
			u.forgetLocked(key, t)
		} else {
			t.fast.closeExpired()
		}
	}
}

// staleSince: transports of a client address last used before this (unix
// nanoseconds) are forgotten.
func staleSince() int64 { return time.Now().Add(-fastIdleTimeout).UnixNano() }

// stale says whether t, the transports of k, are of a client address that
// has not been used since the time given.
func (k upstreamKey) stale(t *transports, since int64) bool {
	return k.source.IsValid() && t.lastUsed.Load() < since
}

// forgetLocked closes the idle connections of key's transports and forgets
// them; the caller holds mu.
func (u *upstreams) forgetLocked(key upstreamKey, t *transports) {
	t.h1.CloseIdleConnections()
	t.h2.CloseIdleConnections()
	t.fast.closeIdle()
	delete(u.byMark, key)
}

// sweep closes, every interval until stop, the fast path's idle upstream
// connections that expired or that their backend closed, and forgets the
// transports of client addresses gone quiet (retain).
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
		stale := staleSince()
		for key, t := range u.byMark {
			if key.stale(t, stale) {
				u.forgetLocked(key, t)
				continue
			}
			pools = append(pools, t.fast)
		}
		u.mu.Unlock()
		for _, p := range pools {
			p.closeExpired()
		}
	}
}

// keys are the marks and sources with transports (the event loops drop
// the idle connections of the others: marks no longer in use, client
// addresses forgotten).
func (u *upstreams) keys() map[upstreamKey]bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := make(map[upstreamKey]bool, len(u.byMark))
	for key := range u.byMark {
		m[key] = true
	}
	return m
}

// closeIdle closes every idle upstream connection (at shutdown).
func (u *upstreams) closeIdle() {
	u.retain(nil)
}
