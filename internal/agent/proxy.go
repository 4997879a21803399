package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/proxyapi"
	"github.com/shuntnet/shunt/internal/steerroute"
)

// The node proxy (cmd/shunt-proxy) is its own process, so an agent restart
// drops no proxied connection: the agent starts it (or adopts the one an
// earlier agent started), pushes every new configuration, restarts it when
// it dies, and relays its HTTP flows into the agent's flow history.

// DefaultProxyPort is where the node proxy listens on the node address.
const DefaultProxyPort = 15001

// DefaultProxyMark is the SO_MARK layout of the proxy's upstream sockets:
// 0x5e in the top byte says "the proxy", the lower 24 bits carry the
// client's identity (pod identities are below 1<<24).
var DefaultProxyMark = proxyapi.Mark{Magic: 0x5e000000, Mask: 0xff000000}

// DefaultProxySteerPort is the port of the node proxy's transparent
// listener on the node address, to which the tc programs give connections
// from off the node to local pods' ports with HTTP rules (bpf/lib/steer.h).
const DefaultProxySteerPort = 15006

// proxySteer is how steered packets reach the node's stack: their mark
// (not a proxy upstream mark: its top byte is not DefaultProxyMark's) and
// the routing table and rule priority that deliver them locally.
func proxySteer(nodeIP netip.Addr) *datapath.ProxySteer {
	return &datapath.ProxySteer{
		Listen:  netip.AddrPortFrom(nodeIP, DefaultProxySteerPort),
		Routing: steerroute.Routing{Mark: 0x5f000000, Table: 0x5f, Priority: 95},
	}
}

type nodeProxy struct {
	log    *slog.Logger
	exe    string
	dir    string // control socket, config file, pid file, log
	cgroup string // the cgroup it runs in (SO_ORIGINAL_DST is answered there)
	listen netip.AddrPort
	steer  netip.AddrPort // the transparent listener; invalid: none
	mark   proxyapi.Mark
	client *proxyapi.Client
	onFlow func(flows.Flow)

	mu      sync.Mutex
	want    proxyapi.Config // the latest configuration, versioned
	pushed  uint64          // the version the proxy confirmed
	lastErr string          // why the last push or start failed
	kick    chan struct{}
	pid     int
	// synced is false until a sync covered everything the source
	// delivered at start: a configuration computed before that lacks
	// routes, and pushing it to a proxy that survived an agent restart
	// would answer 404 for a moment. Until then, and as long as the
	// reconciler has given no configuration marked Complete, nothing is
	// pushed and the proxy keeps the last one it had (the proxy itself
	// also refuses an incomplete configuration over a complete one).
	synced bool
}

func newNodeProxy(log *slog.Logger, exe, dir, cgroupDir string, listen netip.AddrPort, mark proxyapi.Mark, onFlow func(flows.Flow)) *nodeProxy {
	p := &nodeProxy{
		log: log.With("component", "proxy"), exe: exe, dir: dir, cgroup: cgroupDir, listen: listen, mark: mark,
		client: proxyapi.NewClient(filepath.Join(dir, "proxy.sock")), onFlow: onFlow, kick: make(chan struct{}, 1),
	}
	p.want = proxyapi.Config{Version: p.nextVersion(0), Listen: listen.String(), Mark: mark}
	return p
}

// nextVersion: versions only grow, across agent restarts too (the proxy
// refuses an older one): wall-clock nanoseconds, above the last one.
func (p *nodeProxy) nextVersion(last uint64) uint64 {
	return max(uint64(time.Now().UnixNano()), last+1)
}

// Set records a new configuration from the reconciler; it never blocks.
func (p *nodeProxy) Set(cfg proxyapi.Config) {
	p.mu.Lock()
	cfg.Listen, cfg.Mark = p.listen.String(), p.mark
	if p.steer.IsValid() {
		cfg.SteerListen = p.steer.String()
	}
	cfg.Version = p.want.Version
	if !reflect.DeepEqual(cfg, p.want) {
		cfg.Version = p.nextVersion(p.want.Version)
		p.want = cfg
	}
	p.mu.Unlock()
	p.poke()
}

// Synced says the source has delivered everything: from now on each
// configuration is complete and is pushed.
func (p *nodeProxy) Synced() {
	p.mu.Lock()
	p.synced = true
	p.mu.Unlock()
	p.poke()
}

func (p *nodeProxy) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run keeps the proxy running and configured until ctx ends; the proxy
// itself keeps running after.
func (p *nodeProxy) Run(ctx context.Context) {
	go p.relayFlows(ctx)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		p.step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-p.kick:
		}
	}
}

// step makes sure a proxy runs and has the latest configuration.
func (p *nodeProxy) step(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := p.client.Status(cctx)
	if err != nil {
		if perr := p.start(); perr != nil {
			p.setErr(perr)
			return
		}
		if st, err = p.waitReady(ctx); err != nil {
			p.setErr(fmt.Errorf("the proxy did not answer after starting: %w", err))
			return
		}
	}
	p.mu.Lock()
	want, ready := p.want, p.synced && p.want.Complete
	p.mu.Unlock()
	if !ready {
		return
	}
	if st.Version >= want.Version {
		p.confirm(st.Version)
		return
	}
	if err := p.client.PushConfig(cctx, want); err != nil {
		p.setErr(fmt.Errorf("configuring the proxy: %w", err))
		return
	}
	p.confirm(want.Version)
}

