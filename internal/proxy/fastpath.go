package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The request fast path: for HTTP/1.1, the connection's own goroutine
// reads a request, decides it with the same code as the net/http path
// (exchange.decide, table.judge, the rule's weighted pick), writes it on a
// pooled upstream connection of the client's mark and copies the response
// back, with buffers from pools and no other goroutine in the way. A
// request it does not take (h2c, Upgrade, Expect, chunked or trailered
// request bodies, HTTP/1.0, heads longer than its buffer or anything its
// strict parser refuses) hands the connection, with the bytes read so far,
// to net/http for the rest of its life.
//
// What a client sees differs from the net/http path in small ways: the
// response's header lines pass in the upstream's order and spelling, and
// the proxy adds neither a Date nor a sniffed Content-Type the upstream did
// not send (as HAProxy and Envoy); a response delimited by the end of the
// connection is passed the same way, ending the client's connection too.

const (
	clientBufferSize  = 16 << 10 // the longest request head the fast path takes
	idleTimeout       = time.Hour
	readHeaderTimeout = 30 * time.Second
	// livenessCheck is how often a request waiting on its upstream checks
	// whether its client is still there (one goroutine cannot wait on
	// both sockets): a client that leaves ends the upstream request within
	// this time, as net/http's background read ends it at once.
	livenessCheck = 500 * time.Millisecond
	// maxDiscard is the most of an unread request body read away to keep
	// the connection after answering without forwarding (net/http's too).
	maxDiscard = 256 << 10
)

var (
	clientReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, clientBufferSize) }}
	clientWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 16<<10) }}
)

// errClientGone is a read from or write to the client that failed.
var errClientGone = errors.New("the client went away")

// errRouteTimeout is the route's timeout running out.
var errRouteTimeout = errors.New("the route's timeout ran out")

// fastConn is a client connection the fast path serves.
type fastConn struct {
	p      *Proxy
	c      *clientConn
	raw    io.ReadWriter // c's socket without c's wrappers (newRawSock)
	br     *bufio.Reader
	bw     *bufio.Writer
	req    fastRequest
	resp   fastResponse
	out    []byte // the upstream request: head, and the body when small
	unread int64  // request body bytes not read from the client yet
	idle   atomic.Bool
	// idleArmed is when the idle deadline was last set: it is set again
	// only once a minute, not per request.
	idleArmed time.Time
	rc        syscall.RawConn // to wait for a request without a buffer
	readable  func(fd uintptr) bool
	// first is what waitReadable read: the start of the next request,
	// read by the client's bufio.Reader before the connection.
	first firstRead
}

// firstRead is the client's first read after an idle wait, made by the
// wait itself (one system call, where a look and then a read were two),
// in a scratch buffer from a pool the client's reader then copies from.
type firstRead struct {
	c       io.Reader // the connection
	scratch *[clientBufferSize]byte
	b       []byte // unread part of scratch
	err     error  // of the read, once b is empty
}

var scratchBuffers = sync.Pool{New: func() any { return new([clientBufferSize]byte) }}

func (r *firstRead) Read(p []byte) (int, error) {
	if len(r.b) > 0 {
		n := copy(p, r.b)
		r.b = r.b[n:]
		return n, nil
	}
	r.release()
	if err := r.err; err != nil {
		r.err = nil
		return 0, err
	}
	return r.c.Read(p)
}

func (r *firstRead) release() {
	if r.scratch != nil {
		scratchBuffers.Put(r.scratch)
		r.scratch, r.b = nil, nil
	}
}

// takeBuffers gets the connection's buffers from the pools; an idle
// connection holds none (releaseBuffers), so thousands of idle clients do
// not hold 32 KiB each.
func (fc *fastConn) takeBuffers() {
	if fc.br == nil && fc.bw == nil {
		fc.p.fastConns.buffered.Add(1)
	}
	if fc.br == nil {
		fc.br = clientReaders.Get().(*bufio.Reader)
		fc.first.c = fc.raw
		fc.br.Reset(&fc.first)
	}
	if fc.bw == nil {
		fc.bw = clientWriters.Get().(*bufio.Writer)
		fc.bw.Reset(fc.raw)
	}
}

