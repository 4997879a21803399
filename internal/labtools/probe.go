package labtools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"
)

// Result of one probe attempt. The JSON field names are stable.
type Result struct {
	Proto  string `json:"proto"`
	Target string `json:"target"`
	Result string `json:"result"` // connected, refused, timeout, error
	Reply  string `json:"reply,omitempty"`
	Peer   string `json:"peer,omitempty"` // the name of the server that answered
	Local  string `json:"local,omitempty"`
	Remote string `json:"remote,omitempty"` // for UDP: where the reply came from
	Status int    `json:"status,omitempty"` // HTTP status code
	RTTus  int64  `json:"rtt_us"`
	Error  string `json:"error,omitempty"`
}

// Outcomes a probe can have.
const (
	Connected = "connected"
	Refused   = "refused"
	Timeout   = "timeout"
	Failed    = "error"
)

// ProbeOptions tune every attempt.
type ProbeOptions struct {
	Timeout      time.Duration
	Send         string
	UDPConnected bool          // use a connected UDP socket (sees ICMP port unreachable)
	Hold         time.Duration // TCP: keep the connection this long, then talk again
}

// classify maps a network error to an outcome.
func classify(r *Result, err error) Result {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		r.Result = Refused
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		r.Result = Timeout
	default:
		r.Result = Failed
	}
	r.Error = err.Error()
	return *r
}

// ProbeTCP connects, sends, and waits for the reply.
func ProbeTCP(target string, o ProbeOptions) Result {
	r := Result{Proto: "tcp", Target: target}
	start := time.Now()
	c, err := net.DialTimeout("tcp", target, o.Timeout)
	if err != nil {
		return classify(&r, err)
	}
	defer c.Close()
	r.Local, r.Remote = c.LocalAddr().String(), c.RemoteAddr().String()
	c.SetDeadline(start.Add(o.Timeout))
	if _, err := io.WriteString(c, o.Send); err != nil {
		return classify(&r, err)
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if n == 0 {
		if err == nil || errors.Is(err, io.EOF) {
			err = errors.New("connected but the server closed without replying")
		}
		res := classify(&r, err)
		if res.Result == Timeout {
			res.Error = "connected but no reply: " + res.Error
		}
		return res
	}
	reply := string(buf[:n])
	if o.Hold > 0 {
		// An established connection must survive whatever happens
		// meanwhile (backends scaled, service deleted): talk again.
		time.Sleep(o.Hold)
		c.SetDeadline(time.Now().Add(o.Timeout))
		if _, err := io.WriteString(c, o.Send); err != nil {
			res := classify(&r, err)
			res.Result, res.Error = Failed, "connection broken after hold: "+res.Error
			return res
		}
		if n, err := c.Read(buf); n == 0 {
			if err == nil {
				err = io.EOF
			}
			res := classify(&r, err)
			res.Result, res.Error = Failed, "connection broken after hold: "+res.Error
			return res
		}
	}
	return r.answered(reply, start)
}

func (r Result) answered(reply string, start time.Time) Result {
	r.RTTus = time.Since(start).Microseconds()
	r.Result = Connected
	r.Reply = strings.TrimRight(reply, " \r\n\t")
	r.Peer = firstWord(r.Reply)
	return r
}

// ProbeUDP sends one datagram and waits for the answer. By default the
// socket is unconnected, the way resolvers use UDP, and the reply's source
// address is reported: it must be the address the probe sent to.
func ProbeUDP(target string, o ProbeOptions) Result {
	r := Result{Proto: "udp", Target: target}
	raddr, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return classify(&r, err)
	}
	start := time.Now()
	var c *net.UDPConn
	if o.UDPConnected {
		c, err = net.DialUDP("udp", nil, raddr)
	} else {
		c, err = net.ListenUDP("udp", nil)
	}
	if err != nil {
		return classify(&r, err)
	}
	defer c.Close()
	c.SetDeadline(start.Add(o.Timeout))
	if o.UDPConnected {
		_, err = c.Write([]byte(o.Send))
	} else {
		_, err = c.WriteToUDP([]byte(o.Send), raddr)
	}
	if err != nil {
		return classify(&r, err)
	}
	r.Local = c.LocalAddr().String()
	buf := make([]byte, 65535)
	n, from, err := c.ReadFromUDP(buf)
	if err != nil {
		return classify(&r, err)
	}
	r.Remote = from.String()
	return r.answered(string(buf[:n]), start)
}

// ProbeHTTP issues one GET on a fresh connection.
func ProbeHTTP(url string, o ProbeOptions) Result {
	r := Result{Proto: "http", Target: url}
	client := &http.Client{Timeout: o.Timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	resp, err := client.Get(url)
	if err != nil {
		return classify(&r, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	r = r.answered(string(body), start)
	r.Status = resp.StatusCode
	if p := resp.Header.Get("X-Shunt-Pod"); p != "" {
		r.Peer = p
	}
	return r
}

// Summary counts results by outcome and by answering peer, e.g.
// "tcp 10.0.0.5:80: 10 connected (backend-a 6, backend-b 4)".
func Summary(results []Result) string {
	if len(results) == 0 {
		return ""
	}
	outcomes, peers := counter{}, counter{}
	for _, r := range results {
		outcomes.add(r.Result)
		if r.Peer != "" {
			peers.add(r.Peer)
		}
	}
	s := fmt.Sprintf("%s %s: %s", results[0].Proto, results[0].Target, outcomes.format(true))
	if len(peers.keys) > 0 {
		s += " (" + peers.format(false) + ")"
	}
	return s
}

// counter counts strings in first-seen order.
type counter struct {
	keys []string
	n    map[string]int
}

func (c *counter) add(k string) {
	if c.n == nil {
		c.n = map[string]int{}
	}
	if c.n[k] == 0 {
		c.keys = append(c.keys, k)
	}
	c.n[k]++
}

// format prints "6 connected, 1 timeout" (countFirst) or "a 6, b 4".
func (c counter) format(countFirst bool) string {
	parts := make([]string, len(c.keys))
	for i, k := range c.keys {
		if countFirst {
			parts[i] = fmt.Sprintf("%d %s", c.n[k], k)
		} else {
			parts[i] = fmt.Sprintf("%s %d", k, c.n[k])
		}
	}
	return strings.Join(parts, ", ")
}
