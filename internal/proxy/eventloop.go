package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The event loop: the fast path for the plainest HTTP/1.1 keep-alive
// exchanges, without a goroutine per connection. A few loops (one per P
// but one), each a goroutine waiting in its own epoll set (holding its P
// while busy: epollWaitHoldingP), own non-blocking client and upstream
// sockets taken out of Go's poller.
// A readable client gives one read; a whole request in it (head and any
// body, nothing after) is decided by the same code as the other paths
// (exchange.decide, table.judge, the picks), written to a pooled upstream
// connection of the client's mark, and the response copied back as it
// comes (Content-Length, chunked or to the end of the connection; partial
// writes wait for EPOLLOUT, the upstream is not read while the client's
// output is not drained).
//
// Why: at the mesh benchmark's load (each request reaching an idle
// process) the goroutine per connection parks in Go's poller and is woken
// twice per request, and finds nothing on a read before each park; the
// loop's thread waits in epoll_wait itself and reads only when told.
//
// Anything else goes to the goroutine per connection (serveConn), with
// the bytes read so far, for the rest of the connection's life: a head in
// pieces or longer than a read, a request the strict parser refuses (h2c,
// Upgrade, Expect, chunked bodies, HTTP/1.0, ...), bytes after the request
// (pipelining), a service whose routes have timeouts or retries (the loop
// has no timers for them), and a client that sends more while its request
// is in flight (after the response). A decided request never moves: the
// weighted picks are made once.

const (
	loopReadSize  = 16 << 10 // one read of a client; a request must fit
	loopTick      = time.Second
	maxChunkLine  = 4 << 10
	loopMaxEvents = 128
	yieldEvery    = 9 * time.Millisecond
	holdPWait     = 5 * time.Millisecond
)

// eventLoops are the proxy's loops; a new connection goes to the next.
type eventLoops struct {
	loops  []*eventLoop
	next   atomic.Uint32
	served atomic.Uint64 // requests the loops decided (tests)
}

func (p *Proxy) startEventLoops(n int) error {
	for i := 0; i < n; i++ {
		l, err := newEventLoop(p)
		if err != nil {
			return err
		}
		l.holdP = n < runtime.GOMAXPROCS(0) && os.Getenv("SHUNT_PROXY_LOOP_HOLD_P") != "0"
		p.loops.loops = append(p.loops.loops, l)
		go l.run()
	}
	return nil
}

// eventLoopCount is SHUNT_PROXY_EVENT_LOOPS, else one fewer than the
// Ps: a P stays for everything else, and the loops wait holding theirs
// (epollWaitHoldingP). With one P, none: a loop that lets its P go at each
// wait made Go's monitor thread take it back and poll every 20 µs, and
// cost more than the goroutine per connection (BenchmarkProxyProcess,
// GOMAXPROCS=1: 80–114 µs per request against 56–62).
func eventLoopCount() int {
	if n, err := strconv.Atoi(os.Getenv("SHUNT_PROXY_EVENT_LOOPS")); err == nil && n >= 0 {
		return n
	}
	return runtime.GOMAXPROCS(0) - 1
}

// EventLoops is how many event loops serve the fast path.
func (p *Proxy) EventLoops() int { return len(p.loops.loops) }

// take gives c to a loop; false: c is left to its caller (no loop, or its
// socket could not be taken from Go's poller).
func (ls *eventLoops) take(c *clientConn) bool {
	if len(ls.loops) == 0 {
		return false
	}
	fd, err := detach(c.Conn)
	if err != nil {
		return false
	}
	l := ls.loops[int(ls.next.Add(1))%len(ls.loops)]
	l.live.Add(1)
	l.mu.Lock()
	l.incoming = append(l.incoming, &loopConn{fd: fd, cc: c})
	l.mu.Unlock()
	l.wake()
	return true
}

// live is how many connections the loops hold.
func (ls *eventLoops) live() int64 {
	var n int64
	for _, l := range ls.loops {
		n += l.live.Load()
	}
	return n
}

// wakeAll makes every loop look at the proxy's state (draining, closing).
func (ls *eventLoops) wakeAll() {
	for _, l := range ls.loops {
		l.wake()
	}
}

