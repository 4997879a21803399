package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/shuntnet/shunt/deploy"
	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/lbipam"
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
	cluster.AddCommand(newDevClusterUpCmd(&dir), newDevClusterDownCmd(&dir), newDevClusterStatusCmd(&dir), newDevClusterEnvCmd(&dir), newDevClusterKubeconfigCmd(&dir))
	cmd.AddCommand(cluster, newDevLBIPAMCmd())
	return cmd
}

// newDevLBIPAMCmd is the load balancer controller `dev cluster up
// --lb-pool` runs as one of the cluster's processes (internal/lbipam).
func newDevLBIPAMCmd() *cobra.Command {
	var kubeconfig, pool string
	cmd := &cobra.Command{
		Use:   "lb-ipam --kubeconfig FILE --pool CIDR",
		Short: "give LoadBalancer Services addresses from a pool, written into status.loadBalancer.ingress (as Cilium's LB-IPAM); `dev cluster up --lb-pool` runs it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := lbipam.ParsePool("--pool", pool)
			if err != nil {
				return err
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return lbipam.Run(ctx, client, p, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "the cluster's kubeconfig (it writes Services' status)")
	cmd.Flags().StringVar(&pool, "pool", "", "IPv4 CIDR the addresses come from (all but its network and broadcast addresses)")
	cmd.MarkFlagRequired("kubeconfig")
	cmd.MarkFlagRequired("pool")
	return cmd
}

func newDevClusterUpCmd(dir *string) *cobra.Command {
	var (
		binDir, serviceCIDR, clusterCIDR   string
		lbPool                             string
		nodeLifecycle, scheduler, workload bool
		dns                                bool
		nodeGrace                          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "up [--dir DIR]",
		Short: "start the control plane, install shunt's CRDs and write DIR/kubeconfig; it runs until `shunt dev cluster down`",
		Long: "Starts the control plane, installs shunt's CRDs (deploy/crds/) and writes DIR/kubeconfig; it runs\n" +
			"until `shunt dev cluster down`. Progress goes to stderr; stdout is only the line that points a shell\n" +
			"at the cluster and its kubectl, so\n\n" +
			"  eval \"$(bin/shunt dev cluster up)\"\n\n" +
			"leaves KUBECONFIG and PATH set (`shunt dev cluster env` prints the line again for another shell).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			var pool netip.Prefix
			var controller []string
			if lbPool != "" {
				var err error
				if pool, err = lbipam.ParsePool("--lb-pool", lbPool); err != nil {
					return err
				}
				self, err := os.Executable()
				if err != nil {
					return fmt.Errorf("--lb-pool: finding this program to run its load balancer controller: %w", err)
				}
				controller = []string{self, "dev", "lb-ipam"}
			}
			c, err := kubecluster.Up(ctx, kubecluster.Options{
				Dir: *dir, BinDir: binDir, ServiceCIDR: serviceCIDR, ClusterCIDR: clusterCIDR, Detach: true,
				LoadBalancerPool: pool, LoadBalancerController: controller,
				NodeLifecycle: nodeLifecycle, NodeMonitorGracePeriod: nodeGrace, Scheduler: scheduler, WorkloadControllers: workload,
				Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) },
			})
			if err != nil {
				return fmt.Errorf("%w\n(logs in %s; remove with: shunt dev cluster down --dir %s)", err, filepath.Join(*dir, "logs"), *dir)
			}
			// shunt's CRDs, as an operator installs them before the
			// DaemonSet: an agent on this cluster needs ShuntIdentities.
			if err := c.Apply(ctx, bytes.NewReader(deploy.CRDs()), "-"); err != nil {
				return fmt.Errorf("installing shunt's CRDs: %w\n(the control plane runs; logs in %s; remove with: shunt dev cluster down --dir %s)", err, filepath.Join(*dir, "logs"), *dir)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "API server %s (Kubernetes %s), services %s, pod CIDRs from %s, shunt's CRDs installed\n", c.Server, kubecluster.KubeVersion, c.ServiceCIDR, c.ClusterCIDR)
			if dns {
				ip, err := c.DeployDNS(ctx, workload)
				if err != nil {
					return fmt.Errorf("%w\n(the control plane runs; remove with: shunt dev cluster down --dir %s)", err, *dir)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "cluster DNS (CoreDNS, %s) is Service kube-system/kube-dns at %s: give the lab nodes --cluster-dns %s; it runs once a node runs pods (on the node's network, port 53)\n", kubecluster.DNSImage, ip, ip)
			}
			printEnv(cmd.OutOrStdout(), c.Kubeconfig, c.BinDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&binDir, "kube-bin", "", "directory with kube-apiserver, kube-controller-manager, kubectl (default: what scripts/kube-build.sh built)")
	cmd.Flags().StringVar(&serviceCIDR, "service-cidr", "", "ClusterIP range (default: the lab's, 10.96.0.0/16)")
	cmd.Flags().StringVar(&clusterCIDR, "cluster-cidr", "", "range Nodes' pod CIDRs are cut from (default: "+kubecluster.DefaultClusterCIDR+")")
	cmd.Flags().BoolVar(&nodeLifecycle, "node-lifecycle", true, "run the node-lifecycle controller, taint eviction and the pod GC: a node whose heartbeat stops (a kubelet, or 'shunt lab up --kubeconfig', gives one) goes NotReady and its pods leave every Service; false when Nodes have no heartbeat (shuntd without --run-pods and no kubelet)")
	cmd.Flags().BoolVar(&scheduler, "scheduler", false, "also run kube-scheduler (scripts/kube-build.sh kube-scheduler), which places pods by nodeSelector, affinity and resources; give the lab nodes --no-schedule")
	cmd.Flags().BoolVar(&workload, "workload-controllers", false, "also run the controllers of ReplicationControllers, ReplicaSets, Deployments, DaemonSets, Jobs, StatefulSets, Endpoints and disruption budgets, as the Kubernetes e2e suites expect")
	cmd.Flags().StringVar(&lbPool, "lb-pool", "", "IPv4 CIDR LoadBalancer Services get their address from, written into status.loadBalancer.ingress by a controller the cluster runs ('shunt dev lb-ipam', as Cilium's LB-IPAM or MetalLB); default none: they stay pending")
	cmd.Flags().BoolVar(&dns, "dns", false, "also run the cluster DNS: CoreDNS with its kubernetes plugin (scripts/kube-build.sh coredns) as Service kube-system/kube-dns at the service CIDR's .10, UDP and TCP 53; give the lab nodes --cluster-dns with that address")
	cmd.Flags().DurationVar(&nodeGrace, "node-monitor-grace-period", 0, "with --node-lifecycle: how long a node may miss its heartbeat before it is NotReady (default: Kubernetes', 50s in "+kubecluster.KubeVersion+")")
	return cmd
}

// printEnv writes the line that points a shell at a dev cluster: its admin
// kubeconfig, and the kubectl built with its server first on PATH.
func printEnv(w io.Writer, kubeconfig, binDir string) {
	fmt.Fprintf(w, "export KUBECONFIG=%s PATH=%s:$PATH\n", kubeconfig, binDir)
}

func newDevClusterEnvCmd(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "env [--dir DIR]",
		Short: "print the export line for the cluster's kubeconfig and kubectl: eval \"$(shunt dev cluster env)\"",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := kubecluster.ReadStatus(*dir)
			if err != nil {
				return err
			}
			printEnv(cmd.OutOrStdout(), st.Kubeconfig, st.BinDir)
			return nil
		},
	}
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
