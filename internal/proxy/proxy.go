// Package proxy is the node L7 proxy (cmd/shunt-proxy). The socket hooks
// send it the TCP connections of pods whose destination has HTTP routes or
// HTTP policy rules; it learns where each connection was headed
// (SO_ORIGINAL_DST), who the client is (its address among the configured
// endpoints), and for every request picks a backend by the routes, decides
// the backend port's L7 policy, and forwards the request on an upstream
// connection marked with the client's identity, so L3/L4 policy judges it
// as the client. It serves HTTP/1.1 and h2c on one listener, and records
// one flow per request. Clients no socket hook of the node sees (another
// node's pods, clients outside) reach it through a second, transparent
// listener to which the tc programs steer their connections (steer.go).
//
// The agent configures it with complete, versioned configurations
// (proxyapi.Config) on a control socket; the proxy is its own process and
// keeps serving its last configuration when the agent is gone.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// Options are what the proxy needs beyond its configuration.
type Options struct {
	Log *slog.Logger
	// ConfigFile is where every accepted configuration is saved, so a
	// restarted proxy serves at once (LoadConfigFile); "": nowhere.
	ConfigFile string
	// OriginalDst says where an accepted connection was headed; nil:
	// OriginalDst (SO_ORIGINAL_DST). Tests without socket hooks fake it.
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// SetMark marks an upstream socket before it connects; nil: SetMark
	// (SO_MARK, root only). Tests without privileges record it instead.
	SetMark func(fd uintptr, mark uint32) error
	// NetHTTPOnly serves every request with net/http, without the fast
	// path (fastpath.go): for comparison and as a way back.
	NetHTTPOnly bool
	// NoEventLoop serves the fast path with a goroutine per connection
	// only, without the event loops (eventloop.go): for comparison.
	NoEventLoop bool
}

// Proxy is the node proxy: its listener, configuration and upstreams.
type Proxy struct {
	log         *slog.Logger
	configFile  string
	originalDst func(net.Conn) (netip.AddrPort, error)
	started     time.Time

	table   atomic.Pointer[table]
	srv     *http.Server
	forward *httputil.ReverseProxy
	up      *upstreams
	flows   *flowHub
	metrics *metrics
	stats   stats

	fastPath  bool
	fastConns fastConns
	loops     eventLoops
	handoff   *handoffListener // to srv: connections the fast path does not take
	draining  atomic.Bool
	stopSweep chan struct{} // ends the sweep of idle upstream connections
	// mirrorSlots holds one token per request copy on its way (mirror.go).
	mirrorSlots chan struct{}

	mu      sync.Mutex // serializes configuration changes and shutdown
	ln      net.Listener
	steerLn net.Listener // the transparent listener (steer.go); nil: none
	closing bool
	lastErr string
}

type stats struct {
	conns, origDstErrors, requests, configErrors atomic.Uint64
	active                                       atomic.Int64
	handoffs                                     handoffCounts // connections the fast paths handed on (handoffs.go)
}

// New returns a proxy with no configuration: it listens once one is
// applied.
func New(opts Options) *Proxy {
	p := &Proxy{
		log: opts.Log, configFile: opts.ConfigFile, originalDst: opts.OriginalDst, started: time.Now(),
		flows: newFlowHub(), fastPath: !opts.NetHTTPOnly, handoff: newHandoffListener(),
		mirrorSlots: make(chan struct{}, maxMirrorsInFlight),
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.originalDst == nil {
		p.originalDst = OriginalDst
	}
	setMark := opts.SetMark
	if setMark == nil {
		setMark = SetMark
	}
	p.up = &upstreams{setMark: setMark, byMark: map[upstreamKey]*transports{}, dialTimeout: func() time.Duration {
		return p.table.Load().dialTimeout
	}}
	p.metrics = newMetrics(p)
	p.forward = p.newReverseProxy()
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true) // h2c with prior knowledge: gRPC clients
	p.srv = &http.Server{
		Handler:   http.HandlerFunc(p.serveHTTP),
		Protocols: &protos,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c.(*clientConn))
		},
		ReadHeaderTimeout: 30 * time.Second,
		// Clients keep connections to services open; close them only
		// when idle for long (Envoy's default too).
		IdleTimeout: time.Hour,
		ErrorLog:    slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	if p.fastPath {
		go p.srv.Serve(p.handoff)
		p.stopSweep = make(chan struct{})
		go p.up.sweep(fastSweepInterval, p.stopSweep)
		if !opts.NoEventLoop {
			if err := p.startEventLoops(eventLoopCount()); err != nil {
				p.log.Warn("serving the fast path without event loops", "err", err)
			}
		}
	}
	return p
}

type connKey struct{}

// StaleError is a configuration older than the one in force.
type StaleError struct{ Have, Got uint64 }

func (e *StaleError) Error() string {
	return fmt.Sprintf("configuration version %d is older than version %d in force", e.Got, e.Have)
}

