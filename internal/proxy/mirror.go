package proxy

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"time"
)

// Request mirroring (the Gateway API's HTTPRequestMirrorFilter): a copy of
// a rule's request goes to a backend of each of its mirror Services, for
// the share of requests each asks; the copy's response is read and thrown
// away, and the client's request never waits for it. Rules with mirrors
// take net/http's path (rule.slowFilters), which holds the request as a
// Request: the copy is the upstream request as the rule's filters made it.
//
// A copy needs the request's body twice, so only bodies the proxy keeps
// anyway for a retry are copied: none, or a known length up to maxReplay.
// Streamed bodies (chunked uploads, gRPC) are not mirrored, and counted.
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
	mirrorBodyNotKept = "body-not-kept" // a streamed body, or one over maxReplay
	mirrorBusy        = "busy"          // maxMirrorsInFlight copies already on their way
	mirrorNoEndpoints = "no-endpoints"  // the mirror Service has no ready endpoint
	mirrorDenied      = "policy-denied" // the mirror port's HTTP rules refuse the client
)

// mirror sends copies of out, the upstream request (URL and Host as the
// rule's filters made them), to the rule's mirrors the dice choose. body
// gives the request's body again (nil: it was not kept).
func (p *Proxy) mirror(x *exchange, out *http.Request, body func() io.ReadCloser) {
	rl := x.target.rule
	mark, _ := x.t.cfg.Mark.For(x.peer.Identity) // decide made sure it fits
	for i := range rl.mirrors {
		m := &rl.mirrors[i]
		if m.percent < 100 && rand.Float64()*100 >= m.percent {
			continue
		}
		outcome := func(o string) { p.metrics.mirrored.WithLabelValues(rl.route, m.label, o).Inc() }
		if body == nil {
			outcome(mirrorBodyNotKept)
			continue
		}
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
		req.Body = body()
		req.URL.Host = b.addr.String()
		go func() {
			defer func() { cancel(); <-p.mirrorSlots }()
			resp, err := tr.RoundTrip(req)
			if err != nil {
				outcome(mirrorFailed)
				return
			}
			io.Copy(io.Discard, io.LimitReader(resp.Body, maxMirrorDrain))
			resp.Body.Close()
			outcome(mirrorAnswered)
		}()
	}
}