// releaseBuffers returns the buffers, empty, to the pools.
func (fc *fastConn) releaseBuffers() {
	if fc.br != nil || fc.bw != nil {
		fc.p.fastConns.buffered.Add(-1)
	}
	if fc.br != nil {
		fc.br.Reset(nil)
		clientReaders.Put(fc.br)
		fc.br = nil
		fc.first.release()
		fc.first.err = nil
	}
	if fc.bw != nil {
		fc.bw.Reset(nil)
		clientWriters.Put(fc.bw)
		fc.bw = nil
	}
	if cap(fc.out) > 4<<10 {
		fc.out = nil // a large body's scratch
	}
}

// waitReadable waits until the client sends something (or closes),
// holding no buffer, and reads it into fc.first: a read that finds
// nothing parks the goroutine in the poller, as the connection's Read
// would. (Not a bare wait: the poller's readiness is reset before the
// callback, so only a read is reliable.)
func (fc *fastConn) waitReadable() error {
	if fc.readable == nil { // made once: a closure per request would be allocated
		fc.readable = func(fd uintptr) bool {
			r := &fc.first
			if r.scratch == nil {
				r.scratch = scratchBuffers.Get().(*[clientBufferSize]byte)
			}
			n, err := rawRead(fd, r.scratch[:])
			switch {
			case err == unix.EAGAIN:
				r.release() // idle: no buffer held
				return false
			case err != nil:
				r.release()
				r.err = err
			default:
				r.b = r.scratch[:n]
			}
			return true
		}
	}
	return fc.rc.Read(fc.readable)
}

func (p *Proxy) serveConn(c *clientConn) { p.serveConnWith(c, nil) }

// serveConnWith serves c, whose first bytes (read by the event loop) are
// read.
func (p *Proxy) serveConnWith(c *clientConn, read []byte) {
	fc := &fastConn{p: p, c: c, raw: newRawSock(c.Conn)}
	if sc, ok := c.Conn.(syscall.Conn); ok {
		fc.rc, _ = sc.SyscallConn()
	}
	fc.takeBuffers()
	if len(read) > 0 {
		fc.first.scratch = scratchBuffers.Get().(*[clientBufferSize]byte)
		fc.first.b = fc.first.scratch[:copy(fc.first.scratch[:], read)]
		fc.br.Peek(len(fc.first.b)) // into the reader: readHead sees them buffered
	}
	p.fastConns.add(fc)
	defer p.fastConns.remove(fc)
	for {
		n, st, err := fc.readHead()
		t := p.table.Load()
		reason := handoffNotPlain
		if st == headRefused && fc.br.Buffered() == fc.br.Size() {
			reason = handoffTooLong // (or refused and as long as the buffer)
		}
		if err == nil && st == headComplete {
			head, _ := fc.br.Peek(n)
			// A request whose route has filters the fast path does not
			// apply (headedit.go) goes to net/http's path.
			switch {
			case !fc.req.parse(string(head)):
				st = headRefused
			case t.needsFilters(c.orig, c.remote, &fc.req.req):
				st, reason = headRefused, handoffFilters
			}
		}
		switch {
		case err != nil:
			fc.close()
			return
		case st == headRefused:
			fc.handOff(reason)
			return
		}
		fc.br.Discard(n)
		if !fc.serveRequest(t) {
			fc.close()
			return
		}
	}
}

