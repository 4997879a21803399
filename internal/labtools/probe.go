package labtools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Result of one probe attempt. The JSON field names are stable: tests and
// scripts read them (`shunt lab probe -o json`).
type Result struct {
	Proto  string `json:"proto"`  // tcp, udp, http or grpc
	Target string `json:"target"` // as given: HOST:PORT or URL
	Result string `json:"result"` // Connected, Refused, Timeout or Failed
	Reply  string `json:"reply"`  // the server's answer, trailing whitespace trimmed
	Peer   string `json:"peer"`   // the name of the server that answered
	Local  string `json:"local"`  // the probe's own address
	// Remote is the server address as the application sees it: getpeername
	// for TCP and connected UDP, the reply's source for unconnected UDP.
	Remote string    `json:"remote"`
	Status int       `json:"status,omitempty"` // HTTP status code
	Code   string    `json:"code,omitempty"`   // gRPC status code: OK, PermissionDenied, ...
	RTTus  int64     `json:"rtt_us"`           // from the first syscall to the outcome
	Start  time.Time `json:"start"`            // when the attempt began
	Error  string    `json:"error"`
}

// Outcomes a probe can have.
const (
	Connected = "connected" // a reply was read
	Refused   = "refused"   // ECONNREFUSED (TCP RST, ICMP port unreachable, or a refusing datapath)
	Timeout   = "timeout"   // nothing within the timeout
	Failed    = "error"     // anything else
)

// ProbeOptions tune every attempt.
type ProbeOptions struct {
	Timeout      time.Duration // per attempt, dial and reply together
	Send         string        // payload for TCP and UDP
	UDPConnected bool          // use a connected UDP socket (sees ICMP port unreachable)
	Hold         time.Duration // TCP and connected UDP: keep the socket this long, then talk again
}

// Probe runs one attempt of proto ("tcp", "udp", "http" or "grpc") against
// target.
func Probe(proto, target string, o ProbeOptions) Result {
	switch proto {
	case "tcp":
		return ProbeTCP(target, o)
	case "udp":
		return ProbeUDP(target, o)
	case "http":
		return ProbeHTTP(target, o)
	case "grpc":
		return ProbeGRPC(target, o)
	}
	return Result{Proto: proto, Target: target, Result: Failed, Error: "unknown protocol " + proto}
}

// CheckTarget rejects targets that can never work (a usage error, not a
// probe outcome): tcp, udp and grpc want HOST:PORT, http wants an http(s)
// URL.
func CheckTarget(proto, target string) error {
	switch proto {
	case "tcp", "udp", "grpc":
		if _, port, err := net.SplitHostPort(target); err != nil || port == "" {
			return fmt.Errorf("--%s %q: want HOST:PORT", proto, target)
		}
	case "http":
		u, err := url.Parse(target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--http %q: want a URL like http://HOST:PORT/PATH", target)
		}
	default:
		return fmt.Errorf("unknown protocol %q", proto)
	}
	return nil
}

// fail records err as the attempt's outcome.
func (r Result) fail(err error, start time.Time) Result {
	r.RTTus, r.Start = time.Since(start).Microseconds(), start
	r.Result = classify(err)
	r.Error = err.Error()
	return r
}

// classify maps a network error to an outcome.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return Timeout
	}
	return Failed
}

// answered records a reply.
func (r Result) answered(reply string, start time.Time) Result {
	r.RTTus, r.Start = time.Since(start).Microseconds(), start
	r.Result = Connected
	r.Reply = strings.TrimRight(reply, " \r\n\t")
	r.Peer = firstWord(r.Reply)
	return r
}

