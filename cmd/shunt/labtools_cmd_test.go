package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/labtools"
)

// syncBuffer is written by a command running in another goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func run(ctx context.Context, cmd *cobra.Command, out, errOut *syncBuffer, args ...string) error {
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(ctx)
}

// freePort finds a loopback port that is free for now.
func freePort(t *testing.T, network string) string {
	t.Helper()
	var addr net.Addr
	if network == "udp" {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = pc.LocalAddr()
		pc.Close()
	} else {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = l.Addr()
		l.Close()
	}
	_, port, _ := net.SplitHostPort(addr.String())
	return port
}

func TestLabServeCmd(t *testing.T) {
	tcp, udp, http, grpc := freePort(t, "tcp"), freePort(t, "udp"), freePort(t, "tcp"), freePort(t, "tcp")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, newLabServeCmd(), &out, &errOut,
			"--bind", "127.0.0.1", "--tcp", tcp, "--udp", udp, "--http", http, "--grpc", grpc, "--name", "pod-x")
	}()
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(out.String(), "serving") < 4 {
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v\n%s", err, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "serving tcp 127.0.0.1:"+tcp+"\n") ||
		!strings.Contains(out.String(), "serving grpc 127.0.0.1:"+grpc+"\n") {
		t.Errorf("serve output %q", out.String())
	}
	o := labtools.ProbeOptions{Timeout: time.Second, Send: "ping"}
	for _, r := range []labtools.Result{
		labtools.ProbeTCP("127.0.0.1:"+tcp, o),
		labtools.ProbeUDP("127.0.0.1:"+udp, o),
		labtools.ProbeHTTP("http://127.0.0.1:"+http+"/", o),
		labtools.ProbeGRPC("127.0.0.1:"+grpc, o),
	} {
		if r.Result != labtools.Connected || r.Peer != "pod-x" {
			t.Errorf("%s: %+v", r.Proto, r)
		}
	}
	cancel() // as SIGTERM would
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestLabServeCmdErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	for _, c := range []struct {
		args  []string
		usage bool // exit 2, else 1
		text  string
	}{
		{[]string{"--tcp", "80,0"}, true, `"0" is not a port`},
		{[]string{"--udp", "70000"}, true, `--udp: "70000" is not a port`},
		{[]string{"--http", "web"}, true, "not a port"},
		{[]string{"--grpc", "0"}, true, `--grpc: "0" is not a port`},
		{[]string{}, true, "nothing to serve"},
		{[]string{"--bogus"}, true, "unknown flag"},
		{[]string{"--bind", "127.0.0.1", "--tcp", busyPort}, false, "address already in use"},
	} {
		var out, errOut syncBuffer
		err := run(context.Background(), newLabServeCmd(), &out, &errOut, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.text) || errors.As(err, new(usageError)) != c.usage {
			t.Errorf("serve %v: %#v, want %q (usage error: %v)", c.args, err, c.text, c.usage)
		}
	}
}

func TestLabProbeCmd(t *testing.T) {
	lo := []string{"127.0.0.1:0"}
	srv, err := labtools.Start(labtools.ServeConfig{Name: "pod-a", TCP: lo, UDP: lo, HTTP: lo, GRPC: lo})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr := map[string]string{}
	for _, a := range srv.Addrs() {
		proto, hostport, _ := strings.Cut(a, " ")
		addr[proto] = hostport
	}
	closed := "127.0.0.1:" + freePort(t, "tcp")
	probe := func(args ...string) (string, string, error) {
		var out, errOut syncBuffer
		err := run(context.Background(), newLabProbeCmd(), &out, &errOut, args...)
		return out.String(), errOut.String(), err
	}

	// Connected, with a summary per target for --count.
	out, _, err := probe("--tcp", addr["tcp"], "--udp", addr["udp"], "--http", "http://"+addr["http"]+"/",
		"--grpc", addr["grpc"], "--count", "3")
	if err != nil {
		t.Fatalf("probe: %v\n%s", err, out)
	}
	for _, want := range []string{
		"tcp " + addr["tcp"] + ": 3 connected (pod-a 3)\n",
		"udp " + addr["udp"] + ": 3 connected (pod-a 3)\n",
		"http http://" + addr["http"] + "/: 3 connected (pod-a 3)\n",
		"grpc " + addr["grpc"] + ": 3 connected (pod-a 3)\n",
		"grpc " + addr["grpc"] + ": connected to pod-a (OK) at ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 16 {
		t.Errorf("%d lines, want 12 attempts and 4 summaries:\n%s", n, out)
	}

	// JSON: one object per attempt.
	out, _, err = probe("-o", "json", "--tcp", addr["tcp"], "--send", "abc", "--count", "2")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("json output:\n%s", out)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"proto": "tcp", "target": addr["tcp"], "result": "connected",
		"reply": "pod-a abc", "peer": "pod-a", "remote": addr["tcp"], "error": ""} {
		if r[k] != v {
			t.Errorf("json %s = %v, want %v", k, r[k], v)
		}
	}
	for _, k := range []string{"local", "rtt_us"} {
		if _, ok := r[k]; !ok {
			t.Errorf("json has no %s: %v", k, r)
		}
	}

	// Refused as expected; a mismatch exits 1 and says why on stderr.
	if _, _, err := probe("--tcp", closed, "--expect", "refused"); err != nil {
		t.Errorf("expect refused: %v", err)
	}
	if _, _, err := probe("--grpc", closed, "--expect", "refused"); err != nil {
		t.Errorf("grpc expect refused: %v", err)
	}
	if _, _, err := probe("--tcp", closed, "--expect", "any"); err != nil {
		t.Errorf("expect any: %v", err)
	}
	_, stderr, err := probe("--tcp", closed, "--tcp", addr["tcp"])
	if !errors.Is(err, exitError{1}) || !strings.Contains(stderr, "expected connected, got refused") {
		t.Errorf("mismatch: %v, stderr %q", err, stderr)
	}

	// --for: rounds until the time is up, a summary per target; with
	// --persistent every TCP attempt goes over one connection.
	out, _, err = probe("-o", "json", "--for", "300ms", "--interval", "20ms", "--persistent", "--tcp", addr["tcp"], "--udp", addr["udp"])
	if err != nil {
		t.Fatalf("probe --for: %v\n%s", err, out)
	}
	locals := map[string]int{}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r labtools.Result
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Result != labtools.Connected {
			t.Fatalf("probe --for: %q: %v", line, err)
		}
		if r.Proto == "tcp" {
			locals[r.Local]++
			n++
		}
	}
	if n < 5 || len(locals) != 1 {
		t.Errorf("--for 300ms --persistent: %d TCP attempts from %d local addresses, want several over one: %v", n, len(locals), locals)
	}

	// Usage errors exit 2.
	for _, args := range [][]string{
		{"--tcp", addr["tcp"], "--for", "-1s"},
		{}, {"--tcp", addr["tcp"], "--expect", "maybe"}, {"--tcp", addr["tcp"], "-o", "yaml"},
		{"--tcp", addr["tcp"], "--count", "0"}, {"--tcp", "10.0.0.1"}, {"--http", "10.0.0.1:80"},
		{"--tcp", addr["tcp"], "--timeout", "soon"}, {"--nope"}, {"--grpc", "10.0.0.1"},
	} {
		if _, _, err := probe(args...); !errors.As(err, new(usageError)) {
			t.Errorf("probe %v: %v, want a usage error", args, err)
		}
	}
}