// readHead waits for a whole request head in the read buffer; n is its
// length. Responses owed to the client are flushed before blocking.
func (fc *fastConn) readHead() (n int, st headStatus, err error) {
	if fc.br.Buffered() == 0 {
		if err := fc.bw.Flush(); err != nil {
			return 0, 0, err
		}
		if fc.rc != nil {
			fc.releaseBuffers()
		}
		fc.idle.Store(true)
		if fc.p.draining.Load() {
			return 0, 0, errors.New("shutting down")
		}
		if now := time.Now(); now.Sub(fc.idleArmed) > time.Minute {
			fc.c.SetReadDeadline(now.Add(idleTimeout))
			fc.idleArmed = now
		}
		if fc.rc != nil {
			err := fc.waitReadable()
			fc.takeBuffers()
			if err != nil {
				fc.idle.Store(false)
				return 0, 0, err
			}
		}
		_, err := fc.br.Peek(1)
		fc.idle.Store(false)
		if err != nil {
			return 0, 0, err
		}
	}
	for {
		buf, _ := fc.br.Peek(fc.br.Buffered())
		if n, st := findHead(buf); st != headIncomplete {
			return n, st, nil
		}
		if len(buf) == fc.br.Size() {
			return 0, headRefused, nil // longer than the fast path takes
		}
		if err := fc.bw.Flush(); err != nil {
			return 0, 0, err
		}
		// A head in pieces: net/http's header timeout, then the idle one again.
		fc.c.SetReadDeadline(time.Now().Add(readHeaderTimeout))
		fc.idleArmed = time.Time{}
		if _, err := fc.br.Peek(len(buf) + 1); err != nil {
			return 0, 0, err
		}
	}
}

// handOff gives the connection to net/http, with what was read of it.
func (fc *fastConn) handOff(reason handoffReason) {
	if fc.bw.Flush() != nil {
		fc.close()
		return
	}
	fc.bw.Reset(nil)
	clientWriters.Put(fc.bw)
	fc.bw = nil
	fc.c.SetReadDeadline(time.Time{})
	fc.c.replay = fc.br // not back to the pool: net/http reads it first
	fc.p.stats.handoffs.add(pathFast, reason)
	fc.p.handoff.give(fc.c)
}

func (fc *fastConn) close() {
	if fc.bw != nil {
		fc.bw.Flush()
	}
	fc.c.Close()
	fc.releaseBuffers()
}

// serveRequest handles one parsed request with the table serveConn looked
// at its route in; keep says whether the connection can carry the next one.
func (fc *fastConn) serveRequest(t *table) (keep bool) {
	p := fc.p
	r := &fc.req.req
	p.stats.requests.Add(1)
	x := t.newExchange(r, fc.c)
	defer p.finish(x)
	fc.unread = fc.req.contentLength
	defer func() {
		if keep && fc.unread > 0 { // answered without reading the whole body
			keep = fc.unread <= maxDiscard && fc.discardBody() == nil
		}
		keep = keep && !fc.req.close
	}()

	mark, ref := x.decide(r)
	if ref != nil {
		x.refuse(ref)
		return fc.writeError(ref.status, ref.msg) == nil
	}
	if x.target.redirects() { // the rule's redirect: the proxy answers (headedit.go)
		var answer []byte
		answer, x.status = x.appendRedirect(fc.bw.AvailableBuffer(), &fc.req, fc.req.close)
		_, err := fc.bw.Write(answer)
		return err == nil
	}
	x.up = p.up.get(mark, x.conn.upstreamSource())

	// The upstream request: its head, and a body small enough to be sent
	// again with it; a larger one is streamed once after it.
	fc.out = fc.req.appendUpstreamHead(fc.out[:0], &x.target)
	replayable := fc.unread <= maxReplay
	if replayable && fc.unread > 0 {
		head := len(fc.out)
		fc.out = append(fc.out, make([]byte, fc.unread)...)
		if _, err := io.ReadFull(fc.br, fc.out[head:]); err != nil {
			x.failed(err, true, false)
			return false
		}
		fc.unread = 0
	}
	retries, codes, backoff := x.target.rule.retryPolicy()
	if !replayable {
		retries = 0
	}
	var deadline time.Time
	if rl := x.target.rule; rl != nil && rl.timeout > 0 {
		deadline = x.start.Add(rl.timeout)
	}
	for attempt := 0; ; attempt++ {
		x.backend = x.target.pick()
		rule, ref := t.judge(x.peer, x.backend, r)
		x.policyRule = rule
		if ref != nil {
			x.refused, x.status = ref, ref.status
			return fc.writeError(ref.status, ref.msg) == nil
		}
		uc, err := fc.attempt(x, deadline)
		timedOut := errors.Is(err, errRouteTimeout)
		clientGone := errors.Is(err, errClientGone)
		inTime := deadline.IsZero() || time.Now().Before(deadline)
		retryCode := err == nil && slices.Contains(codes, fc.resp.status)
		if attempt < retries && inTime && !clientGone && (err != nil || retryCode) {
			if uc != nil {
				fc.drainResponse(x, uc)
			}
			if !sleepUntil(backoff, deadline) {
				timedOut, err = true, errRouteTimeout
			} else {
				continue
			}
		}
		if err != nil {
			code := x.failed(err, clientGone, timedOut)
			if code == 0 {
				return false
			}
			return fc.writeError(code, x.err) == nil
		}
		return fc.relay(x, uc, deadline)
	}
}

