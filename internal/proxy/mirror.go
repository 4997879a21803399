package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

// Request mirroring (the Gateway API's HTTPRequestMirrorFilter): a copy of
// a rule's request goes to a backend of each of its mirror Services, for
// the share of requests each asks; the copy's response is read and thrown
// away, and the client's request never waits for it. Rules with mirrors
// take net/http's path (rule.slowFilters), which holds the request as a
// Request: the copy is the upstream request as the rule's filters made it.
//
// A copy needs the request's body twice. A body the proxy keeps anyway
// for a retry (none, or a known length up to maxReplay) is sent again
// from memory. Any other (a streamed upload, every gRPC call) is teed: as
// the upstream request reads it, each copy's pipe gets what was read
// (teeBody), and the copy's transport reads it from there. The client's
// request never waits for a copy: a pipe that falls more than
// maxMirrorLag behind (a mirror slower than the backend) is cut, its copy
// ended with an error (counted "fell-behind"), and a copy whose request
// ends before its body was read through (refused, failed) is ended too.
// The copy carries the client's identity in its mark, as the request
// does, so L3/L4 policy judges it as the client, and the mirror port's
// HTTP rules are asked first.

const (
	// maxMirrorsInFlight bounds the copies on their way at once: a slow
	// or silent mirror costs the proxy no more than this many requests'
	// memory, and copies beyond it are not sent (counted "busy").
	maxMirrorsInFlight = 256
	// mirrorTimeout bounds one copy, its response included.
	mirrorTimeout = 10 * time.Second
	// maxMirrorDrain is the most of a copy's response read (so its
	// connection can be reused); a longer one closes its connection.
	maxMirrorDrain = 256 << 10
	// maxMirrorLag is the most of a streamed body a copy may hold unsent
	// (what the backend has read and the mirror not yet).
	maxMirrorLag = 256 << 10
)

// ruleMirror is one mirror of a rule: a service port and the share of
// requests copied to it.
type ruleMirror struct {
	svc     *service
	label   string  // namespace/name:port, for metrics
	percent float64 // 0-100
}

// What became of a copy, the outcome label of
// shunt_proxy_mirrored_requests_total.
const (
	mirrorAnswered    = "answered"      // the mirror answered (any status)
	mirrorFailed      = "failed"        // no answer: connect error, reset, timeout
	mirrorFellBehind  = "fell-behind"   // a streamed body's copy cut: the mirror read it too slowly
	mirrorBusy        = "busy"          // maxMirrorsInFlight copies already on their way
	mirrorNoEndpoints = "no-endpoints"  // the mirror Service has no ready endpoint
	mirrorDenied      = "policy-denied" // the mirror port's HTTP rules refuse the client
)

// mirror sends copies of out, the upstream request (URL and Host as the
// rule's filters made them), to the rule's mirrors the dice choose. body
// gives the request's body again for each copy: from memory, or a pipe of
// out's teed body (teeBody.copy).
func (p *Proxy) mirror(x *exchange, out *http.Request, body func() io.ReadCloser) {
	rl := x.target.rule
	mark, _ := x.t.cfg.Mark.For(x.peer.Identity) // decide made sure it fits
	for i := range rl.mirrors {
		m := &rl.mirrors[i]
		if m.percent < 100 && rand.Float64()*100 >= m.percent {
			continue
		}
		outcome := func(o string) { p.metrics.mirrored.WithLabelValues(rl.route, m.label, o).Inc() }
		b, ok := m.svc.pick()
		if !ok {
			outcome(mirrorNoEndpoints)
			continue
		}
		if _, ref := x.t.judge(x.peer, b, x.req); ref != nil {
			outcome(mirrorDenied)
			continue
		}
		select {
		case p.mirrorSlots <- struct{}{}:
		default:
			outcome(mirrorBusy)
			continue
		}
		// The node's address, not a steered client's own (upstreamSource):
		// a steered connection's replies are caught only at a local pod's
		// veth, and a mirror may be anywhere.
		up := p.up.get(mark, netip.Addr{})
		tr := up.h1
		if x.req.ProtoMajor == 2 {
			tr = up.h2
		}
		ctx, cancel := context.WithTimeout(context.Background(), mirrorTimeout)
		req := out.Clone(ctx)
		reqBody := body()
		req.Body = reqBody
		req.URL.Host = b.addr.String()
		fl := x.copyFlow(out, b)
		go func() {
			defer func() { cancel(); <-p.mirrorSlots }()
			resp, err := tr.RoundTrip(req)
			if err != nil {
				if pipe, ok := reqBody.(*mirrorPipe); ok && pipe.fellBehind() {
					outcome(mirrorFellBehind)
				} else {
					outcome(mirrorFailed)
				}
				fl.HTTP.Error = err.Error()
			} else {
				io.Copy(io.Discard, io.LimitReader(resp.Body, maxMirrorDrain))
				resp.Body.Close()
				outcome(mirrorAnswered)
				fl.HTTP.Status = resp.StatusCode
			}
			fl.HTTP.LatencyMicros = time.Since(fl.Time).Microseconds()
			p.flows.publish(fl)
		}()
	}
}