// ProbeTCP connects, sends o.Send, and waits for the reply. It is
// Connected only if the handshake succeeded and a reply came back.
func ProbeTCP(target string, o ProbeOptions) Result {
	r := Result{Proto: "tcp", Target: target}
	start := time.Now()
	c, err := net.DialTimeout("tcp", target, o.Timeout)
	if err != nil {
		return r.fail(err, start)
	}
	defer c.Close()
	// Go takes RemoteAddr from getpeername after connect, so it shows
	// what the datapath makes the application believe it is talking to.
	r.Local, r.Remote = c.LocalAddr().String(), c.RemoteAddr().String()
	c.SetDeadline(start.Add(o.Timeout))
	reply, err := exchange(c, o.Send)
	if err != nil {
		r = r.fail(err, start)
		if r.Result == Timeout {
			r.Error = "connected but no reply: " + r.Error
		}
		return r
	}
	if o.Hold > 0 {
		// An established connection must survive whatever happens
		// meanwhile (backends scaled, service deleted): talk again.
		time.Sleep(o.Hold)
		c.SetDeadline(time.Now().Add(o.Timeout))
		if _, err := exchange(c, o.Send); err != nil {
			r = r.fail(err, start)
			r.Result, r.Error = Failed, "connection broken after hold: "+r.Error
			return r
		}
	}
	return r.answered(reply, start)
}

// exchange writes msg and reads one reply.
func exchange(c net.Conn, msg string) (string, error) {
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if n > 0 {
		return string(buf[:n]), nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = errors.New("connected but the server closed without replying")
	}
	return "", err
}

// ProbeUDP sends one datagram and waits for the answer.
//
// By default the socket is unconnected (sendto/recvfrom, the way resolvers
// use UDP) and Remote is the reply's source address: it must be the address
// the probe sent to, or a resolver would drop the answer. Such a socket
// does not hear ICMP port unreachable, so a closed port is a timeout unless
// the datapath refuses the send itself. With o.UDPConnected the socket is
// connected, Remote comes from getpeername and a closed port is Refused.
func ProbeUDP(target string, o ProbeOptions) Result {
	r := Result{Proto: "udp", Target: target}
	start := time.Now()
	raddr, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return r.fail(err, start)
	}
	// Use the target's address family, as a resolver would (an AF_INET
	// socket for an IPv4 server), rather than a v4-mapped [::] socket.
	network := "udp"
	if raddr.IP.To4() != nil {
		network = "udp4"
	} else if raddr.IP != nil {
		network = "udp6"
	}
	var c *net.UDPConn
	if o.UDPConnected {
		c, err = net.DialUDP(network, nil, raddr)
	} else {
		c, err = net.ListenUDP(network, nil)
	}
	if err != nil {
		return r.fail(err, start)
	}
	defer c.Close()
	c.SetDeadline(start.Add(o.Timeout))
	if o.UDPConnected {
		r.Remote = c.RemoteAddr().String()
		_, err = c.Write([]byte(o.Send))
	} else {
		_, err = c.WriteToUDP([]byte(o.Send), raddr)
	}
	// The local port is chosen at bind, the address only at send for
	// unconnected sockets (then it stays 0.0.0.0).
	r.Local = c.LocalAddr().String()
	if err != nil {
		return r.fail(err, start)
	}
	buf := make([]byte, 65535)
	n, from, err := c.ReadFromUDP(buf)
	if err != nil {
		return r.fail(err, start)
	}
	if !o.UDPConnected {
		r.Remote = from.String()
	}
	reply := string(buf[:n])
	if o.Hold > 0 && o.UDPConnected {
		// A connected socket keeps its backend: talk again after a while
		// in which that backend may have gone (the datapath then closes
		// the socket rather than let it send into the void).
		time.Sleep(o.Hold)
		c.SetDeadline(time.Now().Add(o.Timeout))
		_, err := c.Write([]byte(o.Send))
		if err == nil {
			_, err = c.Read(buf)
		}
		if err != nil {
			r = r.fail(err, start)
			r.Result, r.Error = Failed, "socket broken after hold: "+r.Error
			return r
		}
	}
	return r.answered(reply, start)
}

