package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/labtools"
)

// asUsageError makes bad flags exit 2, like the checks in RunE.
func asUsageError(_ *cobra.Command, err error) error { return usageError{err} }

func newLabServeCmd() *cobra.Command {
	var tcp, udp, httpPorts, grpcPorts []string
	var name, bind string
	cmd := &cobra.Command{
		Use:   "serve [--tcp PORTS] [--udp PORTS] [--http PORTS] [--grpc PORTS] [--name NAME]",
		Short: "test server for pods: TCP/UDP echo, HTTP and gRPC, answering with the pod's name",
		Long: `Serve answers every TCP read and every UDP datagram with "NAME <what was
received>" (no banner: a client that sends nothing gets nothing), and every
HTTP request (HTTP/1.1, or h2c with prior knowledge) with 200 "NAME" and the
header X-Shunt-Pod: NAME (/healthz: "ok"). On --grpc ports (h2c, no TLS) it
serves the standard gRPC health service, SERVING, with the metadata
x-shunt-pod: NAME on every call. NAME is --name, else $SHUNT_POD_NAME, else
the hostname. It runs until SIGTERM or SIGINT.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg labtools.ServeConfig
			for _, f := range []struct {
				flag  string
				vals  []string
				addrs *[]string
			}{{"tcp", tcp, &cfg.TCP}, {"udp", udp, &cfg.UDP}, {"http", httpPorts, &cfg.HTTP}, {"grpc", grpcPorts, &cfg.GRPC}} {
				ports, err := labtools.ParsePorts(f.vals)
				if err != nil {
					return usageError{fmt.Errorf("--%s: %w", f.flag, err)}
				}
				*f.addrs = labtools.ListenAddrs(bind, ports)
			}
			if len(cfg.TCP)+len(cfg.UDP)+len(cfg.HTTP)+len(cfg.GRPC) == 0 {
				return usageError{fmt.Errorf("nothing to serve: give --tcp, --udp, --http or --grpc ports")}
			}
			cfg.Name = name
			// Listen for signals before binding: a SIGTERM right after
			// start must still close cleanly.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			srv, err := labtools.Start(cfg)
			if err != nil {
				return err // a bind failure: exit 1
			}
			defer srv.Close()
			for _, a := range srv.Addrs() {
				fmt.Fprintln(cmd.OutOrStdout(), "serving", a)
			}
			<-ctx.Done()
			return nil
		},
	}
	cmd.SetFlagErrorFunc(asUsageError)
	cmd.Flags().StringSliceVar(&tcp, "tcp", nil, "TCP echo ports (comma-separated or repeated)")
	cmd.Flags().StringSliceVar(&udp, "udp", nil, "UDP echo ports (comma-separated or repeated)")
	cmd.Flags().StringSliceVar(&httpPorts, "http", nil, "HTTP ports (comma-separated or repeated)")
	cmd.Flags().StringSliceVar(&grpcPorts, "grpc", nil, "gRPC health service ports (comma-separated or repeated)")
	cmd.Flags().StringVar(&name, "name", "", "name to answer with (default $SHUNT_POD_NAME, else the hostname)")
	cmd.Flags().StringVar(&bind, "bind", "", "listen on this address only (default: every address)")
	return cmd
}

func newLabProbeCmd() *cobra.Command {
	var (
		tcp, udp, urls []string
		grpcs          []string
		opts           labtools.ProbeOptions
		expect, output string
		count          int
		forDur, pause  time.Duration
		persistent     bool
	)
	cmd := &cobra.Command{
		Use:   "probe [--tcp HOST:PORT] [--udp HOST:PORT] [--http URL] [--grpc HOST:PORT] [--expect connected|refused|timeout|any]",
		Short: "try connections and report connected / refused / timeout; exit 1 when not as expected",
		Long: `Probe tries each target --count times, each time on a new socket, and reports
each attempt: connected (a reply came back), refused, timeout or error.
TCP and UDP send --send and expect the lab server's "NAME <echo>" reply; HTTP
does a GET; gRPC makes one health Check call. An HTTP or gRPC answer is
connected whatever its status (a 403, PermissionDenied): the status is in
the output. With -o json it prints one JSON object per attempt; in text, with
--count above 1, a summary per target follows, counting outcomes and peers.
With --for it probes the targets in turn, round after round (--interval
apart), until that time has passed or it gets SIGINT or SIGTERM: a load that
runs while something else happens (an agent restart), every attempt counted.
With --persistent, the attempts to a TCP target share one connection, kept
open (and dialled again after a failure, which counts as one).
The exit code is 0 if every attempt gave --expect, 1 if not, 2 on bad usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch expect {
			case labtools.Connected, labtools.Refused, labtools.Timeout, "any":
			default:
				return usageError{fmt.Errorf("--expect %q: use connected, refused, timeout or any", expect)}
			}
			if output != "text" && output != "json" {
				return usageError{fmt.Errorf("-o %q: use text or json", output)}
			}
			if forDur < 0 || pause < 0 {
				return usageError{fmt.Errorf("--for %s, --interval %s: want durations of zero or more", forDur, pause)}
			}
			if count < 1 {
				return usageError{fmt.Errorf("--count %d: want at least 1", count)}
			}
			if opts.Timeout <= 0 {
				return usageError{fmt.Errorf("--timeout %s: want a positive duration", opts.Timeout)}
			}
			type target struct{ proto, addr string }
			var targets []target
			for _, g := range []struct {
				proto string
				addrs []string
			}{{"tcp", tcp}, {"udp", udp}, {"http", urls}, {"grpc", grpcs}} {
				for _, a := range g.addrs {
					if err := labtools.CheckTarget(g.proto, a); err != nil {
						return usageError{err}
					}
					targets = append(targets, target{g.proto, a})
				}
			}
			if len(targets) == 0 {
				return usageError{fmt.Errorf("nothing to probe: give --tcp, --udp, --http or --grpc")}
			}

			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			enc := json.NewEncoder(out)
			ok := true
			sessions := make([]*labtools.TCPSession, len(targets))
			results := make([][]labtools.Result, len(targets))
			attempt := func(i int) error {
				t := targets[i]
				var r labtools.Result
				if persistent && t.proto == "tcp" {
					if sessions[i] == nil {
						sessions[i] = labtools.NewTCPSession(t.addr, opts)
					}
					r = sessions[i].Probe()
				} else {
					r = labtools.Probe(t.proto, t.addr, opts)
				}
				results[i] = append(results[i], r)
				if output == "json" {
					if err := enc.Encode(r); err != nil {
						return err
					}
				} else {
					fmt.Fprintln(out, r.Text())
				}
				if expect != "any" && r.Result != expect {
					ok = false
					fmt.Fprintf(errOut, "%s %s: expected %s, got %s: %s\n", r.Proto, r.Target, expect, r.Result, r.Error)
				}
				return nil
			}
			defer func() {
				for _, s := range sessions {
					if s != nil {
						s.Close()
					}
				}
			}()
			if forDur > 0 {
				// A signal ends the run as the deadline would: the attempt
				// under way finishes and is reported.
				stop := make(chan os.Signal, 1)
				signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
				defer signal.Stop(stop)
				deadline := time.After(forDur)
			rounds:
				for {
					for i := range targets {
						if err := attempt(i); err != nil {
							return err
						}
					}
					select {
					case <-stop:
						break rounds
					case <-deadline:
						break rounds
					case <-time.After(pause):
					}
				}
			} else {
				for i := range targets {
					for range count {
						if err := attempt(i); err != nil {
							return err
						}
					}
					if count > 1 && output == "text" {
						fmt.Fprintln(out, labtools.Summary(results[i]))
					}
				}
			}
			if forDur > 0 && output == "text" {
				for i := range targets {
					fmt.Fprintln(out, labtools.Summary(results[i]))
				}
			}
			if !ok {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(asUsageError)
	cmd.Flags().StringArrayVar(&tcp, "tcp", nil, "TCP target HOST:PORT (repeatable)")
	cmd.Flags().StringArrayVar(&udp, "udp", nil, "UDP target HOST:PORT (repeatable)")
	cmd.Flags().StringArrayVar(&urls, "http", nil, "HTTP URL (repeatable)")
	cmd.Flags().StringArrayVar(&grpcs, "grpc", nil, "gRPC target HOST:PORT for a health Check (repeatable)")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", time.Second, "per-attempt timeout (dial and reply together)")
	cmd.Flags().StringVar(&opts.Send, "send", "ping", "payload to send over TCP and UDP")
	cmd.Flags().DurationVar(&opts.Hold, "hold", 0, "TCP and --udp-connected: keep each socket open this long, then check it still works")
	cmd.Flags().BoolVar(&opts.UDPConnected, "udp-connected", false, "use a connected UDP socket (default: unconnected, like resolvers)")
	cmd.Flags().StringVar(&expect, "expect", labtools.Connected, "expected result of every attempt: connected, refused, timeout or any")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json (one object per attempt)")
	cmd.Flags().IntVar(&count, "count", 1, "attempts per target, each on a new socket")
	cmd.Flags().DurationVar(&forDur, "for", 0, "instead of --count: probe the targets in turn, round after round, until this much time has passed or SIGINT/SIGTERM")
	cmd.Flags().DurationVar(&pause, "interval", 0, "with --for: pause between rounds")
	cmd.Flags().BoolVar(&persistent, "persistent", false, "TCP: send every attempt over one connection per target, kept open (dialled again after a failure)")
	return cmd
}

func newLabHTTPLoadCmd() *cobra.Command {
	var (
		q               labtools.Request
		headers         []string
		requests, conns int
		rate            float64
	)
	cmd := &cobra.Command{
		Use:   "http-load --url URL [-n N] [-c CONNS] [-H 'Name: value']... [-X METHOD] [--http2]",
		Short: "send N HTTP requests over CONNS kept-alive connections; print JSON counts by pod and status",
		Long: `Http-load sends -n requests over -c connections, each connection carrying
its share one request after the other, and prints one JSON object:

  {"requests":2000,"byPod":{"v1":1800,"v2":200},"byStatus":{"200":2000},"errors":0,"connections":1}

byPod counts the X-Shunt-Pod response header ("" when absent), errors the
requests that got no response (firstError says why), connections the
connections opened: -c unless the server or a proxy closed some. With the
default -c 1 every request goes over one connection, so a proxy's weighted
split shows per request. --http2 speaks h2c with prior knowledge; -H 'Host: H'
sets the Host header. The exit code is 0 once the counts are printed, errors
or not, and 2 on bad usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if requests < 1 {
				return usageError{fmt.Errorf("-n %d: want at least 1", requests)}
			}
			if conns < 1 {
				return usageError{fmt.Errorf("-c %d: want at least 1", conns)}
			}
			if q.URL == "" {
				return usageError{fmt.Errorf("no --url to send requests to")}
			}
			if err := checkRequest(&q, headers); err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(labtools.HTTPLoad(q, requests, conns, rate))
		},
	}
	cmd.SetFlagErrorFunc(asUsageError)
	cmd.Flags().StringVar(&q.URL, "url", "", "URL to send the requests to (http://HOST:PORT/PATH)")
	cmd.Flags().IntVarP(&requests, "requests", "n", 100, "requests to send")
	cmd.Flags().Float64Var(&rate, "rate", 0, "requests per second in all (0: as fast as the answers come)")
	cmd.Flags().IntVarP(&conns, "connections", "c", 1, "connections to send them over, each kept alive")
	requestFlags(cmd, &q, &headers)
	return cmd
}

func newLabHTTPGetCmd() *cobra.Command {
	var (
		q       labtools.Request
		headers []string
	)
	cmd := &cobra.Command{
		Use:   "http-get URL [-H 'Name: value']... [-X METHOD] [--http2]",
		Short: "send one HTTP request; print the status code on a line, then the body",
		Long: `Http-get sends one request and prints the response's status code on a line,
then its body as it came. The exit code is 0 whenever a response arrived,
whatever its status (tests check a 403 and its body), 1 when none did or its
body broke off (the error is on stderr), 2 on bad usage.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("http-get takes one URL, got %d arguments", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			q.URL = args[0]
			if err := checkRequest(&q, headers); err != nil {
				return err
			}
			return labtools.HTTPGet(q, cmd.OutOrStdout())
		},
	}
	cmd.SetFlagErrorFunc(asUsageError)
	requestFlags(cmd, &q, &headers)
	cmd.Flags().Uint16Var(&q.SourcePort, "source-port", 0, "connect from this source port (0: any); the same tuple can then be sent through two nodes")
	return cmd
}

// requestFlags are the flags http-load and http-get share.
func requestFlags(cmd *cobra.Command, q *labtools.Request, headers *[]string) {
	cmd.Flags().StringArrayVarP(headers, "header", "H", nil, "request header 'Name: value' (repeatable; Host sets the Host header)")
	cmd.Flags().StringVarP(&q.Method, "method", "X", "GET", "request method")
	cmd.Flags().BoolVar(&q.HTTP2, "http2", false, "HTTP/2 without TLS from the first byte (h2c prior knowledge)")
	cmd.Flags().DurationVar(&q.Timeout, "timeout", 5*time.Second, "per-request timeout, the response body included")
}

// checkRequest completes q from the flags and rejects it as a usage error
// if it could never be sent.
func checkRequest(q *labtools.Request, headers []string) error {
	if q.Timeout <= 0 {
		return usageError{fmt.Errorf("--timeout %s: want a positive duration", q.Timeout)}
	}
	h, err := labtools.ParseHeaders(headers)
	if err != nil {
		return usageError{fmt.Errorf("-H: %w", err)}
	}
	q.Header = h
	if err := q.Check(); err != nil {
		return usageError{err}
	}
	return nil
}
