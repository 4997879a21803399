package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// The fast path's upstream connections, one pool per mark (so per client
// identity, as the net/http transports beside them), idle connections per
// backend address, newest first.
const (
	fastMaxIdlePerBackend = 64               // as the transports' MaxIdleConnsPerHost
	fastIdleTimeout       = 90 * time.Second // as their IdleConnTimeout
	upstreamBufferSize    = 16 << 10
	fastSweepInterval     = 30 * time.Second
)

type fastPool struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	mu   sync.Mutex
	idle map[netip.AddrPort][]*upstreamConn
}

// upstreamConn is a connection to a backend with its read buffer (pooled
// while the connection lives).
type upstreamConn struct {
	c         net.Conn
	raw       io.ReadWriter // c's socket (newRawSock)
	br        *bufio.Reader
	addr      netip.AddrPort
	idleSince time.Time
	reused    bool // it served a request before this one
	// armed: a liveness read deadline is set; routeDeadline: the last
	// request's route timeout is (armUpstream).
	armed, routeDeadline bool
}

var upstreamReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, upstreamBufferSize) }}

func newFastPool(dial func(context.Context, string, string) (net.Conn, error)) *fastPool {
	return &fastPool{dial: dial, idle: map[netip.AddrPort][]*upstreamConn{}}
}

// get returns an idle connection to addr, or dials one (by the deadline,
// if there is one). check: only an idle connection the backend has not
// closed (one more system call).
func (p *fastPool) get(addr netip.AddrPort, deadline time.Time, check bool) (*upstreamConn, error) {
	now := time.Now()
	p.mu.Lock()
	for list := p.idle[addr]; len(list) > 0; list = p.idle[addr] {
		uc := list[len(list)-1]
		list[len(list)-1] = nil
		p.idle[addr] = list[:len(list)-1]
		if now.Sub(uc.idleSince) < fastIdleTimeout && uc.br.Buffered() == 0 && !(check && peerClosed(uc.c)) {
			p.mu.Unlock()
			uc.reused = true
			return uc, nil
		}
		uc.close()
	}
	p.mu.Unlock()
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	c, err := p.dial(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	br := upstreamReaders.Get().(*bufio.Reader)
	raw := newRawSock(c)
	br.Reset(raw)
	return &upstreamConn{c: c, raw: raw, br: br, addr: addr}, nil
}

// put keeps a connection whose last response ended cleanly.
func (p *fastPool) put(uc *upstreamConn) {
	uc.idleSince = time.Now()
	p.mu.Lock()
	if list := p.idle[uc.addr]; len(list) < fastMaxIdlePerBackend {
		p.idle[uc.addr] = append(list, uc)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	uc.close()
}

// closeIdle closes every idle connection.
func (p *fastPool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = map[netip.AddrPort][]*upstreamConn{}
	p.mu.Unlock()
	for _, list := range idle {
		for _, uc := range list {
			uc.close()
		}
	}
}

// closeExpired closes the connections idle for longer than the idle
// timeout or closed by their backend (net/http's transport notices the
// latter with its background read; here the sweep looks, every
// fastSweepInterval, and with every configuration push).
func (p *fastPool) closeExpired() {
	now := time.Now()
	var expired []*upstreamConn
	p.mu.Lock()
	for addr, list := range p.idle {
		kept := list[:0]
		for _, uc := range list {
			if now.Sub(uc.idleSince) >= fastIdleTimeout || peerClosed(uc.c) {
				expired = append(expired, uc)
			} else {
				kept = append(kept, uc)
			}
		}
		clear(list[len(kept):])
		p.idle[addr] = kept
	}
	p.mu.Unlock()
	for _, uc := range expired {
		uc.close()
	}
}

func (uc *upstreamConn) close() {
	uc.c.Close()
	if uc.br != nil {
		uc.br.Reset(nil)
		upstreamReaders.Put(uc.br)
		uc.br = nil
	}
}