// ProbeHTTP issues one GET on a fresh connection. Any HTTP response is
// Connected; Status has its code and Peer the X-Shunt-Pod header.
func ProbeHTTP(target string, o ProbeOptions) Result {
	r := Result{Proto: "http", Target: target}
	start := time.Now()
	// Note the connection's addresses as it is dialled. The dial runs in
	// the transport's goroutine and may outlive a timed-out Get: hence the
	// mutex.
	var mu sync.Mutex
	var local, remote string
	dialer := &net.Dialer{}
	transport := &http.Transport{ // no proxy from the environment, no reuse
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err == nil {
				mu.Lock()
				local, remote = c.LocalAddr().String(), c.RemoteAddr().String()
				mu.Unlock()
			}
			return c, err
		},
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Timeout: o.Timeout, Transport: transport}
	resp, err := client.Get(target)
	if err == nil {
		defer resp.Body.Close()
		var body []byte
		if body, err = io.ReadAll(io.LimitReader(resp.Body, 4096)); err == nil {
			r = r.answered(string(body), start)
			r.Status = resp.StatusCode
			r.Peer = resp.Header.Get("X-Shunt-Pod")
		}
	}
	mu.Lock()
	r.Local, r.Remote = local, remote
	mu.Unlock()
	if err != nil {
		return r.fail(err, start)
	}
	return r
}

// Text is the one-line human form of an attempt.
func (r Result) Text() string {
	if r.Result != Connected {
		return fmt.Sprintf("%s %s: %s: %s", r.Proto, r.Target, r.Result, r.Error)
	}
	s := fmt.Sprintf("%s %s: connected to %s", r.Proto, r.Target, r.Peer)
	switch r.Proto {
	case "http":
		s += fmt.Sprintf(" (HTTP %d)", r.Status)
	case "grpc":
		s += fmt.Sprintf(" (%s)", r.Code)
	}
	return s + fmt.Sprintf(" at %s from %s in %.2fms: %q", r.Remote, r.Local, float64(r.RTTus)/1000, r.Reply)
}

// Summary counts results by outcome and the connected ones by peer, e.g.
// "tcp 10.0.0.5:80: 10 connected (backend-a 6, backend-b 4)". The results
// are for one target.
func Summary(results []Result) string {
	if len(results) == 0 {
		return ""
	}
	outcomes, peers := map[string]int{}, map[string]int{}
	for _, r := range results {
		outcomes[r.Result]++
		if r.Result == Connected {
			peers[r.Peer]++
		}
	}
	var parts []string
	for _, o := range []string{Connected, Refused, Timeout, Failed} {
		if outcomes[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", outcomes[o], o))
		}
	}
	s := fmt.Sprintf("%s %s: %s", results[0].Proto, results[0].Target, strings.Join(parts, ", "))
	if len(peers) > 0 {
		names := make([]string, 0, len(peers))
		for p := range peers {
			names = append(names, p)
		}
		sort.Strings(names)
		for i, p := range names {
			if p == "" {
				p = "(no name)"
			}
			names[i] = fmt.Sprintf("%s %d", p, peers[names[i]])
		}
		s += " (" + strings.Join(names, ", ") + ")"
	}
	return s
}

// TCPSession sends each attempt's request over one long-lived connection,
// to watch what happens to an established connection (an agent restart
// must not reset it). A failed attempt closes the connection; the next
// one dials again, and says so in its error.
type TCPSession struct {
	target string
	o      ProbeOptions
	c      net.Conn
	broken string // why the previous connection was closed
}

// NewTCPSession dials lazily, at the first attempt.
func NewTCPSession(target string, o ProbeOptions) *TCPSession {
	return &TCPSession{target: target, o: o}
}

// Probe exchanges one request on the session's connection. It is
// Connected only if the reply came back on the same connection as the
// previous attempt's (or on the first one).
func (s *TCPSession) Probe() Result {
	r := Result{Proto: "tcp", Target: s.target}
	start := time.Now()
	if s.c == nil {
		c, err := net.DialTimeout("tcp", s.target, s.o.Timeout)
		if err != nil {
			return r.fail(err, start)
		}
		s.c = c
	}
	r.Local, r.Remote = s.c.LocalAddr().String(), s.c.RemoteAddr().String()
	s.c.SetDeadline(start.Add(s.o.Timeout))
	reply, err := exchange(s.c, s.o.Send)
	if err != nil {
		r = r.fail(err, start)
		r.Result, r.Error = Failed, "established connection broken: "+r.Error
		s.Close()
		return r
	}
	return r.answered(reply, start)
}

// Close closes the connection.
func (s *TCPSession) Close() {
	if s.c != nil {
		s.c.Close()
		s.c = nil
	}
}
