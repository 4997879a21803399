package proxy

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Hand-offs: a connection the event loop does not serve goes, with the
// bytes read, to a goroutine of its own (eventLoop.handOff); one the
// goroutine's fast path does not serve goes to net/http's reverse proxy
// (fastConn.handOff). Each costs goroutine wake-ups and, for net/http,
// its per-request allocations, so they are counted by path and reason:
// one atomic add per hand-off, no lock, no allocation; the metrics read
// the counts when scraped.

// handoffPath is which fast path a connection left.
type handoffPath uint8

const (
	pathLoop handoffPath = iota // the event loop, to a goroutine per connection
	pathFast                    // the goroutine's fast path, to net/http
	numHandoffPaths
)

var handoffPathNames = [numHandoffPaths]string{"loop", "fast"}

// handoffReason is why a connection was handed off.
type handoffReason uint8

const (
	// handoffHeadInPieces: the head did not come in one read (loop).
	handoffHeadInPieces handoffReason = iota
	// handoffTooLong: the head (loop: the request) filled the read buffer.
	handoffTooLong
	// handoffNotPlain: the strict parser did not take the head: h2c's
	// preface, Upgrade, Expect, a chunked body, HTTP/1.0, odd framing.
	handoffNotPlain
	// handoffBodyInPieces: the body did not come whole with its head (loop).
	handoffBodyInPieces
	// handoffPipelined: more than one request in a read, or the client
	// sent more while its request was in flight (loop).
	handoffPipelined
	// handoffFilters: the route's filters have no fast equivalent.
	handoffFilters
	// handoffTimers: the service's routes have timeouts or retries (loop).
	handoffTimers
	numHandoffReasons
)

var handoffReasonNames = [numHandoffReasons]string{
	"head-in-pieces", "too-long", "not-plain", "body-in-pieces", "pipelined", "filters", "timers",
}

// handoffReasonsOf are the reasons each path can give: the goroutine's
// fast path waits for a head in pieces, takes bodies as they come and
// serves timers.
var handoffReasonsOf = [numHandoffPaths][]handoffReason{
	pathLoop: {handoffHeadInPieces, handoffTooLong, handoffNotPlain, handoffBodyInPieces, handoffPipelined, handoffFilters, handoffTimers},
	pathFast: {handoffTooLong, handoffNotPlain, handoffFilters},
}

// handoffCounts counts hand-offs by path and reason.
type handoffCounts [numHandoffPaths][numHandoffReasons]atomic.Uint64

func (h *handoffCounts) add(path handoffPath, reason handoffReason) { h[path][reason].Add(1) }

// total is the hand-offs of one path, for every reason.
func (h *handoffCounts) total(path handoffPath) uint64 {
	var n uint64
	for i := range h[path] {
		n += h[path][i].Load()
	}
	return n
}

// handoffCollector exports the counts as shunt_proxy_handoffs_total.
type handoffCollector struct {
	counts *handoffCounts
	desc   *prometheus.Desc
}

func newHandoffCollector(counts *handoffCounts) *handoffCollector {
	return &handoffCollector{counts: counts, desc: prometheus.NewDesc("shunt_proxy_handoffs_total",
		"Client connections a fast path handed on, by path (loop: from the event loop to a goroutine per connection; "+
			"fast: from that goroutine's fast path to net/http) and reason (head-in-pieces, too-long, not-plain, "+
			"body-in-pieces, pipelined, filters, timers).",
		[]string{"path", "reason"}, nil)}
}

func (c *handoffCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *handoffCollector) Collect(ch chan<- prometheus.Metric) {
	for path, reasons := range handoffReasonsOf {
		for _, r := range reasons {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.counts[path][r].Load()),
				handoffPathNames[path], handoffReasonNames[r])
		}
	}
}
