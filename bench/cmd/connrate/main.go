// Command connrate measures new TCP connections per second: each worker
// loops connect, send a 4-byte request, read the reply, close. This is the
// cost that rule walks add (persistent connections hide it: conntrack
// caches the translation after the first packet).
//
// Besides the rate it counts the connections that stalled, by the step
// that stalled: a connect of 900 ms or more waited for a SYN retransmitted
// after TCP's initial 1-second timeout (the SYN or the SYN-ACK was lost, or
// answered by something other than a SYN-ACK); a request/reply of 190 ms
// or more waited for a segment retransmitted after TCP's minimum
// retransmission timeout (200 ms). A rate that collapses with 0 failed
// connections says which by these counts.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Stall thresholds, just under the kernel's timeouts they reveal.
const (
	connectStall  = 900 * time.Millisecond // TCP_TIMEOUT_INIT (1 s): a SYN retransmitted
	exchangeStall = 190 * time.Millisecond // TCP_RTO_MIN (200 ms): a data segment retransmitted
)

// stalls counts the connections that waited for a retransmission, and the
// longest wait of each step.
type stalls struct {
	slowConnects, slowExchanges atomic.Int64
	maxConnect, maxExchange     atomic.Int64 // nanoseconds
}

func (s *stalls) note(connect, exchange time.Duration) {
	if connect >= connectStall {
		s.slowConnects.Add(1)
	}
	if exchange >= exchangeStall {
		s.slowExchanges.Add(1)
	}
	raise(&s.maxConnect, int64(connect))
	raise(&s.maxExchange, int64(exchange))
}

func raise(v *atomic.Int64, to int64) {
	for {
		cur := v.Load()
		if to <= cur || v.CompareAndSwap(cur, to) {
			return
		}
	}
}

// fields are the stall counts as connrate's JSON output names them.
func (s *stalls) fields() map[string]any {
	return map[string]any{
		"slow_connects": s.slowConnects.Load(), "slow_exchanges": s.slowExchanges.Load(),
		"max_connect_ms": float64(s.maxConnect.Load()) / 1e6, "max_exchange_ms": float64(s.maxExchange.Load()) / 1e6,
	}
}

func main() {
	target := flag.String("target", "", "HOST:PORT to connect to; several, comma-separated, are picked at random per connection")
	workers := flag.Int("workers", 4, "concurrent connection loops")
	duration := flag.Duration("duration", 10*time.Second, "how long to run")
	timeout := flag.Duration("timeout", 2*time.Second, "per-connection timeout")
	flag.Parse()
	if *target == "" {
		fmt.Fprintln(os.Stderr, "usage: connrate -target HOST:PORT [-workers 4] [-duration 10s]")
		os.Exit(2)
	}
	targets := strings.Split(*target, ",")
	var ok, failed atomic.Int64
	var st stalls
	var firstErr atomic.Value
	deadline := time.Now().Add(*duration)
	var wg sync.WaitGroup
	start := time.Now()
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 512)
			for time.Now().Before(deadline) {
				// Spreading over the same backends as a service does makes
				// the direct case a fair floor (same servers, same caches).
				if err := once(targets[rand.IntN(len(targets))], *timeout, buf, &st); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	res := map[string]any{"connections": ok.Load(), "failed": failed.Load(), "seconds": elapsed,
		"rate": float64(ok.Load()) / elapsed}
	for k, v := range st.fields() {
		res[k] = v
	}
	if e := firstErr.Load(); e != nil {
		res["first_error"] = e
	}
	json.NewEncoder(os.Stdout).Encode(res)
	if ok.Load() == 0 {
		os.Exit(1)
	}
}

// once makes one connection: connect, a 4-byte request, the reply, close.
// A connection that succeeds is noted in st with how long each step took.
func once(target string, timeout time.Duration, buf []byte, st *stalls) error {
	t0 := time.Now()
	c, err := net.DialTimeout("tcp", target, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	t1 := time.Now()
	c.SetDeadline(t1.Add(timeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	if _, err := c.Read(buf); err != nil {
		return err
	}
	st.note(t1.Sub(t0), time.Since(t1))
	return nil
}
