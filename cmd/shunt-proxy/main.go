// Command shunt-proxy is the node L7 proxy. The agent starts it in the
// proxy cgroup, in its own session, and configures it on the control
// socket; it keeps serving its last configuration when the agent is gone.
// On SIGTERM it stops accepting and drains (SO_REUSEPORT lets its successor
// listen on the same address first).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/proxy"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "shunt-proxy:", err)
		os.Exit(1)
	}
}

type options struct {
	control, configFile, logFile, logLevel string
	grace, handover                        time.Duration
}

func newRootCmd() *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:           "shunt-proxy --control SOCKET [--config-file FILE]",
		Short:         "shunt's node L7 proxy: HTTP routes and HTTP policy for redirected pod connections",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          func(*cobra.Command, []string) error { return run(o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.control, "control", "", "unix socket of the control API (required)")
	f.StringVar(&o.configFile, "config-file", "", "where the last pushed configuration is kept; served at start")
	f.StringVar(&o.logFile, "log-file", "", "append logs here (default: stderr)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.DurationVar(&o.grace, "grace", 30*time.Second, "on SIGTERM, how long requests in flight may take to finish")
	f.DurationVar(&o.handover, "handover-wait", time.Second,
		"on SIGTERM, how long to keep accepting while waiting for a successor to take the control socket")
	cmd.MarkFlagRequired("control")
	return cmd
}

func run(o options) error {
	log, closeLog, err := openLog(o.logFile, o.logLevel)
	if err != nil {
		return err
	}
	defer closeLog()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// See bench/RESULTS.md, Mesh, for what SHUNT_PROXY_GOMAXPROCS changes.
	if err := proxy.SetProcs(); err != nil {
		return err
	}
	// A short scheduling slice, so a request's wake-up does not queue
	// behind busy pods (see SetSlice; bench/RESULTS.md, Mesh).
	slice, err := proxy.SliceSetting(proxy.DefaultSlice)
	if err != nil {
		return err
	}
	if slice, err = proxy.SetSlice(slice); err != nil {
		log.Warn("scheduling slice left at the kernel's default", "err", err)
	}

	// SHUNT_PROXY_NET_HTTP_ONLY=1 turns the HTTP/1.1 fast path off: every
	// request through net/http's reverse proxy, as before it existed.
	// SHUNT_PROXY_NO_EVENT_LOOP=1 keeps the fast path without its event
	// loops (a goroutine per connection); SHUNT_PROXY_EVENT_LOOPS=N sets
	// how many loops (default: one fewer than GOMAXPROCS, at least one).
	p := proxy.New(proxy.Options{Log: log, ConfigFile: o.configFile, NetHTTPOnly: os.Getenv("SHUNT_PROXY_NET_HTTP_ONLY") == "1",
		NoEventLoop: os.Getenv("SHUNT_PROXY_NO_EVENT_LOOP") == "1"})
	// Listen on the saved configuration's address before taking the
	// control socket: a predecessor that sees its socket taken may stop
	// accepting (see waitForSuccessor).
	if err := p.LoadConfigFile(); err != nil {
		log.Error("starting without a configuration until the agent pushes one", "err", err)
	}
	ctl, err := listenControl(o.control)
	if err != nil {
		return err
	}
	ctlSrv := &http.Server{Handler: p.ControlHandler(), ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() {
		if err := ctlSrv.Serve(ctl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("control API stopped", "err", err)
		}
	}()
	st := p.Status()
	log.Info("proxy started", "pid", st.PID, "control", o.control, "version", st.Version, "listen", st.Listen,
		"gomaxprocs", runtime.GOMAXPROCS(0), "fast path", os.Getenv("SHUNT_PROXY_NET_HTTP_ONLY") != "1", "event loops", p.EventLoops(), "slice", slice)

	<-ctx.Done()
	stop()
	if waitForSuccessor(o.control, o.handover) {
		log.Info("a successor took over; draining")
	} else {
		log.Info("stopping; draining")
	}
	sctx, cancel := context.WithTimeout(context.Background(), o.grace)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		log.Warn("grace period over: closed the connections still busy", "grace", o.grace, "err", err)
	}
	ctlSrv.Close() // after draining: the flows of the last requests were streamed
	log.Info("proxy stopped")
	return nil
}

func openLog(path, level string) (*slog.Logger, func(), error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("--log-level: %w", err)
	}
	out, closeLog := os.Stderr, func() {}
	if path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("--log-file: %w", err)
		}
		out, closeLog = f, func() { f.Close() }
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: lv})), closeLog, nil
}

// listenControl takes the control socket's path, replacing a
// predecessor's socket (which keeps serving its open connections).
func listenControl(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("replacing the control socket %s: %w", path, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// The path may belong to a successor by the time this proxy exits:
	// never remove it on close.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return ln, nil
}
