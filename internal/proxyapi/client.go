package proxyapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/shuntnet/shunt/internal/flows"
)

// Client talks to the proxy's control socket.
type Client struct {
	hc *http.Client
}

// NewClient returns a client of the control API on a unix socket.
func NewClient(socket string) *Client {
	return &Client{hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}}
}

// CloseIdleConnections drops kept-alive connections, so the next call
// reaches whichever proxy holds the socket's path now (a successor takes
// it over while its predecessor still serves the connections it has).
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Error is an answer of the proxy other than 200: Code 400 is an invalid
// configuration (Message names the field), 409 an older version than the
// one in force.
type Error struct {
	Code    int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("proxy: %s (HTTP %d)", e.Message, e.Code) }

// PushConfig replaces the proxy's configuration.
func (c *Client) PushConfig(ctx context.Context, cfg Config) error {
	body, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, "/config", bytes.NewReader(body), nil)
}

// Config is the configuration in force.
func (c *Client) Config(ctx context.Context) (Config, error) {
	var cfg Config
	return cfg, c.do(ctx, http.MethodGet, "/config", nil, &cfg)
}

// Status says how the proxy is doing.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	return st, c.do(ctx, http.MethodGet, "/status", nil, &st)
}

// MetricsText is the proxy's metrics in the Prometheus text format.
func (c *Client) MetricsText(ctx context.Context) (string, error) {
	var b strings.Builder
	err := c.do(ctx, http.MethodGet, "/metrics", nil, &b)
	return b.String(), err
}

// Flows calls each for every HTTP flow record the proxy makes from now on,
// until ctx ends (nil error) or the stream breaks (the proxy went away).
func (c *Client) Flows(ctx context.Context, each func(flows.Flow)) error {
	resp, err := c.send(ctx, http.MethodGet, "/flows?format=batch", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == FlowBatchType {
		dec := NewFlowDecoder(resp.Body)
		for {
			if err := dec.Decode(each); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if err == io.EOF {
					return fmt.Errorf("the proxy ended the flow stream")
				}
				return fmt.Errorf("reading the proxy's flows: %w", err)
			}
		}
	}
	// A proxy older than the batch form: JSON lines.
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var fl flows.Flow
		if err := json.Unmarshal(sc.Bytes(), &fl); err != nil {
			return fmt.Errorf("reading the proxy's flows: %w", err)
		}
		each(fl)
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the proxy's flows: %w", err)
	}
	return fmt.Errorf("the proxy ended the flow stream")
}

func (c *Client) do(ctx context.Context, method, path string, body io.Reader, out any) error {
	resp, err := c.send(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch out := out.(type) {
	case nil:
		return nil
	case io.Writer:
		_, err = io.Copy(out, resp.Body)
	default:
		err = json.NewDecoder(resp.Body).Decode(out)
	}
	if err != nil {
		return fmt.Errorf("reading the proxy's answer to %s %s: %w", method, path, err)
	}
	return nil
}

// send makes a request and turns an answer other than 200 into an *Error.
func (c *Client) send(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://proxy"+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the proxy's control socket: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, &Error{Code: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
	}
	return resp, nil
}
