package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shuntnet/shunt/internal/kubecluster"
)

// defaultClusterDir has a dash, so no instance's state directory
// (/var/lib/shunt/<instance>) can be it.
const defaultClusterDir = "/var/lib/shunt/dev-cluster"

func newDevCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "tools for developing and trying shunt",
	}
	cluster := &cobra.Command{
		Use:   "cluster",
		Short: "a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on loopback",
	}
	var dir string
	cluster.PersistentFlags().StringVar(&dir, "dir", defaultClusterDir, "directory of the cluster: certificates, etcd data, logs, kubeconfig")
	cluster.AddCommand(newDevClusterUpCmd(&dir), newDevClusterDownCmd(&dir), newDevClusterStatusCmd(&dir), newDevClusterKubeconfigCmd(&dir))
	cmd.AddCommand(cluster)
	return cmd
}

func newDevClusterUpCmd(dir *string) *cobra.Command {
	var (
		binDir, serviceCIDR, clusterCIDR string
		nodeLifecycle                    bool
		nodeGrace                        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "up [--dir DIR]",
		Short: "start the control plane and write DIR/kubeconfig; it runs until `shunt dev cluster down`",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			c, err := kubecluster.Up(ctx, kubecluster.Options{
				Dir: *dir, BinDir: binDir, ServiceCIDR: serviceCIDR, ClusterCIDR: clusterCIDR, Detach: true,
				NodeLifecycle: nodeLifecycle, NodeMonitorGracePeriod: nodeGrace,
				Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) },
			})
			if err != nil {
				return fmt.Errorf("%w\n(logs in %s; remove with: shunt dev cluster down --dir %s)", err, filepath.Join(*dir, "logs"), *dir)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "API server %s (Kubernetes %s), services %s, pod CIDRs from %s\n", c.Server, kubecluster.KubeVersion, c.ServiceCIDR, c.ClusterCIDR)
			fmt.Fprintf(out, "export KUBECONFIG=%s PATH=%s:$PATH\n", c.Kubeconfig, c.BinDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&binDir, "kube-bin", "", "directory with kube-apiserver, kube-controller-manager, kubectl (default: what scripts/kube-build.sh built)")
	cmd.Flags().StringVar(&serviceCIDR, "service-cidr", "", "ClusterIP range (default: the lab's, 10.96.0.0/16)")
	cmd.Flags().StringVar(&clusterCIDR, "cluster-cidr", "", "range Nodes' pod CIDRs are cut from (default: "+kubecluster.DefaultClusterCIDR+")")
	cmd.Flags().BoolVar(&nodeLifecycle, "node-lifecycle", true, "run the node-lifecycle controller, taint eviction and the pod GC: a node whose heartbeat stops (a kubelet, or 'shunt lab up --kubeconfig', gives one) goes NotReady and its pods leave every Service; false when Nodes have no heartbeat (shuntd without --run-pods and no kubelet)")
	cmd.Flags().DurationVar(&nodeGrace, "node-monitor-grace-period", 0, "with --node-lifecycle: how long a node may miss its heartbeat before it is NotReady (default: Kubernetes', 50s in "+kubecluster.KubeVersion+")")
	return cmd
}

func newDevClusterDownCmd(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down [--dir DIR]",
		Short: "stop the control plane started by `up` (by its recorded PIDs) and remove DIR",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return kubecluster.Down(*dir)
		},
	}
}

func newDevClusterStatusCmd(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "status [--dir DIR]",
		Short: "show the control plane's processes; exit 1 unless all run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := kubecluster.ReadStatus(*dir)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "API server %s (Kubernetes %s), kubeconfig %s\n", st.Server, st.KubeVersion, st.Kubeconfig)
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "COMPONENT\tPID\tSTATE\tLOG")
			for _, c := range st.Components {
				state := "running"
				if !c.Running {
					state = "stopped"
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", c.Name, c.PID, state, c.Log)
			}
			w.Flush()
			if !st.Running() {
				return exitError{code: 1}
			}
			return nil
		},
	}
}

func newDevClusterKubeconfigCmd(dir *string) *cobra.Command {
	var (
		user, out string
		groups    []string
	)
	cmd := &cobra.Command{
		Use:   "kubeconfig --user NAME [--group G]... -o FILE",
		Short: "write a kubeconfig for another user (e.g. system:kube-proxy), with that user's RBAC",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if user == "" || out == "" {
				return usageError{fmt.Errorf("--user and -o are required")}
			}
			return kubecluster.IssueKubeconfig(*dir, out, user, groups...)
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "user name (the certificate's CN)")
	cmd.Flags().StringSliceVar(&groups, "group", nil, "group (the certificate's O); repeatable")
	cmd.Flags().StringVarP(&out, "output", "o", "", "kubeconfig file to write")
	return cmd
}