func TestLabHTTPLoadCmd(t *testing.T) {
	lo := []string{"127.0.0.1:0"}
	srv, err := labtools.Start(labtools.ServeConfig{Name: "pod-a", HTTP: lo})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url := "http://" + strings.TrimPrefix(srv.Addrs()[0], "http ") + "/"
	load := func(args ...string) (string, error) {
		var out, errOut syncBuffer
		err := run(context.Background(), newLabHTTPLoadCmd(), &out, &errOut, args...)
		return out.String(), err
	}

	for _, h2 := range []string{"--http2=false", "--http2"} {
		out, err := load("--url", url, "-n", "20", "-c", "2", "-H", "X-A: 1", "-X", "GET", h2)
		if err != nil {
			t.Fatalf("%s: %v", h2, err)
		}
		var got struct {
			Requests    int            `json:"requests"`
			ByPod       map[string]int `json:"byPod"`
			ByStatus    map[string]int `json:"byStatus"`
			Errors      int            `json:"errors"`
			Connections int            `json:"connections"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%s: %v in %q", h2, err, out)
		}
		if got.Requests != 20 || got.ByPod["pod-a"] != 20 || got.ByStatus["200"] != 20 || got.Errors != 0 || got.Connections != 2 {
			t.Errorf("%s: %s", h2, out)
		}
	}

	// Nobody listening: counted, not a failure of the command.
	out, err := load("--url", "http://127.0.0.1:"+freePort(t, "tcp")+"/", "-n", "2")
	if err != nil || !strings.Contains(out, `"errors":2`) {
		t.Errorf("closed port: %v %s", err, out)
	}

	for _, args := range [][]string{
		{}, {"--url", "127.0.0.1:80"}, {"--url", url, "-n", "0"}, {"--url", url, "-c", "0"},
		{"--url", url, "-H", "no colon"}, {"--url", url, "-X", "G T"}, {"--url", url, "--timeout", "0s"},
		{"--nope"},
	} {
		if _, err := load(args...); !errors.As(err, new(usageError)) {
			t.Errorf("http-load %v: %v, want a usage error", args, err)
		}
	}
}

func TestLabHTTPGetCmd(t *testing.T) {
	lo := []string{"127.0.0.1:0"}
	srv, err := labtools.Start(labtools.ServeConfig{Name: "pod-a", HTTP: lo})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url := "http://" + strings.TrimPrefix(srv.Addrs()[0], "http ") + "/"
	get := func(args ...string) (string, error) {
		var out, errOut syncBuffer
		err := run(context.Background(), newLabHTTPGetCmd(), &out, &errOut, args...)
		return out.String(), err
	}

	if out, err := get(url, "-H", "Host: web.example", "--http2"); err != nil || out != "200\npod-a\n" {
		t.Errorf("http-get: %v %q", err, out)
	}
	// No response: exit 1 (not a usage error), nothing on stdout.
	out, err := get("http://127.0.0.1:" + freePort(t, "tcp") + "/")
	if err == nil || errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "refused") || out != "" {
		t.Errorf("closed port: %v %q", err, out)
	}
	for _, args := range [][]string{{}, {url, url}, {"127.0.0.1:80"}, {url, "-H", ":x"}, {"--nope", url}} {
		if _, err := get(args...); !errors.As(err, new(usageError)) {
			t.Errorf("http-get %v: %v, want a usage error", args, err)
		}
	}
}
