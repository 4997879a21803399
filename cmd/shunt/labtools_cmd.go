package main

import (
	"encoding/json"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/labtools"
)

// asUsageError makes bad flags exit 2, like the checks in RunE.
func asUsageError(_ *cobra.Command, err error) error { return usageError{err} }

func newLabServeCmd() *cobra.Command {
	var tcp, udp, httpPorts []string
	var name, bind string
	cmd := &cobra.Command{
		Use:   "serve [--tcp PORTS] [--udp PORTS] [--http PORTS] [--name NAME]",
		Short: "test server for pods: TCP/UDP echo and HTTP, answering with the pod's name",
		Long: `Serve answers every TCP read and every UDP datagram with "NAME <what was
received>" (no banner: a client that sends nothing gets nothing), and every
HTTP request with 200 "NAME" and the header X-Shunt-Pod: NAME (/healthz: "ok").
NAME is --name, else $SHUNT_POD_NAME, else the hostname. It runs until
SIGTERM or SIGINT.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg labtools.ServeConfig
			for _, f := range []struct {
				flag  string
				vals  []string
				addrs *[]string
			}{{"tcp", tcp, &cfg.TCP}, {"udp", udp, &cfg.UDP}, {"http", httpPorts, &cfg.HTTP}} {
				ports, err := labtools.ParsePorts(f.vals)
				if err != nil {
					return usageError{fmt.Errorf("--%s: %w", f.flag, err)}
				}
				*f.addrs = labtools.ListenAddrs(bind, ports)
			}
			if len(cfg.TCP)+len(cfg.UDP)+len(cfg.HTTP) == 0 {
				return usageError{fmt.Errorf("nothing to serve: give --tcp, --udp or --http ports")}
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
	cmd.Flags().StringVar(&name, "name", "", "name to answer with (default $SHUNT_POD_NAME, else the hostname)")
	cmd.Flags().StringVar(&bind, "bind", "", "listen on this address only (default: every address)")
	return cmd
}

func newLabProbeCmd() *cobra.Command {
	var (
		tcp, udp, urls []string
		opts           labtools.ProbeOptions
		expect, output string
		count          int
	)
	cmd := &cobra.Command{
		Use:   "probe [--tcp HOST:PORT] [--udp HOST:PORT] [--http URL] [--expect connected|refused|timeout|any]",
		Short: "try connections and report connected / refused / timeout; exit 1 when not as expected",
		Long: `Probe tries each target --count times, each time on a new socket, and reports
each attempt: connected (a reply came back), refused, timeout or error.
TCP and UDP send --send and expect the lab server's "NAME <echo>" reply; HTTP
does a GET. With -o json it prints one JSON object per attempt; in text, with
--count above 1, a summary per target follows, counting outcomes and peers.
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
			}{{"tcp", tcp}, {"udp", udp}, {"http", urls}} {
				for _, a := range g.addrs {
					if err := labtools.CheckTarget(g.proto, a); err != nil {
						return usageError{err}
					}
					targets = append(targets, target{g.proto, a})
				}
			}
			if len(targets) == 0 {
				return usageError{fmt.Errorf("nothing to probe: give --tcp, --udp or --http")}
			}

			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			enc := json.NewEncoder(out)
			ok := true
			for _, t := range targets {
				var results []labtools.Result
				for range count {
					r := labtools.Probe(t.proto, t.addr, opts)
					results = append(results, r)
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
				}
				if count > 1 && output == "text" {
					fmt.Fprintln(out, labtools.Summary(results))
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
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", time.Second, "per-attempt timeout (dial and reply together)")
	cmd.Flags().StringVar(&opts.Send, "send", "ping", "payload to send over TCP and UDP")
	cmd.Flags().DurationVar(&opts.Hold, "hold", 0, "TCP and --udp-connected: keep each socket open this long, then check it still works")
	cmd.Flags().BoolVar(&opts.UDPConnected, "udp-connected", false, "use a connected UDP socket (default: unconnected, like resolvers)")
	cmd.Flags().StringVar(&expect, "expect", labtools.Connected, "expected result of every attempt: connected, refused, timeout or any")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json (one object per attempt)")
	cmd.Flags().IntVar(&count, "count", 1, "attempts per target, each on a new socket")
	return cmd
}
