package proxy

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's own registry, served on the control socket.
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	denied   *prometheus.CounterVec
	mirrored *prometheus.CounterVec

	// children keeps the request counter and duration histogram of each
	// route, backend and status seen: WithLabelValues hashes and checks
	// every label value on each call, and every request would pay it.
	// The vectors never drop a child, so neither does this.
	mu       sync.RWMutex
	children map[requestLabels]requestMetrics
}

type requestLabels struct {
	route, backend string
	code           int
}

type requestMetrics struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

// forRequest is the metrics of a request to route (empty: none) and
// backend answered code (0: none).
func (m *metrics) forRequest(route, backend string, code int) requestMetrics {
	key := requestLabels{route, backend, code}
	m.mu.RLock()
	rm, ok := m.children[key]
	m.mu.RUnlock()
	if ok {
		return rm
	}
	rm = requestMetrics{m.requests.WithLabelValues(route, backend, strconv.Itoa(code)), m.duration.WithLabelValues(route)}
	m.mu.Lock()
	m.children[key] = rm
	m.mu.Unlock()
	return rm
}

func newMetrics(p *Proxy) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(), children: map[requestLabels]requestMetrics{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shunt_proxy_http_requests_total",
			Help: "HTTP requests by route, backend (service port or pod) and status answered (0: none).",
		}, []string{"route", "backend", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shunt_proxy_http_request_duration_seconds",
			Help:    "Time from a request to the end of its response, by route.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5ms to 16s
		}, []string{"route"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shunt_proxy_http_denied_total",
			Help: "HTTP requests answered 403, by reason (policy-denied, policy-not-allowed, identity-not-carried) and deciding rule.",
		}, []string{"reason", "rule"}),
		mirrored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shunt_proxy_mirrored_requests_total",
			Help: "Copies of requests for a route's RequestMirror filters, by route, mirror (service port) and outcome " +
				"(answered, failed, fell-behind, busy, no-endpoints, policy-denied).",
		}, []string{"route", "mirror", "outcome"}),
	}
	counter := func(name, help string, v func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) })
	}
	gauge := func(name, help string, v func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, v)
	}
	m.reg.MustRegister(m.requests, m.duration, m.denied, m.mirrored,
		counter("shunt_proxy_connections_total", "Connections accepted.", p.stats.conns.Load),
		gauge("shunt_proxy_active_connections", "Client connections open.", func() float64 { return float64(p.stats.active.Load()) }),
		newHandoffCollector(&p.stats.handoffs),
		counter("shunt_proxy_original_dst_errors_total", "Connections closed because their original destination was unknown.", p.stats.origDstErrors.Load),
		counter("shunt_proxy_flows_dropped_total", "Flow records readers of /flows missed because they did not keep up.", p.flows.dropped.Load),
		counter("shunt_proxy_config_errors_total", "Configurations refused, or in force but not saved.", p.stats.configErrors.Load),
		gauge("shunt_proxy_config_version", "Version of the configuration in force (0: none).", func() float64 {
			if t := p.table.Load(); t != nil {
				return float64(t.cfg.Version)
			}
			return 0
		}),
	)
	return m
}
