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

func newLabServeCmd() *cobra.Command {
	var tcp, udp, httpPorts []int
	var name string
	cmd := &cobra.Command{
		Use:   "serve [--tcp PORTS] [--udp PORTS] [--http PORTS] [--name NAME]",
		Short: "test server for pods: TCP/UDP echo and HTTP, answering with the pod's name",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, p := range append(append(append([]int{}, tcp...), udp...), httpPorts...) {
				if p < 1 || p > 65535 {
					return fmt.Errorf("port %d is out of range 1-65535", p)
				}
			}
			if len(tcp)+len(udp)+len(httpPorts) == 0 {
				return fmt.Errorf("nothing to serve: give --tcp, --udp or --http ports")
			}
			srv, err := labtools.Start(labtools.ServeConfig{Name: name,
				TCP: labtools.ListenAddrs(tcp), UDP: labtools.ListenAddrs(udp), HTTP: labtools.ListenAddrs(httpPorts)})
			if err != nil {
				return err
			}
			for _, a := range srv.Addrs() {
				fmt.Println("serving", a)
			}
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			<-sig
			srv.Close()
			return nil
		},
	}
	cmd.Flags().IntSliceVar(&tcp, "tcp", nil, "TCP echo ports (comma-separated or repeated)")
	cmd.Flags().IntSliceVar(&udp, "udp", nil, "UDP echo ports")
	cmd.Flags().IntSliceVar(&httpPorts, "http", nil, "HTTP ports")
	cmd.Flags().StringVar(&name, "name", "", "name to answer with (default $SHUNT_POD_NAME, else the hostname)")
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
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch expect {
			case labtools.Connected, labtools.Refused, labtools.Timeout, "any":
			default:
				return usageError{fmt.Errorf("--expect %q: use connected, refused, timeout or any", expect)}
			}
			if output != "text" && output != "json" {
				return usageError{fmt.Errorf("-o %q: use text or json", output)}
			}
			if len(tcp)+len(udp)+len(urls) == 0 {
				return usageError{fmt.Errorf("nothing to probe: give --tcp, --udp or --http")}
			}
			type job struct {
				target string
				probe  func(string, labtools.ProbeOptions) labtools.Result
			}
			var jobs []job
			for _, t := range tcp {
				jobs = append(jobs, job{t, labtools.ProbeTCP})
			}
			for _, t := range udp {
				jobs = append(jobs, job{t, labtools.ProbeUDP})
			}
			for _, t := range urls {
				jobs = append(jobs, job{t, labtools.ProbeHTTP})
			}
			ok := true
			enc := json.NewEncoder(os.Stdout)
			for _, j := range jobs {
				var results []labtools.Result
				for range count {
					r := j.probe(j.target, opts)
					results = append(results, r)
					if output == "json" {
						enc.Encode(r)
					} else if count == 1 {
						printResult(r)
					}
					if expect != "any" && r.Result != expect {
						ok = false
						fmt.Fprintf(os.Stderr, "%s %s: expected %s, got %s %s\n", r.Proto, r.Target, expect, r.Result, r.Error)
					}
				}
				if count > 1 && output == "text" {
					fmt.Println(labtools.Summary(results))
				}
			}
			if !ok {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&tcp, "tcp", nil, "TCP target HOST:PORT (repeatable)")
	cmd.Flags().StringArrayVar(&udp, "udp", nil, "UDP target HOST:PORT (repeatable)")
	cmd.Flags().StringArrayVar(&urls, "http", nil, "HTTP URL (repeatable)")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", time.Second, "per-attempt timeout")
	cmd.Flags().StringVar(&opts.Send, "send", "ping", "payload to send")
	cmd.Flags().DurationVar(&opts.Hold, "hold", 0, "TCP: keep each connection open this long, then check it still works")
	cmd.Flags().BoolVar(&opts.UDPConnected, "udp-connected", false, "use a connected UDP socket (default: unconnected, like resolvers)")
	cmd.Flags().StringVar(&expect, "expect", labtools.Connected, "expected result of every attempt: connected, refused, timeout or any")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json (one object per attempt)")
	cmd.Flags().IntVar(&count, "count", 1, "attempts per target, each on a new socket")
	return cmd
}

func printResult(r labtools.Result) {
	switch r.Result {
	case labtools.Connected:
		extra := ""
		if r.Proto == "udp" {
			extra = " from " + r.Remote
		}
		fmt.Printf("%-4s %-28s %s to %s%s in %.2fms\n", r.Proto, r.Target, r.Result, r.Peer, extra, float64(r.RTTus)/1000)
	default:
		fmt.Printf("%-4s %-28s %s: %s\n", r.Proto, r.Target, r.Result, r.Error)
	}
}