// appendUpstreamHead writes the request line and the header lines the
// client sent, but the hop-by-hop ones, in the client's order and case,
// with the target's filters applied (headedit.go).
func (r *fastRequest) appendUpstreamHead(b []byte, tg *target) []byte {
	b = tg.appendRequestLine(b, r)
	b = append(b, "\r\n"...)
	b = appendHeaderLines(b, tg.requestEdit(), r.text, r.forward)
	return append(b, "\r\n"...)
}

// attempt sends the request to x.backend and reads the response head into
// fc.resp. A connection the backend closed while idle is replaced, and the
// request sent again, when net/http's transport would do so: nothing was
// written, or nothing was read and the request is bodyless and idempotent.
func (fc *fastConn) attempt(x *exchange, deadline time.Time) (*upstreamConn, error) {
	for {
		// A request net/http would not send again must not meet a
		// connection the backend closed while idle: look first (net/http's
		// transport notices with its background read).
		check := !(fc.req.contentLength == 0 && replayableMethod(&fc.req.req))
		uc, err := x.up.fast.get(x.backend.addr, deadline, check)
		if err != nil {
			if !deadline.IsZero() && !time.Now().Before(deadline) {
				return nil, fmt.Errorf("%w: %w", errRouteTimeout, err)
			}
			return nil, err
		}
		fc.armUpstream(uc, deadline)
		wrote, err := fc.send(uc)
		got := false
		if err == nil {
			got, err = fc.readResponseHead(x, uc, deadline)
			if err == nil {
				return uc, nil
			}
		}
		uc.close()
		if errors.Is(err, errClientGone) || errors.Is(err, errRouteTimeout) || !uc.reused {
			return nil, err
		}
		retry := !wrote && fc.unread == 0 ||
			!got && fc.req.contentLength == 0 && replayableMethod(&fc.req.req)
		if !retry {
			return nil, err
		}
	}
}

// replayableMethod is net/http's rule for sending a request again on a
// new connection: idempotent, or marked with an idempotency key.
func replayableMethod(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, a := r.Header["Idempotency-Key"]
	_, b := r.Header["X-Idempotency-Key"]
	return a || b
}

