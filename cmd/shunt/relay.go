package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/kubeclient"
	"github.com/shuntnet/shunt/internal/kubesource"
	"github.com/shuntnet/shunt/internal/relay"
)

// DefaultRelayAddr is where `shunt relay` listens and `observe --all-nodes`
// looks unless told otherwise (Hubble Relay's port, 4245).
const DefaultRelayAddr = "127.0.0.1:4245"

func newRelayCmd(g *globals) *cobra.Command {
	var (
		listen, tlsDir, kubeconfig, namespace, selector, agentTLSDir string
		inCluster                                                    bool
		agentPort                                                    int
	)
	cmd := &cobra.Command{
		Use:   "relay [--listen ADDR] [--kubeconfig FILE | --in-cluster] [--tls-dir DIR] [--agent-tls-dir DIR]",
		Short: "merge the flows of every node's agent into one stream, for `shunt observe --all-nodes`",
		Long: "Follows the flows of every agent and serves them merged by time with the agent's own flows API\n" +
			"(GET /v1/flows, the filters of `shunt observe`; GET /v1/relay/nodes lists the agents followed).\n" +
			"Agents are found again every few seconds, so nodes that come and go are followed.\n" +
			"In a lab (default): every node of the lab of --instance, over their sockets.\n" +
			"On Kubernetes (--kubeconfig or --in-cluster): the running pods --selector picks in --namespace\n" +
			"(the DaemonSet's), at their address and --agent-port, by mutual TLS with the certificate,\n" +
			"key and CA in --agent-tls-dir (the agents' --flows-tls-dir names the same CA).\n" +
			"Who may read it: on loopback without TLS only this machine's users; with --tls-dir only\n" +
			"clients with a certificate of that directory's CA; any other address without TLS is refused.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var serverTLS *tls.Config
			var err error
			if tlsDir != "" {
				if serverTLS, err = api.LoadTLS(tlsDir, true); err != nil {
					return fmt.Errorf("--tls-dir: %w", err)
				}
			} else if err := api.CheckPlainListen(listen); err != nil {
				return usageError{fmt.Errorf("--listen: %w", err)}
			}
			var discover relay.Discover
			if kubeconfig != "" || inCluster {
				if kubeconfig != "" && inCluster {
					return usageError{fmt.Errorf("--kubeconfig and --in-cluster: give one")}
				}
				var agentTLS *tls.Config
				if agentTLSDir == "" {
					return usageError{fmt.Errorf("--agent-tls-dir: agents on other nodes are reached only by mutual TLS; give the directory with the relay's certificate, key and the cluster's CA")}
				}
				if agentTLS, err = api.LoadTLS(agentTLSDir, false); err != nil {
					return fmt.Errorf("--agent-tls-dir: %w", err)
				}
				rc, err := kubesource.RESTConfig(kubeconfig)
				if err != nil {
					return err
				}
				kc, err := kubeclient.New(rc)
				if err != nil {
					return err
				}
				discover = relay.KubernetesAgents(kc.Pods(namespace), selector, agentPort, agentTLS)
			} else {
				inst, err := g.inst()
				if err != nil {
					return err
				}
				discover = labAgents(inst)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			r := relay.New(discover, relay.Options{Log: log})
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("relay: %w", err)
			}
			if serverTLS != nil {
				ln = tls.NewListener(ln, serverTLS)
			}
			srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 10 * time.Second}
			go r.Run(ctx)
			go func() { <-ctx.Done(); srv.Close() }()
			log.Info("relay serving", "addr", ln.Addr().String(), "mutualTLS", serverTLS != nil)
			if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
				return err
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&listen, "listen", DefaultRelayAddr, "address to serve the merged flows on")
	fl.StringVar(&tlsDir, "tls-dir", "", "serve by mutual TLS: the relay's certificate and key and the CA its clients' certificates must be signed by (ca.crt, tls.crt, tls.key)")
	fl.StringVar(&kubeconfig, "kubeconfig", "", "find the agents as the pods of a Kubernetes cluster, through this kubeconfig")
	fl.BoolVar(&inCluster, "in-cluster", false, "find the agents as the pods of the cluster this runs in (a pod's service account)")
	fl.StringVar(&namespace, "namespace", "shunt-system", "with Kubernetes: the namespace of the agents' DaemonSet")
	fl.StringVar(&selector, "selector", "app.kubernetes.io/name=shunt", "with Kubernetes: the label selector of the agents' pods")
	fl.IntVar(&agentPort, "agent-port", 4244, "with Kubernetes: the port the agents serve flows on (shuntd --flows-addr)")
	fl.StringVar(&agentTLSDir, "agent-tls-dir", "", "with Kubernetes: the relay's client certificate and key, and the CA of the agents' certificates (ca.crt, tls.crt, tls.key)")
	return cmd
}

// labAgents finds the agents of the lab of inst: every node's, over its
// socket, read again at each rescan (nodes join and leave).
func labAgents(inst instance.Instance) relay.Discover {
	return func(context.Context) ([]relay.Peer, error) {
		insts, layout, err := nodeInstances(inst)
		if err != nil {
			return nil, err
		}
		var peers []relay.Peer
		for i, ni := range insts {
			node := ni.Name
			if layout != nil {
				node = layout.Nodes[i].Name
			}
			if _, err := os.Stat(ni.Socket()); err != nil {
				continue // not started yet, or gone
			}
			peers = append(peers, relay.Peer{Node: node, Addr: ni.Socket(), Stream: api.NewClient(ni.Socket()).StreamContext})
		}
		return peers, nil
	}
}