// detach takes c's socket out of Go's poller: a duplicate of its file
// descriptor (the same socket, still non-blocking) stays, c is closed
// (its poller registration goes with it).
func detach(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("duplicating a socket: %w", derr)
	}
	c.Close()
	return fd, nil
}

// eventLoop is one loop: its epoll set, and the connections in it, which
// only its goroutine touches (but for incoming and dialed, under mu).
type eventLoop struct {
	p      *Proxy
	epfd   int
	wakeFd int // an eventfd: new connections, dial results, shutdown
	live   atomic.Int64
	// closeAll: the proxy's shutdown ran out of time, close everything.
	closeAll, stop atomic.Bool
	stopped        chan struct{}
	// holdP: the loop waits holding its P while busy (epollWaitHoldingP),
	// when the loops leave a P for everything else.
	holdP bool

	mu       sync.Mutex
	incoming []*loopConn
	dialed   []dialResult

	clients   map[int]*loopConn
	upstreams map[int]*loopUpstream // in use and idle
	idle      map[loopUpstreamKey][]*loopUpstream
	scratch   []byte
	events    []unix.EpollEvent
	lastSweep time.Time
	// now is when the last epoll_wait returned: what the loop does for
	// its events happens then, as far as idle times and sweeps go (one
	// clock read per wait, not one per use).
	now time.Time
}

// loopUpstreamKey is a pool of upstream connections: the client's mark
// (its identity), the source address (original source of a steered
// client, upstream.go; invalid: the node's) and the backend.
type loopUpstreamKey struct {
	upstreamKey // the transports' key (upstream.go)
	addr        netip.AddrPort
}

type loopUpstream struct {
	fd         int
	key        loopUpstreamKey
	buf        []byte // its read buffer while in use; start:end unread
	start, end int
	reused     bool
	// hup: the backend closed its side; with edge-triggered events,
	// nothing will say so again: read to the end.
	hup       bool
	idleSince time.Time
	owner     *loopConn // the client whose request it serves; nil: idle
}

type dialResult struct {
	c   *loopConn
	fd  int
	err error
}

type respPhase int

const (
	phaseHead    respPhase = iota // waiting for the response head
	phaseLength                   // Content-Length: remaining bytes
	phaseChunked                  // chunked: the scanner says where it ends
	phaseToEOF                    // until the upstream closes
	phaseDone                     // the response is whole (or the proxy answered)
)

// loopConn is a client connection in a loop, and its request in flight.
type loopConn struct {
	fd         int
	cc         *clientConn
	lastActive time.Time
	busy       bool // a request in flight, or its answer not yet written
	closed     bool

	req     fastRequest
	resp    fastResponse
	x       *exchange
	mark    uint32
	out     []byte // the upstream request, kept until its response comes (a retry sends it again)
	outOff  int
	wrote   bool // a byte of out went out
	got     bool // a byte of the response came
	dialing bool
	up      *loopUpstream
	phase   respPhase
	left    int64 // phaseLength
	chunks  chunkScanner
	cout    []byte // owed to the client from cout[coutOff:]
	coutOff int
	// pending: the client sent more while its request was in flight: the
	// connection goes to the goroutine path after the response.
	pending    bool
	closeAfter bool // the client's connection ends with this response
}

var upstreamBuffers = sync.Pool{New: func() any { return new([upstreamBufferSize]byte) }}

func newEventLoop(p *Proxy) (*eventLoop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating the event loop's epoll set: %w", err)
	}
	wakeFd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("creating the event loop's eventfd: %w", err)
	}
	l := &eventLoop{p: p, epfd: epfd, wakeFd: wakeFd, stopped: make(chan struct{}),
		clients: map[int]*loopConn{}, upstreams: map[int]*loopUpstream{}, idle: map[loopUpstreamKey][]*loopUpstream{},
		scratch: make([]byte, loopReadSize), events: make([]unix.EpollEvent, loopMaxEvents), lastSweep: time.Now()}
	if err := l.add(wakeFd, unix.EPOLLIN); err != nil {
		unix.Close(epfd)
		unix.Close(wakeFd)
		return nil, err
	}
	return l, nil
}

