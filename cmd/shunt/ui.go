package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/ui"
)

func newUICmd(g *globals) *cobra.Command {
	var (
		listen, node        string
		relayAddr, relayTLS string
		allNodes            bool
		last                int
	)
	cmd := &cobra.Command{
		Use:   "ui [--listen 127.0.0.1:7480]",
		Short: "serve a live service map of the lab's flows in the browser",
		Long: "Serves a page that draws the flows of every node of the lab as a service map: namespaces\n" +
			"as groups, workloads and Services as nodes, edges coloured by verdict (forwarded, dropped,\n" +
			"HTTP denied); an edge opens its recent flows with the drop reason and the rule that decided.\n" +
			"The flows are aggregated here: the browser gets at most 4 snapshots a second of at most\n" +
			"2000 edges, whatever the flow rate.\n\n" +
			"Protection: it listens on loopback only unless --listen names another address, and every\n" +
			"request needs the random token in the URL it prints (kept in a cookie for the page), so\n" +
			"other users of the machine and other web sites (DNS rebinding) cannot read the flows.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			host, _, err := net.SplitHostPort(listen)
			if err != nil {
				return usageError{fmt.Errorf("bad --listen %q: want HOST:PORT, e.g. 127.0.0.1:7480", listen)}
			}
			var streams []flowStream
			if allNodes {
				streams, err = relayStream(relayAddr, relayTLS)
			} else {
				streams, _, err = flowStreams(g, node)
			}
			if err != nil {
				return err
			}
			opts := ui.Options{Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
			if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
				opts.Host = host
				if ip != nil && ip.IsUnspecified() || host == "" {
					opts.Host = "*"
				}
				fmt.Fprintf(os.Stderr, "shunt ui: listening on %s, beyond loopback: the token is the only protection; prefer an SSH tunnel to 127.0.0.1\n", host)
			}
			srv := ui.NewServer(agentSource{streams: streams, last: last, log: opts.Log}, opts)
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listening on %s: %w (another shunt ui? pick another port with --listen)", listen, err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go srv.Run(ctx)
			hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-ctx.Done()
				shut, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				hs.Shutdown(shut)
			}()
			addr := ln.Addr().String()
			if h, p, _ := net.SplitHostPort(addr); net.ParseIP(h).IsUnspecified() {
				addr = net.JoinHostPort("127.0.0.1", p)
			}
			fmt.Printf("shunt ui: open http://%s/?token=%s\n", addr, srv.Token())
			if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7480", "address to serve the page on (loopback unless you say otherwise)")
	cmd.Flags().StringVar(&node, "node", "", "a lab of several nodes: only this node's flows (default: every node's)")
	cmd.Flags().BoolVar(&allNodes, "all-nodes", false, "the flows of every node of a cluster, through a relay (shunt relay) at --relay")
	cmd.Flags().StringVar(&relayAddr, "relay", DefaultRelayAddr, "with --all-nodes: the relay's address")
	cmd.Flags().StringVar(&relayTLS, "relay-tls-dir", "", "with --all-nodes: reach the relay by mutual TLS with this client certificate, key and CA (ca.crt, tls.crt, tls.key)")
	cmd.Flags().IntVar(&last, "last", 5000, "flows of each agent's history to start the map with")
	return cmd
}

// agentSource is the flows of the lab's agents (every node of a lab of
// several), each followed over its socket and followed again a second
// after its stream breaks, from the last flow it delivered.
type agentSource struct {
	streams []flowStream
	last    int
	log     *slog.Logger
}

func (s agentSource) Flows(ctx context.Context, each func(flows.Flow)) error {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, st := range s.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var newest time.Time
			for ctx.Err() == nil {
				err := st.client.StreamContext(ctx, "/v1/flows?"+flows.FollowQuery(s.last, newest).Encode(), func(line []byte) error {
					var fl flows.Flow
					if err := json.Unmarshal(line, &fl); err != nil {
						return fmt.Errorf("reading a flow: %w", err)
					}
					if fl.Node == "" {
						fl.Node = st.node
					}
					newest = fl.Time
					mu.Lock()
					defer mu.Unlock()
					each(fl)
					return nil
				})
				if ctx.Err() != nil {
					return
				}
				s.log.Warn("following flows failed, again in 1 s", "node", st.node, "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}
