// Package labtools holds the lab's built-in test server and probe client:
// `shunt lab serve` answers TCP, UDP, HTTP and gRPC with the pod's name,
// `shunt lab probe` tells connected / refused / timed out, and `shunt lab
// http-load` and `http-get` drive the L7 proxy, so tests and the demo can see
// who answered without any other tool in the pod.
//
// The wire protocol is deliberately trivial:
//
//   - TCP: for every read of up to 4 KiB the server writes back
//     "NAME <bytes read>" and keeps the connection open until the client
//     closes it. There is no banner: a client that sends nothing gets nothing.
//   - UDP: every datagram gets "NAME <datagram>" back, sent to the datagram's
//     source from the same (unconnected) socket.
//   - HTTP (HTTP/1.1, and h2c with prior knowledge): /healthz answers "ok";
//     /remote answers the client's address and port as the server sees
//     them ("IP:PORT\n": who a translation made the client);
//     every other path answers 200 with the body "NAME\n". Every response
//     carries the header X-Shunt-Pod: NAME.
//   - gRPC (h2c, no TLS): the standard health service (grpc.health.v1.Health)
//     reports SERVING; every call's response headers carry the metadata
//     x-shunt-pod: NAME.
package labtools

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// ServeConfig lists the addresses to listen on (":80", "127.0.0.1:0", ...).
type ServeConfig struct {
	Name string // answer with this name; default PodName()
	TCP  []string
	UDP  []string
	HTTP []string
	GRPC []string
}

// Server is a running lab server.
type Server struct {
	name  string
	addrs []string // "proto addr", in the order TCP, UDP, HTTP, gRPC

	listeners []net.Listener // TCP echo and HTTP
	packets   []net.PacketConn
	https     []*http.Server
	grpcs     []*grpc.Server
	wg        sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // open TCP echo connections, closed by Close
}

// PodName is the default name the server answers with: $SHUNT_POD_NAME,
// else the hostname.
func PodName() string {
	if n := os.Getenv("SHUNT_POD_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return n
}

// Start opens every listener (failing as a whole if one cannot bind) and
// serves in the background until Close.
func Start(cfg ServeConfig) (*Server, error) {
	s := &Server{name: cfg.Name, conns: map[net.Conn]struct{}{}}
	if s.name == "" {
		s.name = PodName()
	}
	fail := func(err error) (*Server, error) {
		s.Close()
		return nil, err
	}
	// A wildcard address (":80") gives a dual-stack [::] socket when the
	// kernel has IPv6, which also takes IPv4; otherwise Go falls back to
	// 0.0.0.0 by itself.
	for _, a := range cfg.TCP {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fail(fmt.Errorf("tcp %s: %w", a, err))
		}
		s.listeners = append(s.listeners, ln)
		s.addrs = append(s.addrs, "tcp "+showAddr(ln.Addr()))
		s.wg.Add(1)
		go s.serveTCP(ln)
	}
	for _, a := range cfg.UDP {
		pc, err := net.ListenPacket("udp", a)
		if err != nil {
			return fail(fmt.Errorf("udp %s: %w", a, err))
		}
		s.packets = append(s.packets, pc)
		s.addrs = append(s.addrs, "udp "+showAddr(pc.LocalAddr()))
		s.wg.Add(1)
		go s.serveUDP(pc)
	}
	for _, a := range cfg.HTTP {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fail(fmt.Errorf("http %s: %w", a, err))
		}
		srv := &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
		// h2c (prior knowledge) beside HTTP/1.1, so that a pod can be an
		// HTTP/2 backend of the L7 proxy and `http-load --http2` can
		// reach it directly.
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
		s.https = append(s.https, srv)
		s.listeners = append(s.listeners, ln)
		s.addrs = append(s.addrs, "http "+showAddr(ln.Addr()))
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			srv.Serve(ln) // returns http.ErrServerClosed on Close
		}()
	}
	for _, a := range cfg.GRPC {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fail(fmt.Errorf("grpc %s: %w", a, err))
		}
		srv := s.newGRPCServer()
		s.grpcs = append(s.grpcs, srv)
		s.addrs = append(s.addrs, "grpc "+showAddr(ln.Addr()))
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			// Returns on Stop, which closes ln (even when Stop came
			// first, as when a later bind failed).
			srv.Serve(ln)
		}()
	}
	return s, nil
}

// showAddr prints a wildcard address as ":port" and others as host:port.
func showAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = ""
	}
	return net.JoinHostPort(host, port)
}

// Name is the name the server answers with.
func (s *Server) Name() string { return s.name }

// Addrs lists the bound addresses as "proto addr" ("tcp 127.0.0.1:41234",
// "udp :53", "http :8080", "grpc :9000"), TCP first, then UDP, HTTP and
// gRPC, each in ServeConfig order. Tests listen on port 0 and learn the port here.
func (s *Server) Addrs() []string { return append([]string(nil), s.addrs...) }

// Close stops every listener, closes open connections and waits for the
// serving goroutines. It is safe to call more than once.
func (s *Server) Close() {
	for _, h := range s.https {
		h.Close()
	}
	for _, g := range s.grpcs {
		g.Stop()
	}
	for _, ln := range s.listeners {
		ln.Close()
	}
	for _, pc := range s.packets {
		pc.Close()
	}
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// reply is the answer to every message: the server's name, a space, the echo.
func (s *Server) reply(data []byte) []byte {
	return append([]byte(s.name+" "), data...)
}

func (s *Server) serveTCP(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: don't spin.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if s.closed { // accepted just as Close ran
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := c.Write(s.reply(buf[:n])); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func (s *Server) serveUDP(pc net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. a queued ICMP error; the next datagram is fine
		}
		pc.WriteTo(s.reply(buf[:n]), from)
	}
}

func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/remote", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.RemoteAddr+"\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, s.name+"\n") })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Shunt-Pod", s.name)
		mux.ServeHTTP(w, r)
	})
}

// ParsePorts reads port flags: each value may be a comma-separated list
// ("80,81"), and flags may repeat. Every port must be 1-65535.
func ParsePorts(values []string) ([]int, error) {
	var ports []int
	for _, v := range values {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			p, err := strconv.Atoi(f)
			if err != nil || p < 1 || p > 65535 {
				return nil, fmt.Errorf("%q is not a port: want a number from 1 to 65535", f)
			}
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// ListenAddrs turns ports into listen addresses on host ("" = every address).
func ListenAddrs(host string, ports []int) []string {
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = net.JoinHostPort(host, strconv.Itoa(p))
	}
	return out
}

// firstWord is the name part of a reply.
func firstWord(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, " \t\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}