// epollWaitHoldingP is epoll_wait without telling Go's scheduler: the
// loop's thread keeps its P while it waits. unix.EpollWait enters a
// system call the scheduler's way, and at this load (each event reaching
// an idle process) that made Go's monitor thread take the P back and poll
// every 20 µs (perf: a fifth of the loop's CPU). A P held in a raw call
// still yields to a stop-the-world or a preemption: their signal ends
// epoll_wait with EINTR, and the loop goes back through Go code. Only for
// short waits while busy (holdPWait), and only when other Ps remain.
func epollWaitHoldingP(epfd int, events []unix.EpollEvent, msec int) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// add puts fd in the epoll set, edge-triggered.
func (l *eventLoop) add(fd int, events uint32) error {
	ev := unix.EpollEvent{Events: events | unix.EPOLLET, Fd: int32(fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("adding a socket to the event loop: %w", err)
	}
	return nil
}

const sockEvents = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP

func (l *eventLoop) wake() {
	one := uint64(1)
	unix.Write(l.wakeFd, (*[8]byte)(unsafe.Pointer(&one))[:])
}

// run waits in epoll_wait (a blocking system call: the P goes to other
// goroutines while it waits) and handles what comes, until stopped.
func (l *eventLoop) run() {
	defer close(l.stopped)
	yielded := time.Now()
	l.now = yielded
	quiet := false // the last wait holding the P timed out: the next one lets it go
	for !l.stop.Load() {
		// Go's monitor thread preempts a goroutine it has seen on one
		// scheduling tick for 10 ms (and takes its P if it is in a system
		// call, then polls every 20 µs for a while): a loop that only
		// ever waits in epoll_wait passes through the scheduler itself,
		// just before (each pass wakes another thread: not more often).
		if l.now.Sub(yielded) > yieldEvery {
			runtime.Gosched()
			yielded = l.now
		}
		var n int
		var err error
		if l.holdP && !quiet {
			n, err = epollWaitHoldingP(l.epfd, l.events, int(holdPWait/time.Millisecond))
			quiet = n == 0 && err == nil
		} else {
			n, err = unix.EpollWait(l.epfd, l.events, int(loopTick/time.Millisecond))
			quiet = false
		}
		l.now = time.Now()
		if err != nil && err != unix.EINTR {
			l.p.log.Error("event loop: epoll_wait", "err", err)
			time.Sleep(loopTick)
			continue
		}
		for _, ev := range l.events[:max(n, 0)] {
			fd := int(ev.Fd)
			if fd == l.wakeFd {
				var b [8]byte
				unix.Read(l.wakeFd, b[:])
				l.takeNew()
			} else if c := l.clients[fd]; c != nil {
				l.onClient(c, ev.Events)
			} else if u := l.upstreams[fd]; u != nil {
				l.onUpstream(u, ev.Events)
			}
		}
		if l.now.Sub(l.lastSweep) >= loopTick || l.p.draining.Load() {
			l.sweep(l.now)
		}
	}
	l.shut()
}

// takeNew registers the new connections and handles the dial results.
func (l *eventLoop) takeNew() {
	l.mu.Lock()
	incoming, dialed := l.incoming, l.dialed
	l.incoming, l.dialed = nil, nil
	l.mu.Unlock()
	for _, c := range incoming {
		c.lastActive = l.now
		if err := l.add(c.fd, sockEvents); err != nil {
			l.p.log.Warn("event loop", "err", err)
			unix.Close(c.fd)
			c.cc.Close()
			l.live.Add(-1)
			continue
		}
		l.clients[c.fd] = c
		// Bytes that came before the registration raised no edge: read.
		l.readRequest(c)
	}
	for _, d := range dialed {
		l.dialDone(d)
	}
}

func (l *eventLoop) onClient(c *loopConn, ev uint32) {
	if !c.busy {
		if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			l.readRequest(c)
			// A client that sent its request and shut its side: answered,
			// then closed (no later event would say it left).
			if ev&unix.EPOLLRDHUP != 0 && c.busy {
				c.closeAfter = true
			}
		}
		return
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		l.clientGone(c)
		return
	}
	if ev&unix.EPOLLIN != 0 {
		c.pending = true
	}
	if ev&unix.EPOLLOUT != 0 && c.coutOff < len(c.cout) && l.flushClient(c) && c.up != nil {
		l.readUpstream(c) // it stopped while the output was not drained
	}
}