// armUpstream sets the upstream connection's deadlines for this request:
// the route's timeout if it has one, and a read deadline every
// livenessCheck to look at the client. Without a route timeout nothing is
// set per request: the read deadline left from the last check fires
// sooner or later and is extended then.
func (fc *fastConn) armUpstream(uc *upstreamConn, deadline time.Time) {
	switch {
	case !deadline.IsZero():
		uc.c.SetWriteDeadline(deadline)
		uc.c.SetReadDeadline(earliest(deadline, time.Now().Add(livenessCheck)))
		uc.routeDeadline = true
	case uc.routeDeadline || !uc.armed:
		uc.c.SetWriteDeadline(time.Time{})
		uc.c.SetReadDeadline(time.Now().Add(livenessCheck))
		uc.routeDeadline, uc.armed = false, true
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// send writes the request, then streams the rest of a large body from the
// client. wrote says whether any byte went out.
func (fc *fastConn) send(uc *upstreamConn) (wrote bool, err error) {
	n, err := uc.raw.Write(fc.out)
	if err != nil {
		return n > 0, err
	}
	for fc.unread > 0 {
		if fc.br.Buffered() == 0 {
			if _, err := fc.br.Peek(1); err != nil {
				return true, fmt.Errorf("%w: reading the request body: %w", errClientGone, err)
			}
		}
		chunk, _ := fc.br.Peek(int(min(int64(fc.br.Buffered()), fc.unread)))
		if _, err := uc.raw.Write(chunk); err != nil {
			return true, err
		}
		fc.br.Discard(len(chunk))
		fc.unread -= int64(len(chunk))
	}
	return true, nil
}

// peekUpstream returns the next n bytes of the upstream connection,
// flushing what the client is owed before it blocks, and looking at the
// client and the route's deadline when a read times out.
func (fc *fastConn) peekUpstream(uc *upstreamConn, n int, deadline time.Time) ([]byte, error) {
	for {
		if uc.br.Buffered() < n && fc.bw.Buffered() > 0 {
			if err := fc.bw.Flush(); err != nil {
				return nil, fmt.Errorf("%w: %w", errClientGone, err)
			}
		}
		b, err := uc.br.Peek(n)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return b, err
		}
		if fc.clientGone() { // first: a client gone is no timeout to answer
			return nil, errClientGone
		}
		now := time.Now()
		if !deadline.IsZero() && !now.Before(deadline) {
			return nil, errRouteTimeout
		}
		next := now.Add(livenessCheck)
		if !deadline.IsZero() {
			next = earliest(next, deadline)
		}
		uc.c.SetReadDeadline(next)
	}
}

// clientGone looks, without blocking, whether the client closed or reset
// its connection.
func (fc *fastConn) clientGone() bool { return peerClosed(fc.c.Conn) }

// peerClosed looks, without blocking, whether the other end closed or
// reset the connection (or, on an idle connection, sent what nobody asked
// for).
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	err = rc.Read(func(fd uintptr) bool {
		closed = socketClosed(int(fd))
		return true
	})
	return closed || err != nil
}

// socketClosed is peerClosed on a file descriptor.
func socketClosed(fd int) bool {
	var b [1]byte
	n, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return n == 0 && err == nil || err != nil && err != unix.EAGAIN && err != unix.EINTR
}

// readResponseHead reads the final response head into fc.resp, passing
// informational (1xx) responses to the client on the way. got says
// whether any byte came.
func (fc *fastConn) readResponseHead(x *exchange, uc *upstreamConn, deadline time.Time) (got bool, err error) {
	for {
		buf, _ := uc.br.Peek(uc.br.Buffered())
		n, st := findHead(buf)
		switch {
		case st == headRefused:
			return true, errBadResponse
		case st == headIncomplete && len(buf) == uc.br.Size():
			return true, fmt.Errorf("the response head is longer than the proxy's %d bytes", uc.br.Size())
		case st == headIncomplete:
			if _, err := fc.peekUpstream(uc, len(buf)+1, deadline); err != nil {
				return len(buf) > 0, err
			}
			continue
		}
		if err := fc.resp.parse(buf[:n]); err != nil {
			return true, err
		}
		if fc.resp.status/100 != 1 {
			return true, nil
		}
		if fc.resp.status == http.StatusSwitchingProtocols {
			return true, errors.New("101 Switching Protocols to a request without Upgrade")
		}
		fc.bw.Write(buf[:n]) // 1xx: passed on as is
		uc.br.Discard(n)
	}
}

