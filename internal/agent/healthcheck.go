package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/services"
)

// healthChecks serves the healthCheckNodePort of every Service with
// externalTrafficPolicy Local, as kube-proxy does: an external load
// balancer asks each node whether it has endpoints of the Service, and
// sends traffic only to those answering 200. One HTTP server per port,
// on every address of the node's network namespace, or, as kube-proxy
// with --nodeport-addresses, only on the addresses NodePorts are served
// on; its answer follows the objects (checked every interval).
type healthChecks struct {
	node string
	// addrs are the addresses the servers listen on; nil: every address.
	addrs   []netip.Addr
	log     *slog.Logger
	mu      sync.Mutex
	servers map[uint16]*healthServer
	store   *model.Store // the store the servers answer for
}

// healthServer is one healthCheckNodePort's server.
type healthServer struct {
	srv   *http.Server
	check atomic.Pointer[services.HealthCheck]
}

// newHealthChecks serves node's health check ports on addrs (nil: on
// every address).
func newHealthChecks(node string, addrs []netip.Addr, log *slog.Logger) *healthChecks {
	return &healthChecks{node: node, addrs: addrs, log: log, servers: map[uint16]*healthServer{}}
}

// listen opens port on every address the servers listen on: all of them
// or none.
func (h *healthChecks) listen(port uint16) ([]net.Listener, error) {
	if h.addrs == nil {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			return nil, err
		}
		return []net.Listener{ln}, nil
	}
	var lns []net.Listener
	for _, a := range h.addrs {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(a, port).String())
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// healthBody is kube-proxy's answer, field for field.
type healthBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (s *healthServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	c := s.check.Load()
	var body healthBody
	body.Service.Namespace, body.Service.Name = c.Namespace, c.Name
	body.LocalEndpoints, body.ServiceProxyHealthy = c.LocalEndpoints, true
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", fmt.Sprint(c.LocalEndpoints))
	if c.LocalEndpoints == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	json.NewEncoder(w).Encode(body)
}

// sync makes the servers answer what store says: a server for each
// health check port, closed when its Service goes. A port that cannot be
// listened on (another process holds it) is logged and tried again at the
// next sync.
func (h *healthChecks) sync(store *model.Store) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if store == h.store {
		return
	}
	checks := services.HealthChecks(store.Services(), store.EndpointSlicesFor, h.node)
	want := map[uint16]services.HealthCheck{}
	for _, c := range checks {
		want[c.Port] = c
	}
	failed := false
	for _, port := range slices.Sorted(maps.Keys(want)) {
		c := want[port]
		s, ok := h.servers[port]
		if !ok {
			lns, err := h.listen(port)
			if err != nil {
				h.log.Warn("health check port not served", "service", c.Namespace+"/"+c.Name, "port", port, "err", err)
				failed = true
				continue
			}
			s = &healthServer{}
			s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
			s.check.Store(&c)
			h.servers[port] = s
			for _, ln := range lns {
				go func() {
					if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
						h.log.Warn("health check server stopped", "port", port, "addr", ln.Addr(), "err", err)
					}
				}()
			}
			continue
		}
		s.check.Store(&c)
	}
	for port, s := range h.servers {
		if _, ok := want[port]; !ok {
			s.srv.Close()
			delete(h.servers, port)
		}
	}
	if !failed {
		h.store = store
	}
}

// run keeps the servers in step with objects until ctx ends, then closes
// them.
func (h *healthChecks) run(ctx context.Context, objects func() *model.Store, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if s := objects(); s != nil {
			h.sync(s)
		}
		select {
		case <-ctx.Done():
			h.mu.Lock()
			for port, s := range h.servers {
				s.srv.Close()
				delete(h.servers, port)
			}
			h.mu.Unlock()
			return
		case <-t.C:
		}
	}
}
