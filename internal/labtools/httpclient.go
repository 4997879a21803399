package labtools

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Request is the request http-load and http-get send.
type Request struct {
	URL     string
	Method  string        // default GET
	Header  http.Header   // a Host entry becomes the request's Host
	HTTP2   bool          // h2c with prior knowledge (http:// URLs), no HTTP/1.1 upgrade
	Timeout time.Duration // per request, the response body included
	// SourcePort, if not 0, is the connection's source port (with
	// SO_REUSEADDR, so a port whose last connection is in TIME_WAIT is
	// taken again): tests send the same tuple through two nodes.
	SourcePort uint16
}

// ParseHeaders reads curl-style -H values, "Name: value". A name may
// repeat: each value is sent.
func ParseHeaders(values []string) (http.Header, error) {
	h := http.Header{}
	for _, v := range values {
		name, val, ok := strings.Cut(v, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("header %q: want \"Name: value\"", v)
		}
		h.Add(name, strings.TrimSpace(val))
	}
	return h, nil
}

// Check rejects a request that could never be sent (a usage error): a URL
// that is not http(s)://HOST..., a method that is not an HTTP token.
func (q Request) Check() error {
	u, err := url.Parse(q.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: want a URL like http://HOST:PORT/PATH", q.URL)
	}
	_, err = q.build(context.Background())
	return err
}

// build makes the http.Request. net/http ignores a Host in Header and sends
// the URL's host instead; tests need the Host header to pick a route.
func (q Request) build(ctx context.Context) (*http.Request, error) {
	method := q.Method
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequestWithContext(ctx, method, q.URL, nil)
	if err != nil {
		return nil, err
	}
	for name, vals := range q.Header {
		if name == "Host" {
			req.Host = vals[0]
			continue
		}
		req.Header[name] = vals
	}
	return req, nil
}

// client is an HTTP client with a transport of its own that keeps at most
// one connection, so that all of a load worker's requests share one
// connection: a proxy must split weights per request, not per connection,
// and tests want to see it do so. dialed, if not nil, counts the
// connections opened.
func (q Request) client(dialed *atomic.Int64) *http.Client {
	dialer := &net.Dialer{}
	if q.SourcePort != 0 {
		dialer.LocalAddr = &net.TCPAddr{Port: int(q.SourcePort)}
		dialer.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	t := &http.Transport{ // no proxy from the environment
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err == nil && dialed != nil {
				dialed.Add(1)
			}
			return c, err
		},
		MaxConnsPerHost:     1,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     time.Minute,
	}
	if q.HTTP2 {
		// Only unencrypted HTTP/2: http:// URLs speak h2c from the
		// first byte (prior knowledge), as gRPC does; HTTP/2 over TLS
		// for https:// ones.
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
		t.Protocols.SetHTTP2(true)
	}
	return &http.Client{
		Transport: t,
		Timeout:   q.Timeout,
		// Report redirects as they are: a proxy's 301 is a result.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
