package agent

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/proxy"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// TestRestartedAgentKeepsTheProxysConfiguration: a proxy serves the
// complete configuration an earlier agent pushed. The new agent's source
// is held back, so its reconciler gives only what it computed without the
// objects (incomplete: no routes, no services) and the agent's start has
// finished waiting: nothing may reach the proxy. The first complete
// configuration does.
func TestRestartedAgentKeepsTheProxysConfiguration(t *testing.T) {
	dir := t.TempDir()
	running := proxy.New(proxy.Options{ConfigFile: filepath.Join(dir, "proxy-config.json")})
	earlier := proxyapi.Config{Version: 1, Complete: true, Listen: "127.0.0.1:0", Mark: DefaultProxyMark,
		Services: []proxyapi.Service{{Name: "default/reviews", VIP: "10.96.0.7", Port: 9080, Backends: []proxyapi.Backend{{IP: "10.244.0.9", Port: 9080}}}},
		Routes: []proxyapi.Route{{Name: "default/reviews-split", Parents: []proxyapi.ParentRef{{Service: "default/reviews"}},
			Rules: []proxyapi.RouteRule{{Backends: []proxyapi.RouteBackend{{Service: "default/reviews", Port: 9080, Weight: 1}}}}}},
	}
	if err := running.Apply(earlier); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { running.Shutdown(context.Background()) })
	ln, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: running.ControlHandler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	listen := netip.MustParseAddrPort(running.Addr().String())

	np := newNodeProxy(slog.New(slog.DiscardHandler), "/nonexistent/shunt-proxy", dir, dir, listen, DefaultProxyMark, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inForce := func() proxyapi.Config {
		t.Helper()
		cfg, ok := running.Config()
		if !ok {
			t.Fatal("the proxy lost its configuration")
		}
		return cfg
	}

	np.step(ctx) // the new agent finds the proxy: nothing given yet
	np.Set(proxyapi.Config{Endpoints: []proxyapi.Endpoint{{IP: "10.244.0.5", Identity: 1000}}})
	np.step(ctx)
	np.Synced() // even once the start stopped waiting (say, its wait failed)
	np.step(ctx)
	if cfg := inForce(); cfg.Version != earlier.Version || len(cfg.Routes) != 1 {
		t.Fatalf("after an incomplete configuration: version %d with %d routes in force, want the earlier agent's (version %d, 1 route)",
			cfg.Version, len(cfg.Routes), earlier.Version)
	}
	if st := np.Status(ctx); st.Error != "" {
		t.Errorf("status: %q, want no error (nothing was pushed)", st.Error)
	}

	complete := earlier
	complete.Version, complete.Listen = 0, ""
	np.Set(complete)
	np.step(ctx)
	if cfg := inForce(); cfg.Version <= earlier.Version || !cfg.Complete || len(cfg.Routes) != 1 {
		t.Errorf("after the complete configuration: %+v, want it in force with a newer version", cfg)
	}
}
