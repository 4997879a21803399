package proxyapi

// TEMPORARY until the proxy's own client lands (same API).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/shuntnet/shunt/internal/flows"
)

type Status struct {
	Version           uint64 `json:"version"`
	Requests          uint64 `json:"requests"`
	ActiveConnections int64  `json:"activeConnections"`
}

type Client struct{ hc *http.Client }

func NewClient(socket string) *Client {
	return &Client{hc: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(ctx, method, "http://proxy"+path, body)
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s", b)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	return st, c.do(ctx, "GET", "/status", nil, &st)
}

func (c *Client) PushConfig(ctx context.Context, cfg Config) error {
	return c.do(ctx, "PUT", "/config", cfg, nil)
}

func (c *Client) Flows(ctx context.Context, each func(flows.Flow)) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://proxy/flows", nil)
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var f flows.Flow
		if json.Unmarshal(sc.Bytes(), &f) == nil {
			each(f)
		}
	}
	return sc.Err()
}