// relay copies the response to the client and keeps the upstream
// connection if the response ended cleanly.
func (fc *fastConn) relay(x *exchange, uc *upstreamConn, deadline time.Time) (keep bool) {
	resp := &fc.resp
	head := resp.text
	noBody := bodyless(fc.req.req.Method, resp.status)
	toEOF := !noBody && !resp.chunked && resp.contentLength < 0
	bw := fc.bw
	bw.Write(resp.appendHead(bw.AvailableBuffer(), x.target.responseEdit(), fc.req.close || toEOF))
	x.status = resp.status
	uc.br.Discard(len(head))
	var err error
	switch {
	case noBody:
	case resp.chunked:
		err = fc.relayChunked(uc, deadline)
	case toEOF:
		err = fc.relayN(uc, -1, deadline)
		resp.close = true
	default:
		err = fc.relayN(uc, resp.contentLength, deadline)
	}
	if err == nil && bw.Flush() != nil {
		err = errClientGone
	}
	if err != nil {
		uc.close()
		x.brokeOff(errors.Is(err, errClientGone))
		return false
	}
	if resp.close {
		uc.close()
	} else {
		x.up.fast.put(uc)
	}
	return !toEOF
}

// appendHead is the response head for the client: the status line and
// the header lines but the hop-by-hop ones, with the filters' edit e
// (nil: none) applied, Connection: close when the client's connection
// ends after it.
func (r *fastResponse) appendHead(b []byte, e *headEdit, close bool) []byte {
	head := r.text
	b = append(b, head[:bytesIndexCRLF(head)+2]...)
	b = appendHeaderLines(b, e, head, r.forward)
	if close {
		b = append(b, "Connection: close\r\n"...)
	}
	return append(b, "\r\n"...)
}

func bytesIndexCRLF(b []byte) int {
	for i := 0; i+1 < len(b); i++ {
		if b[i] == '\r' && b[i+1] == '\n' {
			return i
		}
	}
	return -1
}

// relayN copies n bytes of body (n < 0: up to the end of the connection).
func (fc *fastConn) relayN(uc *upstreamConn, n int64, deadline time.Time) error {
	for n != 0 {
		if _, err := fc.peekUpstream(uc, 1, deadline); err != nil {
			if n < 0 && err == io.EOF {
				return nil
			}
			return err
		}
		k := uc.br.Buffered()
		if n > 0 {
			k = int(min(int64(k), n))
		}
		b, _ := uc.br.Peek(k)
		if _, err := fc.bw.Write(b); err != nil {
			return fmt.Errorf("%w: %w", errClientGone, err)
		}
		uc.br.Discard(k)
		if n > 0 {
			n -= int64(k)
		}
	}
	return nil
}

// relayChunked copies a chunked body as it is framed: chunk lines, data,
// the last chunk and its trailer fields.
func (fc *fastConn) relayChunked(uc *upstreamConn, deadline time.Time) error {
	for {
		line, err := fc.upstreamLine(uc, deadline)
		if err != nil {
			return err
		}
		size, err := parseChunkSize(line[:len(line)-2])
		if err != nil {
			return err
		}
		if err := fc.pass(uc, len(line)); err != nil {
			return err
		}
		if size == 0 {
			for {
				line, err := fc.upstreamLine(uc, deadline)
				if err != nil {
					return err
				}
				if err := fc.pass(uc, len(line)); err != nil || len(line) == 2 {
					return err
				}
			}
		}
		if err := fc.relayN(uc, size, deadline); err != nil {
			return err
		}
		end, err := fc.peekUpstream(uc, 2, deadline)
		if err != nil {
			return err
		}
		if end[0] != '\r' || end[1] != '\n' {
			return errors.New("chunk data not followed by CRLF")
		}
		if err := fc.pass(uc, 2); err != nil {
			return err
		}
	}
}

// pass copies the next n buffered upstream bytes to the client.
func (fc *fastConn) pass(uc *upstreamConn, n int) error {
	b, _ := uc.br.Peek(n)
	if _, err := fc.bw.Write(b); err != nil {
		return fmt.Errorf("%w: %w", errClientGone, err)
	}
	uc.br.Discard(n)
	return nil
}

