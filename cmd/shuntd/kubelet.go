package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/lab"
)

// newKubeletCmd is a lab node whose agent a DaemonSet brings (helm install
// of deploy/helm/shunt): the lab's kubelet alone (lab.RunNodeKubelet).
func newKubeletCmd() *cobra.Command {
	var c lab.NodeKubeletConfig
	var inst, addr string
	var remove bool
	cmd := &cobra.Command{
		Use:   "kubelet --kubeconfig FILE --node-name NODE --node-addr IP --image-dir LAYOUT... [--instance NAME]",
		Short: "a lab node's kubelet alone, no agent: the agent comes from the cluster (helm install of deploy/helm/shunt), its image from --image-dir",
		Long: "Runs the lab's kubelet for one node of a Kubernetes API server with no shuntd of the lab's: it registers the Node,\n" +
			"runs the pods bound to it (images found in the OCI layouts of --image-dir from their own file system), and\n" +
			"plumbs pods with the CNI configuration and plugin installed in the node's own /etc/cni/net.d and /opt/cni/bin\n" +
			"(below --node-dir). The Node is not Ready until there is a CNI configuration. Run it in the node's network\n" +
			"namespace. With --remove it removes what an earlier run made instead (pods' sandboxes, cgroups, node dirs).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if c.Instance, err = instance.New(inst); err != nil {
				return err
			}
			if c.NodeDir == "" {
				c.NodeDir = "/var/lib/shunt-lab/nodes/" + c.NodeName
			}
			if remove {
				return lab.RemoveNodeKubelet(c)
			}
			if c.NodeAddr, err = netip.ParseAddr(addr); err != nil {
				return fmt.Errorf("--node-addr %q: %w", addr, err)
			}
			if c.ShimExe, err = os.Executable(); err != nil {
				return err
			}
			c.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return lab.RunNodeKubelet(ctx, c)
		},
	}
	cmd.Flags().StringVar(&c.Kubeconfig, "kubeconfig", "", "the cluster's kubeconfig")
	cmd.Flags().StringVar(&c.NodeName, "node-name", "", "this node's Node (registered if missing)")
	cmd.Flags().StringVar(&addr, "node-addr", "", "the node's InternalIP (its address in this network namespace)")
	cmd.Flags().StringVar(&inst, "instance", "", "the kubelet's instance name (its pods' cgroups and records; default: NODE-NAME with k appended)")
	cmd.Flags().StringVar(&c.AgentInstance, "agent-instance", "", "the instance the node's agent runs as, for shunt-cni's socket (default: NODE-NAME, as the lab's helm values set)")
	cmd.Flags().StringArrayVar(&c.Layouts, "image-dir", nil, "an OCI image layout holding images the node runs (make image's bin/image/oci); repeatable")
	cmd.Flags().StringVar(&c.NodeDir, "node-dir", "", "the node's own directories (etc/cni/net.d, opt/cni/bin) (default /var/lib/shunt-lab/nodes/NODE-NAME)")
	cmd.Flags().DurationVar(&c.LeaseDuration, "node-lease-duration", 8*time.Second, "the node's Lease duration; its status is posted every quarter of it")
	cmd.Flags().BoolVar(&remove, "remove", false, "remove what an earlier run made instead of running")
	cmd.MarkFlagRequired("node-name")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if inst == "" {
			inst = c.NodeName + "k"
		}
		if c.AgentInstance == "" {
			c.AgentInstance = c.NodeName
		}
		return nil
	}
	return cmd
}
