package proxy

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// serveHTTP handles one request: the client's identity must fit the
// upstream mark, the original destination and routes give the target,
// and the reverse proxy does the rest (forward.go). Whatever happens, the
// request ends as one flow record and its metrics.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	p.stats.requests.Add(1)
	t := p.table.Load()
	x := t.newExchange(r, r.Context().Value(connKey{}).(*clientConn))
	defer func() {
		v := recover()
		if v != nil {
			x.aborted() // the reverse proxy gave up on a response it had begun
		}
		p.finish(x)
		if v != nil {
			panic(v) // http.ErrAbortHandler: the server resets the stream
		}
	}()

	mark, ref := x.decide(r)
	if ref != nil {
		p.refuse(w, x, ref)
		return
	}
	if x.target.redirects() {
		p.redirect(w, r, x)
		return
	}
	x.up = p.up.get(mark, x.conn.upstreamSource())
	ctx := context.WithValue(r.Context(), exchangeKey{}, x)
	if rl := x.target.rule; rl != nil && rl.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rl.timeout)
		defer cancel()
	}
	p.forward.ServeHTTP(w, r.WithContext(ctx))
}

// decide is what both paths ask first: the client's identity must fit the
// upstream mark, and the original destination and routes give the target.
func (x *exchange) decide(r *http.Request) (mark uint32, ref *refusal) {
	t := x.t
	mark, ok := t.cfg.Mark.For(x.peer.Identity)
	if !ok {
		return 0, &refusal{status: http.StatusForbidden, reason: reasonIdentity,
			msg: fmt.Sprintf("the client's identity %d does not fit in the upstream mark (mask %#x): the proxy cannot carry it", x.peer.Identity, t.cfg.Mark.Mask)}
	}
	clientNS := ""
	if x.client != nil {
		clientNS = namespace(x.client.Pod)
	}
	x.target, ref = t.resolve(x.conn.orig, r, clientNS)
	return mark, ref
}

// refuse notes a request the proxy answers itself.
func (x *exchange) refuse(ref *refusal) {
	x.refused, x.status = ref, ref.status
	if ref.rule != "" {
		x.policyRule = ref.rule
	}
}

// refuse answers a request the proxy does not forward: one short line, and
// the connection stays usable. A gRPC call gets a gRPC status instead
// (grpcRefusal); its flow keeps the HTTP status of the refusal.
func (p *Proxy) refuse(w http.ResponseWriter, x *exchange, ref *refusal) {
	x.refuse(ref)
	if isGRPC(x.req) {
		grpcRefusal(w, ref)
		return
	}
	http.Error(w, ref.msg, ref.status)
}

// gRPC status codes of the proxy's refusals (google.golang.org/grpc/codes).
const (
	grpcPermissionDenied = 7
	grpcUnimplemented    = 12
	grpcInternal         = 13
	grpcUnavailable      = 14
)

func isGRPC(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return r.ProtoMajor == 2 && (ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;"))
}

// grpcRefusal answers a gRPC call the proxy refuses as gRPC servers do, a
// "trailers-only" response: HTTP 200 whose headers carry grpc-status and
// grpc-message (grpcRefusalHeader).
func grpcRefusal(w http.ResponseWriter, ref *refusal) {
	maps.Copy(w.Header(), grpcRefusalHeader(ref))
	w.WriteHeader(http.StatusOK)
}

// grpcRefusalHeader is the header of a gRPC refusal. A gRPC client would
// read a bare HTTP 500 as UNKNOWN; the GRPCRoute spec asks UNAVAILABLE for
// a call to a backendRef that does not resolve (and for a rule without
// one), and the others get the codes gRPC maps their HTTP statuses to.
func grpcRefusalHeader(ref *refusal) http.Header {
	code := grpcInternal
	switch {
	case ref.reason == reasonUnresolved || ref.reason == reasonNoWeight || ref.status == http.StatusServiceUnavailable:
		code = grpcUnavailable
	case ref.status == http.StatusNotFound:
		code = grpcUnimplemented
	case ref.status == http.StatusForbidden:
		code = grpcPermissionDenied
	}
	return http.Header{
		"Content-Type": {"application/grpc"},
		"Grpc-Status":  {strconv.Itoa(code)},
		"Grpc-Message": {url.PathEscape(ref.msg)}, // percent-encoded, as gRPC asks
	}
}

// finish records the exchange: metrics and its flow record.
func (p *Proxy) finish(x *exchange) {
	latency := time.Since(x.start)
	route := ""
	if x.target.rule != nil {
		route = x.target.rule.route
	}
	rm := p.metrics.forRequest(route, x.target.label, x.status)
	rm.requests.Inc()
	rm.duration.Observe(latency.Seconds())
	if ref := x.refused; ref != nil && ref.status == http.StatusForbidden {
		p.metrics.denied.WithLabelValues(ref.reason, ref.rule).Inc()
	}
	p.flows.publish(x.flow(latency))
}