// readRequest reads what the idle client sent, and serves it if it is one
// whole request the loop takes.
func (l *eventLoop) readRequest(c *loopConn) {
	n, err := rawRead(uintptr(c.fd), l.scratch)
	switch {
	case err == unix.EAGAIN:
		return
	case err != nil:
		l.closeClient(c)
		return
	}
	c.lastActive = l.now
	buf := l.scratch[:n]
	hn, st := findHead(buf)
	if reason, ok := l.takes(c, buf, hn, st); !ok {
		l.handOff(c, buf, reason)
		return
	}
	p := l.p
	t := p.table.Load()
	// A request whose route has filters the loop does not apply
	// (headedit.go applies the usual ones) goes to net/http's path.
	if t.needsFilters(c.cc.orig, c.cc.remote, &c.req.req) {
		l.handOff(c, buf, handoffFilters)
		return
	}
	if svc := t.byVIP[c.cc.orig]; svc != nil && svc.needsTimers() {
		l.handOff(c, buf, handoffTimers)
		return
	}
	p.stats.requests.Add(1)
	p.loops.served.Add(1)
	r := &c.req.req
	x := t.newExchange(r, c.cc)
	c.x, c.busy, c.phase, c.got, c.wrote, c.outOff = x, true, phaseHead, false, false, 0
	c.closeAfter = c.req.close
	mark, ref := x.decide(r)
	if ref != nil {
		x.refuse(ref)
		l.answer(c, ref.status, ref.msg)
		return
	}
	if x.target.redirects() { // the rule's redirect: the proxy answers (headedit.go)
		c.cout, x.status = x.appendRedirect(c.cout, &c.req, c.req.close)
		c.phase = phaseDone
		l.flushClient(c)
		return
	}
	x.up = p.up.get(mark, c.cc.upstreamSource())
	x.backend = x.target.pick()
	rule, ref := t.judge(x.peer, x.backend, r)
	x.policyRule = rule
	if ref != nil {
		x.refused, x.status = ref, ref.status
		l.answer(c, ref.status, ref.msg)
		return
	}
	c.mark = mark
	c.out = append(c.req.appendUpstreamHead(c.out[:0], &x.target), buf[hn:]...)
	l.connect(c)
}

// needsTimers says whether a request to s may meet a route timeout or
// retries, which the loop leaves to the goroutine path.
func (s *service) needsTimers() bool {
	for _, m := range s.routes {
		if m.rule.timeout > 0 || m.rule.retry != nil {
			return true
		}
	}
	return false
}

// poolKey is the pool of c's request's upstream connection: its mark,
// its source (original source of a steered client) and its backend.
func (c *loopConn) poolKey() loopUpstreamKey {
	return loopUpstreamKey{upstreamKey{c.mark, c.cc.upstreamSource()}, c.x.backend.addr}
}

// connect gives c an idle upstream connection of its mark to its backend,
// or dials one (in a goroutine: a connect may take long; the result comes
// back through the eventfd).
func (l *eventLoop) connect(c *loopConn) {
	key := c.poolKey()
	// As the goroutine path: a request that could not be sent again must
	// not meet a connection the backend closed while idle.
	check := !(c.req.contentLength == 0 && replayableMethod(&c.req.req))
	for list := l.idle[key]; len(list) > 0; list = l.idle[key] {
		u := list[len(list)-1]
		list[len(list)-1] = nil
		l.idle[key] = list[:len(list)-1]
		if l.now.Sub(u.idleSince) < fastIdleTimeout && !(check && socketClosed(u.fd)) {
			u.reused = true
			l.attach(c, u)
			l.sendRequest(c)
			return
		}
		l.closeUpstream(u)
	}
	c.dialing = true
	dial := c.x.up.fast.dial
	addr := key.addr.String()
	go func() {
		d := dialResult{c: c, fd: -1}
		conn, err := dial(context.Background(), "tcp", addr)
		if err == nil {
			if d.fd, err = detach(conn); err != nil {
				conn.Close()
			}
		}
		d.err = err
		l.mu.Lock()
		l.dialed = append(l.dialed, d)
		l.mu.Unlock()
		l.wake()
	}()
}

