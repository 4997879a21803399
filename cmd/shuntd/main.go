// Command shuntd is shunt's node agent. It runs in the foreground with
// structured logs; `shunt lab up` starts it in the background for a lab.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/shuntnet/shunt/internal/agent"
	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/lbipam"
	"github.com/shuntnet/shunt/internal/maglev"
	"github.com/shuntnet/shunt/internal/podexec"
	"github.com/shuntnet/shunt/internal/services"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "shuntd:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	var (
		inst, mode, podCIDR, serviceCIDR, logLevel, agnhost                                            string
		clusterDomain                                                                                  string
		clusterDNS                                                                                     []string
		flowSampling, metricsAddr, flowsAddr, flowsTLSDir                                              string
		flowHistory, flowBuffer                                                                        int
		socketAccel, accelNode, accelUnsafe, inCluster, runPods, removeKubeProxy, kubeProxyReplacement bool
		noSched                                                                                        bool
		ctSingleTable                                                                                  bool
		overlayDecapInDevice, overlayEncapInDevice                                                     bool
		bpfStats                                                                                       bool
		conntrackMax                                                                                   int
		kubeconfig, nodeName                                                                           string
		nodeLeaseSeconds                                                                               int
		crashLoopBackOff                                                                               time.Duration
		routing, tunnel, underlay, clusterCIDR                                                         string
		masquerade                                                                                     bool
		masqExclude                                                                                    []string
		masqPorts                                                                                      string
		nodePortMode                                                                                   string
		labControlPlane                                                                                bool
		labJoin                                                                                        string
		nodeGrace                                                                                      time.Duration
		driftPeriod                                                                                    time.Duration
		kernelFallbacks                                                                                string
		lbPool                                                                                         string
		maglevSize                                                                                     int
		nodePortAddrs                                                                                  []string
		uninstallWhenRemoved                                                                           bool
		cniFiles                                                                                       []string
	)
	cmd := &cobra.Command{
		Use:           "shuntd",
		Short:         "shunt node agent: eBPF pod networking, services and policy",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			if os.Getenv("GOGC") == "" {
				// The agent's heap is mostly the cluster's objects, long-lived
				// and mostly idle: collecting at +50% instead of Go's +100%
				// keeps a node's resident memory closer to what it holds, for
				// a little CPU at bursts of changes. GOGC overrides it.
				debug.SetGCPercent(50)
			}
			i, err := instance.New(inst)
			if err != nil {
				return err
			}
			cfg := agent.Config{Instance: i, PodCIDR: podCIDR, ServiceCIDR: serviceCIDR,
				FlowHistory: flowHistory, FlowBufferBytes: flowBuffer, MetricsAddr: metricsAddr, FlowsAddr: flowsAddr, FlowsTLSDir: flowsTLSDir, SocketAccel: socketAccel, AccelNode: accelNode, AccelWithoutBackpressure: accelUnsafe,
				Kubernetes: kubeconfig != "" || inCluster, Kubeconfig: kubeconfig, NodeName: nodeName, RunPods: runPods, NoSchedule: noSched,
				ConntrackSingleTable: ctSingleTable, OverlayDecapInDevice: overlayDecapInDevice, OverlayEncapInDevice: overlayEncapInDevice, BPFStats: bpfStats, ConntrackMax: conntrackMax, LabControlPlane: labControlPlane, LabJoin: labJoin, NodeGrace: nodeGrace,
				DriftCheckPeriod: driftPeriod, RemoveKubeProxyRules: removeKubeProxy, LeaveExternalToKubeProxy: !kubeProxyReplacement}
			if removeKubeProxy && !cfg.Kubernetes {
				return fmt.Errorf("--remove-kube-proxy-rules is for a node of a Kubernetes cluster (with --kubeconfig or --in-cluster): the lab runs no kube-proxy")
			}
			if !kubeProxyReplacement && !cfg.Kubernetes {
				return fmt.Errorf("--kube-proxy-replacement=false leaves NodePorts to kube-proxy, which runs on nodes of a Kubernetes cluster (with --kubeconfig or --in-cluster): the lab has none, and shunt serves them there")
			}
			if !kubeProxyReplacement && removeKubeProxy {
				return fmt.Errorf("--remove-kube-proxy-rules with --kube-proxy-replacement=false: the first removes the rules of the kube-proxy the second works beside; choose one (docs/install.md)")
			}
			if lbPool != "" {
				if cfg.LoadBalancerPool, err = lbipam.ParsePool("--lb-pool", lbPool); err != nil {
					return err
				}
				if labJoin != "" || kubeconfig != "" || inCluster {
					return fmt.Errorf("--lb-pool is the lab's load balancer pool, for the node serving the lab's objects: not with --lab-join (the first node assigns), nor with a Kubernetes API server (its load balancer controller does)")
				}
			}
			switch {
			case maglevSize == 0:
				cfg.MaglevTableSize = -1 // off
			case maglevSize < 0:
				return fmt.Errorf("--maglev-table-size %d: give a prime such as %d, or 0 for no Maglev", maglevSize, maglev.DefaultSize)
			default:
				cfg.MaglevTableSize = maglevSize
			}
			if cfg.NodePortAddresses, err = services.ParseNodePortAddresses(nodePortAddrs); err != nil {
				return err
			}
			if cfg.KernelFallbacks, err = dpinfo.ParseFallbacks(kernelFallbacks); err != nil {
				return fmt.Errorf("--kernel-fallbacks: %w", err)
			}
			if err := datapath.CheckConntrackMax(conntrackMax); err != nil {
				return err
			}
			if driftPeriod < 0 {
				return fmt.Errorf("--drift-check-period %s: give a period, or 0 to compare only on demand (`shunt sync --verify`)", driftPeriod)
			}
			if kubeconfig != "" && inCluster {
				return fmt.Errorf("--kubeconfig and --in-cluster: give one")
			}
			if noSched && !runPods {
				return fmt.Errorf("--no-schedule is for a node whose kubelet the agent plays (--run-pods)")
			}
			if runPods && !cfg.Kubernetes {
				return fmt.Errorf("--run-pods is for a node of a Kubernetes cluster (with --kubeconfig); the lab runs its pods anyway")
			}
			if cmd.Flags().Changed("node-lease-duration-seconds") {
				if !runPods {
					return fmt.Errorf("--node-lease-duration-seconds is the heartbeat of a node whose kubelet the agent plays (--run-pods); a real kubelet has its own")
				}
				if nodeLeaseSeconds < 4 {
					return fmt.Errorf("--node-lease-duration-seconds %d: give at least 4 (the Lease is renewed every quarter of it), and less than the controller-manager's --node-monitor-grace-period", nodeLeaseSeconds)
				}
				cfg.NodeLeaseDuration = time.Duration(nodeLeaseSeconds) * time.Second
			}
			cfg.CrashLoopBackOff = crashLoopBackOff
			if cfg.FlowSampling, err = datapath.ParseFlowMode(flowSampling); err != nil {
				return err
			}
			cfg.Routing, cfg.Tunnel = routing, tunnel
			if clusterCIDR != "" {
				if cfg.ClusterCIDR, err = netip.ParsePrefix(clusterCIDR); err != nil || !cfg.ClusterCIDR.Addr().Is4() || cfg.ClusterCIDR.Masked() != cfg.ClusterCIDR {
					return fmt.Errorf("--cluster-cidr %q: give the IPv4 range every node's pod CIDR is cut from, e.g. 10.244.0.0/16", clusterCIDR)
				}
			}
			if underlay != "" {
				if cfg.Underlay, err = netip.ParseAddr(underlay); err != nil || !cfg.Underlay.Is4() {
					return fmt.Errorf("--underlay-addr %q: give this node's IPv4 address on the network between nodes", underlay)
				}
			}
			cfg.Masquerade = masquerade
			if cfg.NodePortMode, err = dpinfo.ParseNodePortMode(nodePortMode); err != nil {
				return fmt.Errorf("--nodeport-mode: %w", err)
			}
			if masqPorts != "" {
				if cfg.MasqueradePorts, err = dpinfo.ParsePortRange(masqPorts); err != nil {
					return fmt.Errorf("--masquerade-ports: %w", err)
				}
			}
			if cmd.Flags().Changed("masquerade-exclude") {
				cfg.MasqueradeExclude = []netip.Prefix{}
				for _, c := range masqExclude {
					p, err := netip.ParsePrefix(c)
					if err != nil || !p.Addr().Is4() {
						return fmt.Errorf("--masquerade-exclude %q: give IPv4 CIDRs, e.g. 10.0.0.0/8,192.168.0.0/16", c)
					}
					cfg.MasqueradeExclude = append(cfg.MasqueradeExclude, p.Masked())
				}
			}
			if mode != "" {
				if cfg.Mode, err = datapath.ParseMode(mode); err != nil {
					return err
				}
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.ShimExe, cfg.BinDir = exe, filepath.Dir(exe)
			cfg.Images = podImages(agnhost, cfg.BinDir)
			cfg.DNS.Domain = clusterDomain
			for _, a := range clusterDNS {
				addr, err := netip.ParseAddr(a)
				if err != nil {
					return fmt.Errorf("--cluster-dns %q: give the DNS Service's IP address (e.g. 10.96.0.10)", a)
				}
				cfg.DNS.Servers = append(cfg.DNS.Servers, addr)
			}
			a, err := agent.New(cfg, log.With("instance", i.Name))
			if err != nil {
				return err
			}
			closed := false
			defer func() {
				if !closed {
					a.Close()
				}
			}()
			if err := writeFlags(i.AgentFlagsFile(), cmd.Flags()); err != nil {
				// Only `lab up`'s comparison of settings needs it.
				log.Warn("recording the agent's flags for `shunt lab up`", "err", err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			var removal *removalWatch
			if uninstallWhenRemoved {
				if removal, err = watchRemoval(ctx, kubeconfig, log); err != nil {
					return err
				}
			}
			err = a.Run(ctx)
			if removal == nil || !removal.removed.Load() {
				return err
			}
			log.Info("this agent's DaemonSet is gone: removing everything of shunt from the node", "cniFiles", cniFiles)
			closed = true
			uerr := a.Uninstall()
			for _, f := range cniFiles {
				if rmErr := os.Remove(f); rmErr != nil && !os.IsNotExist(rmErr) {
					uerr = errors.Join(uerr, rmErr)
				}
			}
			return errors.Join(err, uerr)
		},
	}
	cmd.Flags().StringVar(&inst, "instance", envOr("SHUNT_INSTANCE", instance.Default), "name of this shunt node on the machine (env SHUNT_INSTANCE)")
	cmd.Flags().StringVar(&mode, "mode", "", fmt.Sprintf("pod forwarding mode %v (default: as persisted, else redirect-peer)", datapath.Modes))
	cmd.Flags().StringVar(&podCIDR, "pod-cidr", "", "IPv4 CIDR for pod addresses (default: as persisted, else "+instance.DefaultPodCIDR+")")
	cmd.Flags().StringVar(&serviceCIDR, "service-cidr", "", "IPv4 CIDR for ClusterIPs (default: as persisted, else "+instance.DefaultServiceCIDR+")")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&flowSampling, "flow-sampling", "default", "flow events: "+dpinfo.FlowModeChoices)
	cmd.Flags().IntVar(&flowHistory, "flow-history", 8192, "flows kept in memory for 'shunt observe'")
	cmd.Flags().IntVar(&flowBuffer, "flow-buffer-bytes", 4<<20, "size of the flow ring buffer (a power of two, at least a page)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "also serve Prometheus /metrics on this TCP address (it is always on the agent's socket)")
	cmd.Flags().StringVar(&flowsAddr, "flows-addr", "", "also serve this node's flows (read only) on this TCP address, for a relay ('shunt relay'): by mutual TLS with --flows-tls-dir, else only on loopback")
	cmd.Flags().StringVar(&flowsTLSDir, "flows-tls-dir", "", "with --flows-addr: the agent's certificate and key and the CA a relay's client certificate must be signed by (ca.crt, tls.crt, tls.key)")
	cmd.Flags().BoolVar(&socketAccel, "socket-acceleration", false, "accelerate TCP between local sockets (sockops + sk_msg + sockhash)")
	cmd.Flags().BoolVar(&overlayDecapInDevice, "overlay-decap-in-device", false, "the overlay's packets are decapsulated by the node's VXLAN device only, not taken off the wire by the uplink's BPF (the benchmarks' baseline for that path)")
	cmd.Flags().BoolVar(&bpfStats, "bpf-stats", false, "turn on the kernel's run-time statistics of BPF programs while the agent runs (Linux 5.8; tens of nanoseconds per program run): runs and time per hook in shunt status and the shunt_bpf_program_* metrics")
	cmd.Flags().BoolVar(&overlayEncapInDevice, "overlay-encap-in-device", false, "packets for other nodes' pods are encapsulated by the node's VXLAN device only, not in BPF and sent out of the underlay interface (the benchmarks' baseline for that path)")
	cmd.Flags().BoolVar(&ctSingleTable, "conntrack-single-table", false, "baseline for benchmarks: new connections enter the established conntrack table at once, so a SYN flood evicts established connections")
	cmd.Flags().IntVar(&conntrackMax, "conntrack-max", datapath.DefaultConntrackMax, fmt.Sprintf("entries of each connection table (conntrack; the NodePort, masquerade and tc translations, two entries per translated flow; connections not yet assured get a quarter): full, a table evicts its least recently used entry; from %d to %d; a table pinned at another size is replaced at start, its entries kept (docs/nodeport.md)", datapath.MinConntrackMax, datapath.MaxConntrackMax))
	cmd.Flags().BoolVar(&accelNode, "accelerate-node-processes", false, "with --socket-acceleration: the node's own processes too, not only pods and the node proxy")
	cmd.Flags().BoolVar(&accelUnsafe, "accelerate-without-backpressure", false, "allow socket acceleration on a kernel that cannot hold a fast writer back (no msg_tot_len in struct sk_psock, e.g. Linux 6.1), where a writer faster than its reader gets ENOMEM; without it acceleration is refused there")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "take objects from this Kubernetes API server (pods are plumbed through shunt-cni) instead of the lab")
	cmd.Flags().BoolVar(&inCluster, "in-cluster", false, "take objects from the API server of the cluster this runs in (a DaemonSet pod's service account)")
	cmd.Flags().StringVar(&nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's Node: with --kubeconfig/--in-cluster the Node object, in a multi-node lab its name (env NODE_NAME; default: the instance name)")
	cmd.Flags().StringVar(&clusterCIDR, "cluster-cidr", "", "IPv4 range of every node's pod CIDR (kube-controller-manager's --cluster-cidr): pods route it through this node, which reaches pods of other nodes")
	cmd.Flags().StringVar(&routing, "routing", "", "how pods of other nodes are reached (Cilium's routingMode): tunnel (through the overlay --tunnel names; --tunnel alone means it) or native (no encapsulation: the underlay routes every node's pod CIDR to it; tc forwards with bpf_fib_lookup over the routes the agent installs via each node's --underlay-addr); default none (the host routes them)")
	cmd.Flags().StringVar(&tunnel, "tunnel", "", "reach pods of other nodes through an overlay: vxlan (a collect-metadata VXLAN device, UDP 4789); default none (the host routes them)")
	cmd.Flags().StringVar(&underlay, "underlay-addr", "", "with --routing, --tunnel or --masquerade: this node's IPv4 address other nodes reach it at (default with --kubeconfig: the Node's InternalIP)")
	cmd.Flags().BoolVar(&masquerade, "masquerade", false, "pods' traffic to destinations outside the cluster leaves from the node's address (--underlay-addr, or the Node's InternalIP), translated in BPF on the interface holding it; no iptables")
	cmd.Flags().StringSliceVar(&masqExclude, "masquerade-exclude", nil, "with --masquerade: CIDRs pods reach with their own address (default: the cluster CIDR, the service CIDR and the node's addresses)")
	cmd.Flags().StringVar(&nodePortMode, "nodeport-mode", "", "how flows from outside (NodePort, load balancer, externalIPs) reach backends on other nodes: snat (default: from this node's address, the reply back through it), dsr (direct server return: the client's address kept, IPIP to the backend's node, the reply from there; with --routing native or the overlay) or hybrid (DSR for TCP, SNAT for UDP)")
	cmd.Flags().StringVar(&masqPorts, "masquerade-ports", "", "with --masquerade: source ports of masqueraded flows, MIN-MAX (default "+dpinfo.DefaultMasqPorts.String()+": above Linux's default ephemeral range, so the node's own connections never take one)")
	cmd.Flags().DurationVar(&crashLoopBackOff, "crash-loop-back-off", 10*time.Second, "the lab kubelet's back-off before a container's second restart, doubled at each next one up to 5 min, as kubelet's (shorter for tests)")
	cmd.Flags().IntVar(&nodeLeaseSeconds, "node-lease-duration-seconds", int(lab.DefaultNodeLeaseDuration/time.Second), "with --run-pods: the duration of the node's Lease in kube-node-lease, renewed every quarter of it, as kubelet's flag of that name (the node keeps it across restarts)")
	cmd.Flags().BoolVar(&labControlPlane, "lab-control-plane", false, "this lab node's control plane also serves the lab's other nodes ('shunt lab up --nodes N'): their Nodes, the objects, their pods' status, one identity numbering; the node keeps it")
	cmd.Flags().StringVar(&labJoin, "lab-join", "", "join a multi-node lab: take objects from the control plane of the agent at this socket (the lab's first node) and run the pods it places on --node-name; the node keeps it")
	cmd.Flags().DurationVar(&nodeGrace, "node-grace", 0, "with --lab-control-plane: how long a joined node's agent may go silent before the node is NotReady and its pods leave every Service (default "+lab.DefaultNodeGrace.String()+", Kubernetes' node-monitor-grace-period)")
	cmd.Flags().BoolVar(&kubeProxyReplacement, "kube-proxy-replacement", true, "with --kubeconfig/--in-cluster: true, shunt translates every Service and refuses kube-proxy's rules on the node; false, shunt translates ClusterIPs and hostPorts and leaves NodePorts, load balancer addresses, externalIPs and health check node ports to the kube-proxy running beside it (docs/install.md)")
	cmd.Flags().BoolVar(&removeKubeProxy, "remove-kube-proxy-rules", false, "with --kubeconfig/--in-cluster: remove kube-proxy's rules (nftables table, iptables-nft chains) found on the node at start, as 'kube-proxy --cleanup' does, instead of refusing to start; stop kube-proxy on the node first (docs/install.md)")
	cmd.Flags().BoolVar(&runPods, "run-pods", false, "with --kubeconfig: play this node's kubelet (and a one-node scheduler), running the API's pods in network namespaces on this machine; never beside a real kubelet")
	cmd.Flags().StringVar(&kernelFallbacks, "kernel-fallbacks", os.Getenv("SHUNT_KERNEL_FALLBACKS"), "take these older kernel paths even where the kernel has the newer feature, as on Linux 5.15: all, or a list of "+fmt.Sprint(dpinfo.AllFallbacks)+" (env SHUNT_KERNEL_FALLBACKS; a kernel lacking a feature takes its fallback anyway; docs/kernels.md)")
	cmd.Flags().StringVar(&lbPool, "lb-pool", "", "IPv4 CIDR the lab's LoadBalancer Services get their address from (written into status.loadBalancer.ingress, as Cilium's LB-IPAM does; not with --lab-join or --kubeconfig); default none: they stay pending")
	cmd.Flags().StringSliceVar(&nodePortAddrs, "nodeport-addresses", nil, "as kube-proxy's flag: IPv4 CIDRs (and \"primary\", the node's underlay address) selecting the node addresses NodePorts are served on; a CIDR holding 127.0.0.1 (e.g. 127.0.0.0/8) serves them to the node's own processes at 127.0.0.1 (default: every address of the node but 127.0.0.1)")
	cmd.Flags().IntVar(&maglevSize, "maglev-table-size", maglev.DefaultSize, "size M (a prime) of the Maglev table of each Service reached from outside (NodePort, load balancer, externalIPs): every node picks the same backend for a flow; give every node the same M, at least 100 × a Service's backends; 0: a random backend per new flow")
	cmd.Flags().DurationVar(&driftPeriod, "drift-check-period", agent.DefaultDriftCheckPeriod, "how often the maps the agent fully determines (services, backends, policy, ipcache, endpoints, L7 redirects, configuration) are compared with the desired state and what differs repaired; 0: only on demand ('shunt sync --verify')")
	cmd.Flags().BoolVar(&uninstallWhenRemoved, "uninstall-when-removed", false, "with --in-cluster: at SIGTERM, when this agent's DaemonSet is gone or being deleted (helm uninstall), remove everything of shunt from the node (pins, interfaces, routes, state, --cni-files) instead of keeping it for the next agent")
	cmd.Flags().StringSliceVar(&cniFiles, "cni-files", nil, "with --uninstall-when-removed: the CNI configuration and plugin files the install step wrote, removed with the rest")
	cmd.Flags().BoolVar(&noSched, "no-schedule", false, "with --run-pods: leave pods that name no node to kube-scheduler (which honours nodeSelector and affinity) instead of binding them to this node")
	cmd.Flags().StringSliceVar(&clusterDNS, "cluster-dns", nil, "with --run-pods: the cluster DNS Service's addresses (kubelet's --cluster-dns), the nameservers of pods of dnsPolicy ClusterFirst (default none: such pods get the node's resolv.conf, as from a kubelet without it)")
	cmd.Flags().StringVar(&clusterDomain, "cluster-domain", lab.DefaultClusterDomain, "with --run-pods: the cluster's DNS domain (kubelet's --cluster-domain), in pods' search list and /etc/hosts")
	cmd.Flags().StringVar(&agnhost, "agnhost", "", "the agnhost program that pods of registry.k8s.io/e2e-test-images/agnhost and registry.k8s.io/pause images run (default: agnhost beside shuntd, else the one scripts/kube-build.sh agnhost built); without one those pods stay Pending (ImageNotMapped)")
	cmd.AddCommand(newShimCmd())
	cmd.AddCommand(newKubeletCmd())
	return cmd
}

// podImages finds the programs of the images the lab kubelet maps:
// agnhost (the flag, beside shuntd, or in the Kubernetes build cache),
// Debian's static busybox, coredns and Istio's echo app (beside shuntd or
// in the Kubernetes build cache). One not found leaves its images
// unmapped.
func podImages(agnhost, binDir string) lab.Images {
	var im lab.Images
	candidates := []string{filepath.Join(binDir, "agnhost"), filepath.Join(kubecluster.DefaultBinDir(), "agnhost")}
	if agnhost != "" {
		candidates = []string{agnhost}
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && st.Mode()&0o111 != 0 {
			im.Agnhost = c
			break
		}
	}
	if st, err := os.Stat("/bin/busybox"); err == nil && st.Mode()&0o111 != 0 {
		im.Busybox = "/bin/busybox"
	}
	for _, c := range []string{filepath.Join(binDir, "coredns"), filepath.Join(kubecluster.DefaultBinDir(), "coredns")} {
		if st, err := os.Stat(c); err == nil && st.Mode()&0o111 != 0 {
			im.CoreDNS = c
			break
		}
	}
	for _, dir := range []string{binDir, kubecluster.DefaultBinDir()} {
		if istioEchoComplete(dir) {
			im.IstioEcho = dir
			break
		}
	}
	return im
}

// istioEchoComplete says whether dir holds every file of Istio's echo
// image (scripts/kube-build.sh istio-echo).
func istioEchoComplete(dir string) bool {
	for _, name := range lab.IstioEchoFiles {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

// writeFlags records every flag's value, defaults included (a list as
// comma-separated values), as JSON at path (instance.AgentFlagsFile).
func writeFlags(path string, flags *pflag.FlagSet) error {
	values := map[string]string{}
	flags.VisitAll(func(f *pflag.Flag) {
		if list, ok := f.Value.(pflag.SliceValue); ok {
			values[f.Name] = strings.Join(list.GetSlice(), ",")
			return
		}
		values[f.Name] = f.Value.String()
	})
	data, err := json.Marshal(values)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, data)
}

// newShimCmd is the per-container supervisor the agent starts; not for users.
func newShimCmd() *cobra.Command {
	var netnsPath, exitFile, logFile, hostname, bindsJSON string
	var sec podexec.Security
	var uid, gid int64
	var rootfs string
	var mounts []string
	cmd := &cobra.Command{
		Use:    "shim --netns PATH --exit-file FILE [--log-file FILE] [--rootfs DIR --mount SRC:DST[:ro]...] [--privileged | --cap-add CAPS --cap-drop CAPS] [--uid N --gid N] -- CMD [ARGS...]",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		Run: func(cmd *cobra.Command, args []string) {
			if uid >= 0 {
				u := uint32(uid)
				sec.UID = &u
			}
			if gid >= 0 {
				g := uint32(gid)
				sec.GID = &g
			}
			var binds []podexec.Bind
			if bindsJSON != "" {
				if err := json.Unmarshal([]byte(bindsJSON), &binds); err != nil {
					fmt.Fprintf(os.Stderr, "shim: --binds %q: %v\n", bindsJSON, err)
					os.Exit(127)
				}
			}

			fs := lab.ContainerFS{Rootfs: rootfs, Binds: binds}
			for _, m := range mounts {
				pm, err := podexec.ParseMount(m)
				if err != nil {
					fmt.Fprintln(os.Stderr, "shunt:", err)
					os.Exit(127)
				}
				fs.Mounts = append(fs.Mounts, pm)
			}
			os.Exit(lab.RunShimIn(netnsPath, exitFile, logFile, hostname, sec, fs, args))
		},
	}
	cmd.Flags().StringVar(&netnsPath, "netns", "", "network namespace to run in")
	cmd.Flags().StringVar(&exitFile, "exit-file", "", "where to record the exit status")
	cmd.Flags().StringVar(&logFile, "log-file", "", "write the container's stdout and stderr to this file in the CRI's log format (default: to the shim's own)")
	cmd.Flags().StringVar(&bindsJSON, "binds", "", "what the container mounts, as JSON: [{\"Source\":..., \"Target\":..., \"ReadOnly\":...}] (its resolv.conf, hosts, volumes)")
	cmd.Flags().StringVar(&hostname, "hostname", "", "the pod's host name, in a UTS namespace of its own (default: the node's)")
	cmd.Flags().BoolVar(&sec.Privileged, "privileged", false, "keep every capability (securityContext.privileged)")
	cmd.Flags().StringSliceVar(&sec.Add, "cap-add", nil, "capabilities beyond a runtime's default set")
	cmd.Flags().StringSliceVar(&sec.Drop, "cap-drop", nil, "capabilities of the default set to drop (ALL: every one)")
	cmd.Flags().Int64Var(&uid, "uid", -1, "run as this user (runAsUser; default root)")
	cmd.Flags().Int64Var(&gid, "gid", -1, "run as this group (runAsGroup)")
	cmd.Flags().StringVar(&rootfs, "rootfs", "", "run chrooted in this root file system (an image's), in a mount namespace of its own")
	cmd.Flags().StringArrayVar(&mounts, "mount", nil, "with --rootfs: bind-mount SOURCE of the node at TARGET (a volume; :ro read-only)")
	cmd.MarkFlagRequired("netns")
	cmd.MarkFlagRequired("exit-file")
	return cmd
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