func (p *nodeProxy) confirm(v uint64) {
	p.mu.Lock()
	p.pushed, p.lastErr = v, ""
	p.mu.Unlock()
}

func (p *nodeProxy) setErr(err error) {
	p.mu.Lock()
	changed := p.lastErr != err.Error()
	p.lastErr = err.Error()
	p.mu.Unlock()
	if changed {
		p.log.Error("node proxy", "err", err)
	}
}

func (p *nodeProxy) waitReady(ctx context.Context) (proxyapi.Status, error) {
	var err error
	for i := 0; i < 100; i++ {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		var st proxyapi.Status
		st, err = p.client.Status(cctx)
		cancel()
		if err == nil {
			return st, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return proxyapi.Status{}, err
}

// start runs a new proxy in the proxy cgroup, in its own session so it
// outlives the agent. The proxy serves the configuration file it finds,
// so a restarted proxy is configured before the agent pushes.
func (p *nodeProxy) start() error {
	cg, err := unix.Open(p.cgroup, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the proxy cgroup %s: %w", p.cgroup, err)
	}
	defer unix.Close(cg)
	logf, err := os.OpenFile(filepath.Join(p.dir, "proxy.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(p.exe, "--control", filepath.Join(p.dir, "proxy.sock"),
		"--config-file", filepath.Join(p.dir, "proxy-config.json"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: cg}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the node proxy %s: %w (is shunt-proxy built next to shuntd? `make build`)", p.exe, err)
	}
	go cmd.Wait() // reap it if it exits while this agent runs
	p.mu.Lock()
	p.pid = cmd.Process.Pid
	p.mu.Unlock()
	os.WriteFile(filepath.Join(p.dir, "proxy.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	p.log.Info("node proxy started", "pid", cmd.Process.Pid, "listen", p.listen)
	return nil
}

// Restart starts a new proxy next to the running one (both listen, with
// SO_REUSEPORT), then asks the old one to drain: connections not in flight
// on the old one lose nothing.
func (p *nodeProxy) Restart(ctx context.Context) error {
	old := p.runningPID()
	if err := p.start(); err != nil {
		return err
	}
	p.mu.Lock()
	successor := p.pid
	p.mu.Unlock()
	// The successor answers on the control socket only once it listens:
	// until then the old one must keep accepting.
	for {
		p.client.CloseIdleConnections()
		st, err := p.waitReady(ctx)
		if err != nil {
			return fmt.Errorf("the new proxy (pid %d) did not answer; the old one keeps serving: %w", successor, err)
		}
		if st.PID == successor {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the new proxy (pid %d) did not take over; the old one keeps serving: %w", successor, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if old > 0 && old != successor {
		if err := syscall.Kill(old, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("asking the old proxy (pid %d) to drain: %w", old, err)
		}
	}
	return nil
}

// runningPID is the pid of the proxy this agent (or an earlier one)
// started, if it still runs in the proxy cgroup.
func (p *nodeProxy) runningPID() int {
	b, err := os.ReadFile(filepath.Join(p.dir, "proxy.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	procs, _ := os.ReadFile(filepath.Join(p.cgroup, "cgroup.procs"))
	for _, f := range strings.Fields(string(procs)) {
		if f == strconv.Itoa(pid) {
			return pid
		}
	}
	return 0
}

// relayFlows follows the proxy's HTTP flows into the agent's history,
// reconnecting when the proxy restarts.
func (p *nodeProxy) relayFlows(ctx context.Context) {
	for ctx.Err() == nil {
		err := p.client.Flows(ctx, p.onFlow)
		if ctx.Err() != nil {
			return
		}
		p.log.Debug("proxy flow stream ended; reconnecting", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Status says how the proxy is doing, for `shunt status`.
func (p *nodeProxy) Status(ctx context.Context) api.ProxyStatus {
	p.mu.Lock()
	out := api.ProxyStatus{Listen: p.listen.String(), WantedVersion: p.want.Version, Routes: len(p.want.Routes),
		Policies: len(p.want.Policies), Error: p.lastErr}
	p.mu.Unlock()
	out.PID = p.runningPID()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if st, err := p.client.Status(cctx); err == nil {
		out.Healthy, out.Version = true, st.Version
		out.Requests, out.Active = st.Requests, st.ActiveConnections
	} else if out.Error == "" {
		out.Error = err.Error()
	}
	return out
}

// proxyStatus adds what the datapath redirects to the proxy's status.
func (a *Agent) proxyStatus(ctx context.Context) api.ProxyStatus {
	st := a.proxy.Status(ctx)
	if rs, err := a.dp.L7Redirects(); err == nil {
		st.Redirected = len(rs)
	}
	return st
}

func (a *Agent) handleProxyRestart(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if err := a.proxy.Restart(ctx); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, a.proxyStatus(r.Context()))
}

// addProxyFlow takes an HTTP flow of the proxy into the history observe reads.
func (a *Agent) addProxyFlow(fl flows.Flow) { a.flows.Add(fl) }

// Gather reads the proxy's metrics (its Prometheus text) for the agent's
// /metrics. A proxy that does not answer contributes nothing; its state
// shows in `shunt status`.
func (p *nodeProxy) Gather() ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	text, err := p.client.MetricsText(ctx)
	if err != nil {
		return nil, nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("reading the proxy's metrics: %w", err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		out = append(out, fams[name])
	}
	return out, nil
}
