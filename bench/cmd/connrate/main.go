// Command connrate measures new TCP connections per second: each worker
// loops connect, send a 4-byte request, read the reply, close. This is the
// cost that rule walks add (persistent connections hide it: conntrack
// caches the translation after the first packet).
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
				if err := once(targets[rand.IntN(len(targets))], *timeout, buf); err != nil {
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
	if e := firstErr.Load(); e != nil {
		res["first_error"] = e
	}
	json.NewEncoder(os.Stdout).Encode(res)
	if ok.Load() == 0 {
		os.Exit(1)
	}
}

func once(target string, timeout time.Duration, buf []byte) error {
	c, err := net.DialTimeout("tcp", target, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	_, err = c.Read(buf)
	return err
}