// copyFlow is the flow record of a copy of out sent to b: the request's,
// from the client to the mirror's backend, its reason flows.ReasonMirrored.
// Made before the copy leaves, as x is the request's and may be reused
// once it is answered; the copy's goroutine fills in the outcome.
func (x *exchange) copyFlow(out *http.Request, b backend) flows.Flow {
	fl := x.httpFlow(out, flows.ReasonMirrored)
	fl.Time = time.Now()
	x.toBackend(&fl, b)
	return fl
}

// errMirrorFellBehind ends a copy whose mirror read its body too slowly.
var errMirrorFellBehind = fmt.Errorf("the mirror fell more than %d KiB behind the request's body: copy cut", maxMirrorLag>>10)

// errRequestEnded ends a copy whose request ended before its body was
// read through (refused, failed, the client gone).
var errRequestEnded = errors.New("the mirrored request ended before its body was read through")

// teeBody is a request body that hands what is read from it to copies'
// pipes as well, without ever waiting for them.
type teeBody struct {
	src    io.ReadCloser
	mu     sync.Mutex
	copies []*mirrorPipe
	ended  bool
}

// teeRequestBody replaces out's body with a teeBody and returns it.
func teeRequestBody(out *http.Request) *teeBody {
	t := &teeBody{src: out.Body}
	out.Body = t
	return t
}

// copy is a new copy's body: what is read from the tee from now on
// (before the request's transport reads anything, as mirror calls it).
func (t *teeBody) copy() io.ReadCloser {
	c := &mirrorPipe{}
	c.cond.L = &c.mu
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		c.end(errRequestEnded)
	}
	t.copies = append(t.copies, c)
	return c
}

func (t *teeBody) Read(b []byte) (int, error) {
	n, err := t.src.Read(b)
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.copies {
		c.write(b[:n])
	}
	if err != nil {
		t.endCopies(err)
	}
	return n, err
}

// Close ends the copies that did not see the body's end: a request's
// transport closes its body when it is done with it, read through or not.
func (t *teeBody) Close() error {
	t.mu.Lock()
	t.endCopies(errRequestEnded)
	t.mu.Unlock()
	return t.src.Close()
}

// endCopies ends every copy once: at the body's end (io.EOF: the copies
// end as well) or with err. Called with t.mu held.
func (t *teeBody) endCopies(err error) {
	if t.ended {
		return
	}
	t.ended = true
	if err == io.EOF {
		err = nil
	}
	for _, c := range t.copies {
		c.end(err)
	}
}

// mirrorPipe is one copy's body: what the tee wrote, read by the copy's
// transport, at most maxMirrorLag unread.
type mirrorPipe struct {
	mu     sync.Mutex
	cond   sync.Cond
	buf    []byte
	ended  bool  // no more writes
	err    error // after buf: nil for the body's end
	closed bool  // the copy's transport is done with it
	behind bool  // cut for falling behind
}

func (c *mirrorPipe) write(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended || c.closed || len(b) == 0 {
		return
	}
	if len(c.buf)+len(b) > maxMirrorLag {
		c.behind = true
		c.buf = nil
		c.endLocked(errMirrorFellBehind)
		return
	}
	c.buf = append(c.buf, b...)
	c.cond.Broadcast()
}

func (c *mirrorPipe) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endLocked(err)
}

func (c *mirrorPipe) endLocked(err error) {
	if !c.ended {
		c.ended, c.err = true, err
		c.cond.Broadcast()
	}
}

func (c *mirrorPipe) Read(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) == 0 && !c.ended && !c.closed {
		c.cond.Wait()
	}
	switch {
	case c.closed:
		return 0, io.ErrClosedPipe
	case len(c.buf) > 0:
		n := copy(b, c.buf)
		c.buf = c.buf[n:]
		if len(c.buf) == 0 {
			c.buf = nil // the next write starts a fresh array, not one that grows on
		}
		return n, nil
	case c.err != nil:
		return 0, c.err
	}
	return 0, io.EOF
}

// Close is the copy's transport's: done with the body (sent, or given up
// on); what the tee writes from now on is dropped.
func (c *mirrorPipe) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed, c.buf = true, nil
	c.cond.Broadcast()
	return nil
}

func (c *mirrorPipe) fellBehind() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.behind
}