func (l *eventLoop) dialDone(d dialResult) {
	c := d.c
	c.dialing = false
	if d.err == nil && c.closed {
		unix.Close(d.fd)
		return
	}
	if c.closed {
		return
	}
	if d.err != nil {
		l.answerFailure(c, d.err)
		return
	}
	u := &loopUpstream{fd: d.fd, key: c.poolKey()}
	if err := l.add(d.fd, sockEvents); err != nil {
		unix.Close(d.fd)
		l.answerFailure(c, err)
		return
	}
	l.upstreams[d.fd] = u
	l.attach(c, u)
	l.sendRequest(c)
}

func (l *eventLoop) attach(c *loopConn, u *loopUpstream) {
	c.up, u.owner = u, c
	if u.buf == nil {
		u.buf = upstreamBuffers.Get().(*[upstreamBufferSize]byte)[:]
	}
	u.start, u.end = 0, 0
}

// sendRequest writes what is left of the request; the rest waits for
// EPOLLOUT.
func (l *eventLoop) sendRequest(c *loopConn) {
	u := c.up
	for c.outOff < len(c.out) {
		n, err := rawWrite(uintptr(u.fd), c.out[c.outOff:])
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			l.upstreamFailed(c, os.NewSyscallError("write", err))
			return
		}
		c.outOff += n
		c.wrote = true
	}
}

func (l *eventLoop) onUpstream(u *loopUpstream, ev uint32) {
	c := u.owner
	if c == nil { // idle: the backend closed it, or sent what nobody asked for
		if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			l.dropIdle(u)
		}
		return
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		u.hup = true
	}
	if ev&unix.EPOLLOUT != 0 && c.outOff < len(c.out) {
		l.sendRequest(c)
	}
	if c.up == u && ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		l.readUpstream(c)
	}
}

// readUpstream reads the response and passes it on, until the socket is
// empty, the response ends, or the client's output is not drained.
func (l *eventLoop) readUpstream(c *loopConn) {
	for c.up != nil && c.coutOff == len(c.cout) && c.phase != phaseDone {
		u := c.up
		if u.start > 0 {
			u.end = copy(u.buf, u.buf[u.start:u.end])
			u.start = 0
		}
		space := len(u.buf) - u.end
		if space == 0 { // a response head or chunk line longer than the buffer
			l.responseFailed(c, fmt.Errorf("the response head is longer than the proxy's %d bytes", len(u.buf)))
			return
		}
		n, err := rawRead(uintptr(u.fd), u.buf[u.end:])
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			l.upstreamEnded(c, err)
			return
		}
		u.end += n
		c.got = true
		if err := l.passResponse(c); err != nil {
			l.responseFailed(c, err)
			return
		}
		if !l.flushClient(c) || c.phase == phaseDone || n < space && !u.hup {
			return // (a read short of the space emptied the socket: edge-triggered, the next bytes raise an event)
		}
	}
}