// upstreamLine peeks the next CRLF-terminated line.
func (fc *fastConn) upstreamLine(uc *upstreamConn, deadline time.Time) ([]byte, error) {
	for {
		buf, _ := uc.br.Peek(uc.br.Buffered())
		for i := 0; i < len(buf); i++ {
			if buf[i] == '\n' {
				if i == 0 || buf[i-1] != '\r' {
					return nil, errors.New("a chunk line not ending in CRLF")
				}
				return buf[:i+1], nil
			}
		}
		if len(buf) == uc.br.Size() {
			return nil, errors.New("a chunk line longer than the proxy's buffer")
		}
		if _, err := fc.peekUpstream(uc, len(buf)+1, deadline); err != nil {
			return nil, err
		}
	}
}

// drainResponse reads away a response that will be retried, keeping its
// connection when the body is small and ends cleanly (as roundTrip does).
func (fc *fastConn) drainResponse(x *exchange, uc *upstreamConn) {
	resp := &fc.resp
	uc.br.Discard(len(resp.text))
	if bodyless(fc.req.req.Method, resp.status) {
		x.up.fast.put(uc)
		return
	}
	if resp.chunked || resp.contentLength < 0 || resp.contentLength > maxReplay {
		uc.close()
		return
	}
	if _, err := uc.br.Discard(int(resp.contentLength)); err != nil || resp.close {
		uc.close()
		return
	}
	x.up.fast.put(uc)
}

// discardBody reads away the unread request body.
func (fc *fastConn) discardBody() error {
	n, err := fc.br.Discard(int(fc.unread))
	fc.unread -= int64(n)
	return err
}

// writeError answers as http.Error does.
func (fc *fastConn) writeError(code int, msg string) error {
	_, err := fc.bw.Write(appendHTTPError(fc.bw.AvailableBuffer(), code, msg, fc.req.close))
	return err
}

// appendHTTPError is the answer http.Error gives; close adds Connection:
// close.
func appendHTTPError(b []byte, code int, msg string, close bool) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(code)...)
	b = append(b, "\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: "...)
	b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(msg)+1), 10)
	if close {
		b = append(b, "\r\nConnection: close"...)
	}
	b = append(b, "\r\n\r\n"...)
	b = append(b, msg...)
	return append(b, '\n')
}

// sleepUntil waits d, unless the deadline comes first (then false).
func sleepUntil(d time.Duration, deadline time.Time) bool {
	if !deadline.IsZero() && time.Now().Add(d).After(deadline) {
		time.Sleep(time.Until(deadline))
		return false
	}
	if d > 0 {
		time.Sleep(d)
	}
	return true
}

// fastConns are the connections the fast path serves, for Shutdown.
type fastConns struct {
	mu sync.Mutex
	m  map[*fastConn]struct{}
	// buffered counts the connections holding buffers (tests).
	buffered atomic.Int64
}

func (s *fastConns) add(fc *fastConn) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*fastConn]struct{}{}
	}
	s.m[fc] = struct{}{}
	s.mu.Unlock()
}

func (s *fastConns) remove(fc *fastConn) {
	s.mu.Lock()
	delete(s.m, fc)
	s.mu.Unlock()
}

// closeIdle closes the connections waiting for a request; all: every one.
// It returns how many stay.
func (s *fastConns) closeIdle(all bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := 0
	for fc := range s.m {
		if all || fc.idle.Load() {
			fc.c.Close()
		} else {
			busy++
		}
	}
	return busy
}

// drain waits until the fast path's connections are gone: idle ones are
// closed, busy ones finish their request first. When ctx ends first, the
// rest are closed.
func (s *fastConns) drain(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		s.closeIdle(false)
		s.mu.Lock()
		n := len(s.m)
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			s.closeIdle(true)
			return ctx.Err()
		case <-tick.C:
		}
	}
}
