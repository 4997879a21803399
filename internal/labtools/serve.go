// Package labtools holds the lab's built-in test server and probe client:
// `shunt lab serve` answers TCP, UDP and HTTP with the pod's name, and
// `shunt lab probe` tells connected / refused / timed out, so tests and the
// demo can see who answered without any other tool in the pod.
package labtools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
)

// ServeConfig lists the addresses to listen on (":80", "127.0.0.1:0", ...).
type ServeConfig struct {
	Name string // answer with this name; default $SHUNT_POD_NAME, else hostname
	TCP  []string
	UDP  []string
	HTTP []string
}

// Server is a running lab server.
type Server struct {
	name      string
	listeners []net.Listener
	conns     []net.PacketConn
	https     []*http.Server
	wg        sync.WaitGroup
}

// PodName is the default name the server answers with.
func PodName() string {
	if n := os.Getenv("SHUNT_POD_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return n
}

// Start opens every listener (failing as a whole if one cannot bind) and
// serves in the background.
func Start(cfg ServeConfig) (*Server, error) {
	s := &Server{name: cfg.Name}
	if s.name == "" {
		s.name = PodName()
	}
	fail := func(err error) (*Server, error) {
		s.Close()
		return nil, err
	}
	for _, a := range cfg.TCP {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fail(fmt.Errorf("tcp %s: %w", a, err))
		}
		s.listeners = append(s.listeners, ln)
		s.wg.Add(1)
		go s.serveTCP(ln)
	}
	for _, a := range cfg.UDP {
		pc, err := net.ListenPacket("udp", a)
		if err != nil {
			return fail(fmt.Errorf("udp %s: %w", a, err))
		}
		s.conns = append(s.conns, pc)
		s.wg.Add(1)
		go s.serveUDP(pc)
	}
	for _, a := range cfg.HTTP {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fail(fmt.Errorf("http %s: %w", a, err))
		}
		srv := &http.Server{Handler: s.httpHandler()}
		s.https = append(s.https, srv)
		s.listeners = append(s.listeners, ln)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			srv.Serve(ln)
		}()
	}
	return s, nil
}

// Addrs lists the bound addresses as "proto addr" (tests use port 0).
func (s *Server) Addrs() []string {
	var out []string
	for _, ln := range s.listeners {
		out = append(out, "tcp "+ln.Addr().String())
	}
	for _, pc := range s.conns {
		out = append(out, "udp "+pc.LocalAddr().String())
	}
	return out
}

// Close stops every listener and waits for the serving goroutines.
func (s *Server) Close() {
	for _, h := range s.https {
		h.Shutdown(context.Background())
	}
	for _, ln := range s.listeners {
		ln.Close()
	}
	for _, pc := range s.conns {
		pc.Close()
	}
	s.wg.Wait()
}

// reply is the answer to every message: the server's name and the echo.
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
			continue
		}
		go func() {
			defer c.Close()
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
			continue
		}
		pc.WriteTo(s.reply(buf[:n]), from)
	}
}

func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Shunt-Pod", s.name)
		io.WriteString(w, s.name+"\n")
	})
	return mux
}

// ListenAddrs turns ports into wildcard listen addresses.
func ListenAddrs(ports []int) []string {
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = fmt.Sprintf(":%d", p)
	}
	return out
}

// firstWord is the name part of a reply.
func firstWord(s string) string {
	if i := strings.IndexByte(s, ' '); i >= 0 {
		return s[:i]
	}
	return strings.TrimSpace(s)
}
