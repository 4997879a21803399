package labtools

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// LoadResult is what `shunt lab http-load` prints. The JSON field names are
// stable: tests read them.
type LoadResult struct {
	Requests    int            `json:"requests"`
	ByPod       map[string]int `json:"byPod"`       // by X-Shunt-Pod, "" when a response had none
	ByStatus    map[string]int `json:"byStatus"`    // by status code
	Errors      int            `json:"errors"`      // requests that got no (whole) response
	Connections int            `json:"connections"` // connections opened
	FirstError  string         `json:"firstError,omitempty"`
}

// HTTPLoad sends n requests over conns keep-alive connections, each
// connection carrying its share one request after the other (n/conns, the
// first n%conns one more), and counts the responses by pod and by status.
//
// Each connection is its own client with a one-connection transport rather
// than one transport limited to conns connections: a shared pool would let
// a fast connection take another's requests, and HTTP/2 would put every
// request on one connection. This way Connections is conns (or n if
// smaller) unless the server or a proxy closed connections.
//
// rate > 0 spreads the requests at that many per second in all, so a load
// can outlast an event (a restart) a test makes happen in the middle.
func HTTPLoad(q Request, n, conns int, rate float64) LoadResult {
	res := LoadResult{Requests: n, ByPod: map[string]int{}, ByStatus: map[string]int{}}
	var (
		dialed atomic.Int64
		mu     sync.Mutex
		wg     sync.WaitGroup
	)
	for i := range conns {
		share := n / conns
		if i < n%conns {
			share++
		}
		if share == 0 {
			break
		}
		wg.Go(func() {
			c := q.client(&dialed)
			defer c.CloseIdleConnections()
			var pace *time.Ticker
			if rate > 0 {
				pace = time.NewTicker(time.Duration(float64(conns) / rate * float64(time.Second)))
				defer pace.Stop()
			}
			for range share {
				if pace != nil {
					<-pace.C
				}
				pod, code, err := send(c, q)
				mu.Lock()
				if err != nil {
					res.Errors++
					if res.FirstError == "" {
						res.FirstError = err.Error()
					}
				} else {
					res.ByPod[pod]++
					res.ByStatus[strconv.Itoa(code)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Connections = int(dialed.Load())
	return res
}

// send makes one request and reads the response to its end: the transport
// puts a connection back for the next request only once its body was read
// to EOF and closed.
func send(c *http.Client, q Request) (pod string, code int, err error) {
	req, err := q.build(context.Background())
	if err != nil {
		return "", 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return "", 0, err
	}
	return resp.Header.Get("X-Shunt-Pod"), resp.StatusCode, nil
}