// IncompleteError is a configuration built before the agent had the whole
// cluster, sent while a complete one is in force.
type IncompleteError struct{ Have, Got uint64 }

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("configuration version %d is incomplete (the agent had not yet heard of every object); complete version %d stays in force", e.Got, e.Have)
}

// Apply checks a whole configuration and puts it in force at once: it
// refuses an older version (*StaleError), an incomplete one while a
// complete one is in force (*IncompleteError) and an invalid configuration
// (*ConfigError, naming every bad field), and listens on the new address
// when Listen changed. The previous configuration stays in force on any
// error.
func (p *Proxy) Apply(cfg proxyapi.Config) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.apply(cfg)
	if err != nil {
		p.noteConfigError(fmt.Errorf("configuration version %d refused: %w", cfg.Version, err))
	}
	return err
}

// noteConfigError counts a configuration refused or not saved, for status
// and metrics; the caller holds mu.
func (p *Proxy) noteConfigError(err error) {
	p.stats.configErrors.Add(1)
	p.lastErr = err.Error()
	p.log.Error("configuration", "err", err)
}

func (p *Proxy) apply(cfg proxyapi.Config) error {
	if p.closing {
		return errors.New("the proxy is shutting down")
	}
	cur := p.table.Load()
	if cur != nil && cfg.Version < cur.cfg.Version {
		return &StaleError{Have: cur.cfg.Version, Got: cfg.Version}
	}
	if cur != nil && cur.cfg.Complete && !cfg.Complete {
		return &IncompleteError{Have: cur.cfg.Version, Got: cfg.Version}
	}
	t, err := compile(cfg)
	if err != nil {
		return err
	}
	var ln net.Listener
	if cur == nil || t.listen != cur.listen {
		if ln, err = listen(t.listen, false); err != nil {
			return err
		}
	}
	var steerLn net.Listener
	if t.steer.IsValid() && (cur == nil || t.steer != cur.steer) {
		if steerLn, err = listen(t.steer, true); err != nil {
			if ln != nil {
				ln.Close()
			}
			return err
		}
	}
	p.table.Store(t) // before serving the new listener: every request has a table
	p.swapSteerListener(t, steerLn)
	if ln != nil {
		old := p.ln
		p.ln = ln
		go p.serve(ln)
		if old != nil {
			old.Close() // its connections stay, served by the new table
		}
	}
	p.up.retain(t.marks())
	p.lastErr = ""
	if err := p.save(cfg); err != nil {
		p.noteConfigError(fmt.Errorf("configuration in force but not saved, a restarted proxy would start without it: %w", err))
	}
	p.log.Info("configuration in force", "version", cfg.Version, "listen", t.listen, "services", len(cfg.Services),
		"routes", len(cfg.Routes), "policies", len(cfg.Policies), "endpoints", len(cfg.Endpoints))
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	p.serveListener(&listener{Listener: ln, p: p})
}

func (p *Proxy) serveListener(l *listener) {
	var err error
	ln := l.Listener
	if p.fastPath {
		err = p.acceptFast(l)
	} else {
		err = p.srv.Serve(l)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		p.log.Error("serving stopped", "listen", ln.Addr(), "err", err)
	}
}

// Addr is where the proxy listens (nil before a configuration).
func (p *Proxy) Addr() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return nil
	}
	return p.ln.Addr()
}

// Config is the configuration in force; ok is false before the first.
func (p *Proxy) Config() (cfg proxyapi.Config, ok bool) {
	if t := p.table.Load(); t != nil {
		return t.cfg, true
	}
	return cfg, false
}

// Status says how the proxy is doing.
func (p *Proxy) Status() proxyapi.Status {
	st := proxyapi.Status{
		Started: p.started, PID: os.Getpid(),
		ActiveConnections: p.stats.active.Load(), Connections: p.stats.conns.Load(),
		OriginalDstErrors: p.stats.origDstErrors.Load(), Requests: p.stats.requests.Load(),
		FlowsDropped: p.flows.dropped.Load(), ConfigErrors: p.stats.configErrors.Load(),
	}
	if t := p.table.Load(); t != nil {
		st.Version, st.Listen = t.cfg.Version, t.cfg.Listen
	}
	p.mu.Lock()
	st.LastConfigError = p.lastErr
	p.mu.Unlock()
	return st
}

// Shutdown stops accepting, lets requests in flight finish and closes idle
// connections (HTTP/2 clients get a GOAWAY); when ctx ends first, the
// remaining connections are closed.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if !p.closing && p.stopSweep != nil {
		close(p.stopSweep)
	}
	p.closing = true
	ln := p.ln
	steerLn := p.steerLn
	p.mu.Unlock()
	p.draining.Store(true)
	if ln != nil && p.fastPath {
		ln.Close() // net/http closes the listeners it serves itself
	}
	if steerLn != nil {
		steerLn.Close()
	}
	err := p.srv.Shutdown(ctx)
	if err != nil {
		p.srv.Close()
	}
	if ferr := p.fastConns.drain(ctx); err == nil {
		err = ferr
	}
	if ferr := p.loops.drain(ctx); err == nil {
		err = ferr
	}
	p.up.closeIdle()
	return err
}