// passResponse moves what the upstream buffer holds of the response to
// the client's output.
func (l *eventLoop) passResponse(c *loopConn) error {
	u := c.up
	for u.start < u.end && c.phase != phaseDone {
		data := u.buf[u.start:u.end]
		switch c.phase {
		case phaseHead:
			n, st := findHead(data)
			switch st {
			case headRefused:
				return errBadResponse
			case headIncomplete:
				return nil
			}
			if err := c.resp.parse(data[:n]); err != nil {
				return err
			}
			if c.resp.status/100 == 1 {
				if c.resp.status == http.StatusSwitchingProtocols {
					return errors.New("101 Switching Protocols to a request without Upgrade")
				}
				c.cout = append(c.cout, data[:n]...) // 1xx: passed on as is
				u.start += n
				continue
			}
			resp := &c.resp
			noBody := bodyless(c.req.req.Method, resp.status)
			toEOF := !noBody && !resp.chunked && resp.contentLength < 0
			c.closeAfter = c.closeAfter || toEOF
			c.cout = resp.appendHead(c.cout, c.x.target.responseEdit(), c.req.close || toEOF)
			c.x.status = resp.status
			u.start += n
			switch {
			case noBody, resp.contentLength == 0 && !resp.chunked:
				c.phase = phaseDone
			case resp.chunked:
				c.phase, c.chunks = phaseChunked, chunkScanner{line: c.chunks.line[:0]}
			case toEOF:
				c.phase, resp.close = phaseToEOF, true
			default:
				c.phase, c.left = phaseLength, resp.contentLength
			}
		case phaseLength:
			k := int(min(int64(len(data)), c.left))
			c.cout = append(c.cout, data[:k]...)
			u.start += k
			if c.left -= int64(k); c.left == 0 {
				c.phase = phaseDone
			}
		case phaseChunked:
			k, done, err := c.chunks.scan(data)
			c.cout = append(c.cout, data[:k]...)
			u.start += k
			if err != nil {
				return err
			}
			if done {
				c.phase = phaseDone
			}
		case phaseToEOF:
			c.cout = append(c.cout, data...)
			u.start = u.end
		}
	}
	return nil
}

// upstreamEnded is a read of the upstream that failed or found its end.
func (l *eventLoop) upstreamEnded(c *loopConn, err error) {
	switch {
	case c.phase == phaseHead:
		l.upstreamFailed(c, err)
	case c.phase == phaseToEOF && err == io.EOF:
		c.phase = phaseDone
		l.flushClient(c)
	default:
		l.responseFailed(c, err)
	}
}

// responseFailed: the response went wrong; before its head reached the
// output, as a failed attempt, after it as a response that broke off.
func (l *eventLoop) responseFailed(c *loopConn, err error) {
	if c.phase == phaseHead {
		l.upstreamFailed(c, err)
		return
	}
	c.x.brokeOff(false)
	l.abort(c)
}

// upstreamFailed is an attempt that got no response head: the request
// goes again on a new connection when the goroutine path would send it
// again (the connection was reused, and nothing was written, or nothing
// was read and the request is bodyless and idempotent), else the client
// gets the error.
func (l *eventLoop) upstreamFailed(c *loopConn, err error) {
	u := c.up
	c.up = nil
	l.closeUpstream(u)
	retry := u.reused && (!c.wrote || !c.got && c.req.contentLength == 0 && replayableMethod(&c.req.req))
	if retry {
		c.outOff, c.wrote, c.got = 0, false, false
		l.connect(c)
		return
	}
	l.answerFailure(c, err)
}

func (l *eventLoop) answerFailure(c *loopConn, err error) {
	code := c.x.failed(err, false, false)
	l.answer(c, code, c.x.err)
}

// answer is the proxy's own response to the request in flight.
func (l *eventLoop) answer(c *loopConn, code int, msg string) {
	c.cout = appendHTTPError(c.cout, code, msg, c.req.close)
	c.phase = phaseDone
	l.flushClient(c)
}

// flushClient writes what the client is owed; drained says it all went.
// A response whole and written ends the exchange; a drained output
// resumes the upstream's reads.
func (l *eventLoop) flushClient(c *loopConn) (drained bool) {
	for c.coutOff < len(c.cout) {
		n, err := rawWrite(uintptr(c.fd), c.cout[c.coutOff:])
		if err == unix.EAGAIN {
			return false
		}
		if err != nil {
			l.clientGone(c)
			return false
		}
		c.coutOff += n
	}
	c.cout, c.coutOff = c.cout[:0], 0
	if c.phase == phaseDone {
		l.complete(c)
		return true
	}
	return true
}

