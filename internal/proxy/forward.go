package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"time"
)

// newReverseProxy is the forwarding half: the standard library's reverse
// proxy (hop-by-hop headers, trailers, flushing of streamed responses,
// upgrades) over a transport that picks the backend, asks the policy and
// retries (roundTrip).
func (p *Proxy) newReverseProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "backend" // each attempt sets the backend's address
			// The proxy is transparent: keep what the client said about
			// earlier hops (Rewrite starts without these headers).
			for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v, ok := pr.In.Header[h]; ok {
					pr.Out.Header[h] = v
				}
			}
			exchangeOf(pr.In.Context()).target.rewriteRequest(pr.Out)
		},
		Transport: roundTripper(p.roundTrip),
		ModifyResponse: func(resp *http.Response) error {
			x := exchangeOf(resp.Request.Context())
			x.status = resp.StatusCode
			if x.refused != nil {
				x.status = x.refused.status // a gRPC refusal is a 200 on the wire
			}
			x.target.rewriteResponse(resp.Header)
			return nil
		},
		ErrorHandler: p.upstreamFailed,
		ErrorLog:     slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// maxReplay is the largest request body kept to send again on a retry.
const maxReplay = 64 << 10

// roundTrip sends one request upstream. Each attempt picks a backend,
// asks the backend port's L7 policy (a denial is answered 403 here), and
// sends the request on the client identity's transport, HTTP/2 for HTTP/2
// clients. Connection errors and the rule's retry codes are tried again,
// up to its attempts, when the body can be sent again.
func (p *Proxy) roundTrip(out *http.Request) (*http.Response, error) {
	ctx := out.Context()
	x := exchangeOf(ctx)
	tr := x.up.h1
	if x.req.ProtoMajor == 2 {
		tr = x.up.h2
	}
	retries, codes, backoff := x.target.rule.retryPolicy()
	mirrors := x.target.rule != nil && len(x.target.rule.mirrors) > 0
	body, replayable, err := replayableBody(out, retries > 0 || mirrors)
	if err != nil {
		return nil, err
	}
	if mirrors {
		if replayable {
			p.mirror(x, out, body)
		} else {
			// Streamed: the copies get what the request's transport
			// reads (mirror.go). A request refused below never reads
			// it: closing the tee ends its copies.
			tee := teeRequestBody(out)
			p.mirror(x, out, tee.copy)
			defer func() {
				if x.refused != nil {
					tee.Close()
				}
			}()
		}
	}
	for attempt := 0; ; attempt++ {
		req := out
		if attempt > 0 {
			req = out.Clone(ctx)
			req.Body = body()
		}
		x.backend = x.target.pick()
		req.URL.Host = x.backend.addr.String()
		rule, ref := x.t.judge(x.peer, x.backend, x.req)
		x.policyRule = rule
		if ref != nil {
			x.refused = ref
			return refusalResponse(req, ref), nil
		}
		resp, err := tr.RoundTrip(req)
		retry := attempt < retries && replayable && ctx.Err() == nil &&
			(err != nil || slices.Contains(codes, resp.StatusCode))
		if !retry {
			return resp, err
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, maxReplay)) // so its connection can be reused
			resp.Body.Close()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
	}
}

// retryPolicy is how a rule (nil: none) retries: attempts after the
// first, the statuses retried beside connection errors, the pause.
func (rl *rule) retryPolicy() (retries int, codes []int, backoff time.Duration) {
	if rl == nil || rl.retry == nil {
		return 0, nil, 0
	}
	return rl.retry.Attempts, rl.retry.Codes, time.Duration(rl.retry.Backoff)
}

// replayableBody makes a request body that can be sent again: none, or
// (when retries are wanted) a small body with a known length, read once.
// A streamed body (gRPC, chunked uploads) is sent once.
func replayableBody(out *http.Request, wanted bool) (func() io.ReadCloser, bool, error) {
	if out.Body == nil || out.Body == http.NoBody {
		return func() io.ReadCloser { return http.NoBody }, true, nil
	}
	if !wanted || out.ContentLength <= 0 || out.ContentLength > maxReplay {
		return nil, false, nil
	}
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, false, fmt.Errorf("reading the request body: %w", err)
	}
	out.Body.Close()
	out.Body = io.NopCloser(bytes.NewReader(b))
	return func() io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }, true, nil
}

// refusalResponse is the proxy's own answer, passed through the reverse
// proxy like an upstream's (a gRPC call's as gRPC servers refuse one).
func refusalResponse(req *http.Request, ref *refusal) *http.Response {
	if isGRPC(req) {
		return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/2.0", ProtoMajor: 2,
			Header: grpcRefusalHeader(ref), Body: http.NoBody, Request: req}
	}
	body := ref.msg + "\n"
	return &http.Response{
		StatusCode: ref.status, Status: fmt.Sprintf("%d %s", ref.status, http.StatusText(ref.status)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{
			"Content-Type":           {"text/plain; charset=utf-8"},
			"X-Content-Type-Options": {"nosniff"},
			"Content-Length":         {strconv.Itoa(len(body))},
		},
		ContentLength: int64(len(body)), Body: io.NopCloser(strings.NewReader(body)), Request: req,
	}
}

// upstreamFailed answers a request that got no upstream response: 504 when
// the rule's timeout ran out, 503 when the connect failed, 502 otherwise;
// nothing when the client went away.
func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeOf(r.Context())
	code := x.failed(err, x.req.Context().Err() != nil, errors.Is(r.Context().Err(), context.DeadlineExceeded))
	if code != 0 {
		http.Error(w, x.err, code)
	}
}

// failed notes why a request got no upstream response and returns the
// status to answer: 504 when the rule's timeout ran out (even if it struck
// during a connect), 503 when the connect failed, 502 otherwise; 0 when the
// client went away.
func (x *exchange) failed(err error, clientGone, timedOut bool) int {
	var de *dialError
	var code int
	switch {
	case clientGone:
		x.reason, x.err = "client-gone", "the client went away before the response: "+err.Error()
		return 0
	case timedOut:
		code, x.reason = http.StatusGatewayTimeout, "upstream-timeout"
		x.err = fmt.Sprintf("upstream request timeout: no response from %s within the route's %s", x.backend.addr, x.target.rule.timeout)
	case errors.As(err, &de):
		code, x.reason = http.StatusServiceUnavailable, "upstream-unreachable"
		x.err = fmt.Sprintf("upstream connection failed: %v (an L3/L4 policy may have dropped it)", de)
	default:
		code, x.reason = http.StatusBadGateway, "upstream-error"
		x.err = fmt.Sprintf("upstream %s: %v", x.backend.addr, err)
	}
	x.status = code
	return code
}

// aborted notes why a response that had begun broke off.
func (x *exchange) aborted() { x.brokeOff(x.req.Context().Err() != nil) }

// brokeOff notes why a response that had begun broke off.
func (x *exchange) brokeOff(clientGone bool) {
	switch {
	case clientGone:
		x.reason, x.err = "client-gone", "the client went away during the response"
	case x.target.rule != nil && x.target.rule.timeout > 0 && time.Since(x.start) >= x.target.rule.timeout:
		x.reason, x.err = "upstream-timeout", fmt.Sprintf("upstream request timeout: the response did not end within the route's %s", x.target.rule.timeout)
	default:
		x.reason, x.err = "upstream-error", "the upstream response broke off"
	}
}
