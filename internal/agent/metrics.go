package agent

import (
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the agent's Prometheus metrics: the datapath's counters and
// map fill levels read at scrape time, sync durations observed as they
// happen.
type metrics struct {
	reg  *prometheus.Registry
	sync *prometheus.HistogramVec
	// udpDestroyed counts connected UDP sockets closed because their
	// service backend went away.
	udpDestroyed prometheus.Counter
	// proxy gathers the node proxy's own metrics (HTTP requests by route,
	// backend and code, latency), served with the agent's.
	proxy prometheus.Gatherer
	drift *drift // drift checks (drift.go)
}

var (
	descPackets = prometheus.NewDesc("shunt_datapath_packets_total",
		"Packets the tc programs handled (direction from-pod, to-pod, from-overlay) and calls of the socket hooks (direction connect, "+
			"sendmsg, recvmsg, getpeername), by outcome reason.", []string{"reason", "direction"}, nil)
	descBytes = prometheus.NewDesc("shunt_datapath_bytes_total",
		"Bytes the tc programs handled, by outcome reason and direction (0 for the socket hooks).", []string{"reason", "direction"}, nil)
	descFlows = prometheus.NewDesc("shunt_flows_emitted_total", "Flow events the datapath sent to the agent.", nil, nil)
	descLost  = prometheus.NewDesc("shunt_flows_lost_total",
		"Flow events lost because the ring buffer was full (the packets themselves were not affected).", nil, nil)
	descFollowerMissed = prometheus.NewDesc("shunt_flows_follower_missed_total",
		"Flows a slow `shunt observe -f` client did not receive.", nil, nil)
	descServices   = prometheus.NewDesc("shunt_services", "Service ports programmed in the datapath.", nil, nil)
	descEndpoints  = prometheus.NewDesc("shunt_service_endpoints", "Service backends programmed, summed over service ports.", nil, nil)
	descMapEntries = prometheus.NewDesc("shunt_map_entries", "Entries in a BPF map.", []string{"map"}, nil)
	descMapCap     = prometheus.NewDesc("shunt_map_capacity", "Maximum entries of a BPF map.", []string{"map"}, nil)
	descPods       = prometheus.NewDesc("shunt_pods", "Pods of this node.", nil, nil)
	descProgRuns   = prometheus.NewDesc("shunt_bpf_program_runs_total",
		"Runs of the BPF programs attached at a hook, counted while the kernel's run-time statistics are on (shuntd --bpf-stats); only then present.", []string{"hook"}, nil)
	descProgTime = prometheus.NewDesc("shunt_bpf_program_run_seconds_total",
		"Time the BPF programs attached at a hook ran, counted while the kernel's run-time statistics are on (shuntd --bpf-stats); only then present.", []string{"hook"}, nil)
	descProblems = prometheus.NewDesc("shunt_object_problems",
		"Things objects ask that shunt leaves out (e.g. IPv6 blocks), by kind and reason; the rest is programmed.", []string{"kind", "reason"}, nil)
)

func newMetrics(a *Agent) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		sync: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shunt_datapath_sync_duration_seconds",
			Help:    "Time to compute and write the datapath's state after a change, by step.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10), // 100µs .. 26s
		}, []string{"step"}),
		udpDestroyed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shunt_udp_sockets_destroyed_total",
			Help: "Connected UDP sockets closed because the service backend they were sent to went away.",
		}),
	}
	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "shunt_build_info", Help: "The running agent's build.",
		ConstLabels: prometheus.Labels{"version": version, "instance": a.cfg.Instance.Name},
	})
	info.Set(1)
	m.reg.MustRegister(m.sync, m.udpDestroyed, info, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), datapathCollector{a})
	m.drift = newDriftMetrics(m.reg)
	return m
}

func (m *metrics) observeSync(step string, d time.Duration) {
	m.sync.WithLabelValues(step).Observe(d.Seconds())
}

func (m *metrics) handler() http.Handler {
	g := prometheus.Gatherers{m.reg}
	if m.proxy != nil {
		g = append(g, m.proxy)
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// serveTCP serves /metrics on addr for Prometheus; returns the address
// actually bound (addr may ask for port 0).
func (m *metrics) serveTCP(addr string) (net.Addr, *http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return ln.Addr(), srv, nil
}

// datapathCollector reads the datapath at scrape time.
type datapathCollector struct{ a *Agent }

func (datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPackets, descBytes, descFlows, descLost, descFollowerMissed,
		descServices, descEndpoints, descMapEntries, descMapCap, descPods, descProblems, descProgRuns, descProgTime} {
		ch <- d
	}
}

func (c datapathCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	if counters, err := a.dp.Counters(); err == nil {
		for _, ct := range counters {
			ch <- prometheus.MustNewConstMetric(descPackets, prometheus.CounterValue, float64(ct.Packets), ct.Reason, ct.Direction)
			ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(ct.Bytes), ct.Reason, ct.Direction)
		}
	} else {
		ch <- prometheus.NewInvalidMetric(descPackets, err)
	}
	if emitted, lost, err := a.dp.FlowStats(); err == nil {
		ch <- prometheus.MustNewConstMetric(descFlows, prometheus.CounterValue, float64(emitted))
		ch <- prometheus.MustNewConstMetric(descLost, prometheus.CounterValue, float64(lost))
	}
	ch <- prometheus.MustNewConstMetric(descFollowerMissed, prometheus.CounterValue, float64(a.flows.Dropped()))
	ports, backends := a.rec.ServiceCount()
	pods := a.rec.EndpointCount()
	ch <- prometheus.MustNewConstMetric(descServices, prometheus.GaugeValue, float64(ports))
	ch <- prometheus.MustNewConstMetric(descEndpoints, prometheus.GaugeValue, float64(backends))
	ch <- prometheus.MustNewConstMetric(descPods, prometheus.GaugeValue, float64(pods))
	type kr struct{ kind, reason string }
	n := map[kr]int{}
	for _, p := range a.problems() {
		n[kr{p.Kind, p.Reason}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(descProblems, prometheus.GaugeValue, float64(v), k.kind, k.reason)
	}
	if a.dp.ProgramStatsOn() {
		if stats, err := a.dp.ProgramStats(); err == nil {
			for _, p := range stats {
				ch <- prometheus.MustNewConstMetric(descProgRuns, prometheus.CounterValue, float64(p.Runs), p.Hook)
				ch <- prometheus.MustNewConstMetric(descProgTime, prometheus.CounterValue, p.RunTime.Seconds(), p.Hook)
			}
		} else {
			ch <- prometheus.NewInvalidMetric(descProgRuns, err)
		}
	}
	if maps, err := a.dp.Maps(); err == nil {
		for _, m := range maps {
			if m.Entries >= 0 {
				ch <- prometheus.MustNewConstMetric(descMapEntries, prometheus.GaugeValue, float64(m.Entries), m.Name)
			}
			ch <- prometheus.MustNewConstMetric(descMapCap, prometheus.GaugeValue, float64(m.Capacity), m.Name)
		}
	} else {
		ch <- prometheus.NewInvalidMetric(descMapEntries, err)
	}
}