// complete ends an exchange whose answer is written: its flow, its
// upstream connection back to the pool (when the response ended cleanly),
// and the client's connection kept, closed, or handed to the goroutine
// path when it sent more in the meantime.
func (l *eventLoop) complete(c *loopConn) {
	l.p.finish(c.x)
	c.x, c.busy = nil, false
	// An idle connection keeps small buffers only: thousands of idle
	// clients must not hold a large body's worth each.
	if cap(c.cout) > 4<<10 {
		c.cout = nil
	}
	if cap(c.out) > 4<<10 {
		c.out = nil
	}
	if u := c.up; u != nil {
		c.up = nil
		if c.resp.close || u.start != u.end || u.hup {
			l.closeUpstream(u)
		} else {
			l.pool(u)
		}
	}
	switch {
	case c.closeAfter || l.p.draining.Load():
		l.closeClient(c)
	case c.pending:
		l.handOff(c, nil, handoffPipelined)
	}
}

// clientGone: the client closed, reset, or could not be written to, with
// its request in flight.
func (l *eventLoop) clientGone(c *loopConn) {
	if c.x != nil && c.x.status == 0 {
		c.x.failed(errClientGone, true, false)
	} else if c.x != nil && c.x.refused == nil && c.x.reason == "" {
		c.x.brokeOff(true)
	}
	l.abort(c)
}

// abort ends the exchange in flight and both connections.
func (l *eventLoop) abort(c *loopConn) {
	if c.x != nil {
		l.p.finish(c.x)
		c.x = nil
	}
	if u := c.up; u != nil {
		c.up = nil
		l.closeUpstream(u)
	}
	l.closeClient(c)
}

func (l *eventLoop) closeClient(c *loopConn) {
	if c.closed {
		return
	}
	c.closed, c.busy = true, false
	delete(l.clients, c.fd)
	unix.Close(c.fd)
	c.cc.Close() // its Go socket is closed already: this counts it
	l.live.Add(-1)
}

// takes says whether the loop serves what one read of an idle client
// brought (buf; findHead's hn and st): one whole plain request; else why
// not. It parses the head into c.req.
func (l *eventLoop) takes(c *loopConn, buf []byte, hn int, st headStatus) (reason handoffReason, ok bool) {
	switch {
	case len(buf) == len(l.scratch):
		return handoffTooLong, false
	case st == headIncomplete:
		return handoffHeadInPieces, false
	case st == headRefused || !c.req.parse(string(buf[:hn])):
		return handoffNotPlain, false
	case int64(len(buf)-hn) < c.req.contentLength:
		return handoffBodyInPieces, false
	case int64(len(buf)-hn) > c.req.contentLength:
		return handoffPipelined, false
	}
	return 0, true
}

// handOff gives the connection to the goroutine path with the bytes read.
func (l *eventLoop) handOff(c *loopConn, read []byte, reason handoffReason) {
	delete(l.clients, c.fd)
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
	c.closed = true
	l.live.Add(-1)
	f := os.NewFile(uintptr(c.fd), "client")
	conn, err := net.FileConn(f) // a duplicate, in Go's poller
	f.Close()
	if err != nil {
		l.p.log.Warn("event loop: handing a connection to the goroutine path", "err", err)
		c.cc.Close()
		return
	}
	c.cc.Conn = conn
	l.p.stats.handoffs.add(pathLoop, reason)
	go l.p.serveConnWith(c.cc, slices.Clone(read))
}

// pool keeps an upstream connection whose response ended cleanly.
func (l *eventLoop) pool(u *loopUpstream) {
	u.owner, u.reused = nil, false
	upstreamBuffers.Put((*[upstreamBufferSize]byte)(u.buf))
	u.buf = nil
	if list := l.idle[u.key]; len(list) < fastMaxIdlePerBackend {
		u.idleSince = l.now
		l.idle[u.key] = append(list, u)
		return
	}
	l.closeUpstream(u)
}

// dropIdle closes an idle upstream connection and takes it off its pool.
func (l *eventLoop) dropIdle(u *loopUpstream) {
	list := l.idle[u.key]
	if i := slices.Index(list, u); i >= 0 {
		l.idle[u.key] = slices.Delete(list, i, i+1)
	}
	l.closeUpstream(u)
}

func (l *eventLoop) closeUpstream(u *loopUpstream) {
	delete(l.upstreams, u.fd)
	unix.Close(u.fd)
	u.owner = nil
	if u.buf != nil {
		upstreamBuffers.Put((*[upstreamBufferSize]byte)(u.buf))
		u.buf = nil
	}
}

// sweep closes what timed out: clients idle for idleTimeout, idle
// upstream connections older than fastIdleTimeout or of a mark no client
// has any more; while the proxy drains, idle clients; when its shutdown
// runs out of time, every connection.
func (l *eventLoop) sweep(now time.Time) {
	l.lastSweep = now
	draining, all := l.p.draining.Load(), l.closeAll.Load()
	for _, c := range l.clients {
		switch {
		case all:
			if c.x != nil {
				c.x.brokeOff(false)
			}
			l.abort(c)
		case !c.busy && (draining || now.Sub(c.lastActive) >= idleTimeout):
			l.closeClient(c)
		}
	}
	kept := l.p.up.keys()
	for key, list := range l.idle {
		live := list[:0]
		for _, u := range list {
			if now.Sub(u.idleSince) >= fastIdleTimeout || !kept[key.upstreamKey] || draining {
				l.closeUpstream(u)
			} else {
				live = append(live, u)
			}
		}
		clear(list[len(live):])
		l.idle[key] = live
	}
}

// shut closes what is left when the loop stops.
func (l *eventLoop) shut() {
	for _, c := range l.clients {
		l.abort(c)
	}
	for _, u := range l.upstreams {
		l.closeUpstream(u)
	}
	unix.Close(l.epfd)
	unix.Close(l.wakeFd)
}

// chunkScanner finds where a chunked body ends, as it passes: chunk
// lines, data, the last chunk and its trailer fields, checked as the
// goroutine path checks them.
type chunkScanner struct {
	state chunkState
	left  int64  // of the chunk's data
	line  []byte // the line so far (a size line or a trailer line)
}

type chunkState int

const (
	chunkSizeLine chunkState = iota
	chunkData
	chunkDataEnd // the CRLF after a chunk's data
	chunkTrailer
)

// scan consumes b: n of its bytes belong to the body, done says the body
// ended there.
func (s *chunkScanner) scan(b []byte) (n int, done bool, err error) {
	for n < len(b) {
		switch s.state {
		case chunkData:
			k := int(min(int64(len(b)-n), s.left))
			n += k
			if s.left -= int64(k); s.left == 0 {
				s.state = chunkDataEnd
			}
		case chunkDataEnd:
			s.line = append(s.line, b[n])
			n++
			if len(s.line) == 2 {
				if s.line[0] != '\r' || s.line[1] != '\n' {
					return n, false, errors.New("chunk data not followed by CRLF")
				}
				s.state, s.line = chunkSizeLine, s.line[:0]
			}
		default: // a line
			i := slices.Index(b[n:], '\n')
			if i < 0 {
				s.line = append(s.line, b[n:]...)
				n = len(b)
				if len(s.line) > maxChunkLine {
					return n, false, errors.New("a chunk line longer than the proxy's buffer")
				}
				return n, false, nil
			}
			s.line = append(s.line, b[n:n+i+1]...)
			n += i + 1
			line := s.line
			s.line = s.line[:0]
			if len(line) < 2 || line[len(line)-2] != '\r' {
				return n, false, errors.New("a chunk line not ending in CRLF")
			}
			if s.state == chunkTrailer {
				if len(line) == 2 {
					return n, true, nil
				}
				continue
			}
			size, err := parseChunkSize(line[:len(line)-2])
			if err != nil {
				return n, false, err
			}
			if size == 0 {
				s.state = chunkTrailer
			} else {
				s.state, s.left = chunkData, size
			}
		}
	}
	return n, false, nil
}

// drain waits until the loops hold no connection (the proxy is draining:
// idle ones are closed, busy ones after their response), then stops them;
// when ctx ends first, every connection is closed.
func (ls *eventLoops) drain(ctx context.Context) error {
	ls.wakeAll()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var err error
	for ls.live() > 0 && err == nil {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-tick.C:
			ls.wakeAll()
		}
	}
	for _, l := range ls.loops {
		l.closeAll.Store(err != nil)
		l.stop.Store(true)
		l.wake()
	}
	for _, l := range ls.loops {
		<-l.stopped
	}
	return err
}
