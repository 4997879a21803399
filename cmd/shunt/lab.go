package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/labnet"
	"github.com/shuntnet/shunt/internal/podexec"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/teardown"
)

func newLabCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "a node of pods (network namespaces + cgroups) on this machine",
	}
	cmd.AddCommand(newLabUpCmd(g), newLabDownCmd(g), newLabExecCmd(g), newLabLogsCmd(g),
		newLabServeCmd(), newLabProbeCmd(), newLabHTTPLoadCmd(), newLabHTTPGetCmd())
	return cmd
}

func newLabUpCmd(g *globals) *cobra.Command {
	var (
		files         []string
		mode, podCIDR string
		serviceCIDR   string
		wait          time.Duration
		agentFlags    runFlags
		multi         multiNodeFlags
	)
	cmd := &cobra.Command{
		Use:   "up [-f FILE|DIR|-] [--mode MODE] [--pod-cidr CIDR]",
		Short: "start the lab's agent (a running one: switch live settings, refuse start-time ones that differ) and apply manifests",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := dpinfo.ParseNodePortMode(agentFlags.nodePortMode); err != nil {
				return fmt.Errorf("--nodeport-mode: %w", err)
			}
			if agentFlags.masqPorts != "" {
				// Refused before anything starts (shuntd would refuse it too,
				// after the lab's namespaces were made).
				if _, err := dpinfo.ParsePortRange(agentFlags.masqPorts); err != nil {
					return fmt.Errorf("--masquerade-ports: %w", err)
				}
			}
			var objs []api.Object
			if len(files) > 0 {
				// Check the files before starting anything.
				var err error
				if objs, err = readObjects(files); err != nil {
					return err
				}
			}
			c, inst, err := g.client()
			if err != nil {
				return err
			}
			// A lab this command makes is removed again when it fails to start.
			_, statErr := os.Stat(inst.StateDir())
			fresh := statErr != nil && !c.Alive()
			layout, err := settleLayout(c, inst, multi, agentFlags)
			if err != nil {
				return err
			}
			if layout != nil {
				if podCIDR != "" {
					return errors.New("--pod-cidr with --nodes: each node's pod CIDR is cut from --cluster-cidr")
				}
				err = ensureLabNodes(inst, layout, mode, serviceCIDR, agentFlags, askedSettings(cmd.Flags(), nodeSettings...))
				if err != nil && fresh {
					if derr := uninstallLab(inst, layout); derr != nil {
						err = fmt.Errorf("%w; removing what was built: %v", err, derr)
					}
				}
			} else {
				err = ensureAgent(c, inst, mode, podCIDR, serviceCIDR, agentFlags.args(), askedSettings(cmd.Flags()))
			}
			if err != nil {
				return err
			}
			if len(objs) == 0 {
				return nil
			}
			var resp api.ChangesResponse
			err = c.Do("POST", "/v1/apply", api.ObjectsRequest{Objects: objs}, &resp)
			printChanges(resp.Changes)
			if err != nil {
				return err
			}
			return waitPodsRunning(c, wait)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - (repeatable)")
	cmd.Flags().StringVar(&mode, "mode", "", "pod forwarding: redirect-peer (default), redirect, bridge or routed")
	cmd.Flags().StringVar(&podCIDR, "pod-cidr", "", "IPv4 CIDR for pod addresses (default "+instance.DefaultPodCIDR+")")
	cmd.Flags().StringVar(&serviceCIDR, "service-cidr", "", "IPv4 CIDR for ClusterIPs (default "+instance.DefaultServiceCIDR+")")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the pods' containers to run (0: don't)")
	cmd.Flags().StringVar(&agentFlags.flowSampling, "flow-sampling", "", "flow events: "+dpinfo.FlowModeChoices)
	cmd.Flags().IntVar(&agentFlags.flowHistory, "flow-history", 0, "flows the agent keeps for 'shunt observe' (default 8192)")
	cmd.Flags().IntVar(&agentFlags.flowBuffer, "flow-buffer-bytes", 0, "size of the flow ring buffer (default 4 MiB)")
	cmd.Flags().StringVar(&agentFlags.metricsAddr, "metrics-addr", "", "also serve Prometheus /metrics on this TCP address (e.g. 127.0.0.1:9962)")
	cmd.Flags().BoolVar(&agentFlags.socketAccel, "socket-acceleration", false, "accelerate TCP between local sockets (sockops + sk_msg); 'shunt accel on|off' switches it at run time")
	cmd.Flags().IntVar(&agentFlags.conntrackMax, "conntrack-max", 0, "entries of each connection table of every node (shuntd --conntrack-max; default 131072)")
	cmd.Flags().BoolVar(&agentFlags.overlayDecapInDevice, "overlay-decap-in-device", false, "the overlay's packets are decapsulated by the node's VXLAN device only, not taken off the wire by the uplink's BPF (the benchmarks' baseline for that path)")
	cmd.Flags().BoolVar(&agentFlags.bpfStats, "bpf-stats", false, "turn on the kernel's run-time statistics of BPF programs while the agent runs (Linux 5.8; tens of nanoseconds per program run): runs and time per hook in shunt status and the shunt_bpf_program_* metrics")
	cmd.Flags().BoolVar(&agentFlags.overlayEncapInDevice, "overlay-encap-in-device", false, "packets for other nodes' pods are encapsulated by the node's VXLAN device only, not in BPF and sent out of the underlay interface (the benchmarks' baseline for that path)")
	cmd.Flags().BoolVar(&agentFlags.ctSingleTable, "conntrack-single-table", false, "baseline for benchmarks: new connections enter the established conntrack table at once, so a SYN flood evicts established connections")
	cmd.Flags().BoolVar(&agentFlags.accelNode, "accelerate-node-processes", false, "with --socket-acceleration: the node's own processes too, not only pods and the node proxy")
	cmd.Flags().BoolVar(&agentFlags.accelUnsafe, "accelerate-without-backpressure", false, "with --socket-acceleration: on a kernel without backpressure for accelerated sockets too (shuntd --accelerate-without-backpressure; a fast writer can get ENOMEM there)")
	cmd.Flags().StringVar(&agentFlags.kubeconfig, "kubeconfig", "", "take objects from this Kubernetes API server instead of the lab's (the node is --node-name's Node; pods are plumbed through shunt-cni)")
	cmd.Flags().StringVar(&agentFlags.nodeName, "node-name", "", "with --kubeconfig: this node's Node object (default: the instance name)")
	cmd.Flags().StringVar(&agentFlags.clusterCIDR, "cluster-cidr", "", "IPv4 range of every node's pod CIDR: pods route it through their node (pods of other nodes)")
	cmd.Flags().StringVar(&agentFlags.routing, "routing", "", "how pods of other nodes are reached: tunnel (an overlay, --tunnel; the default with --tunnel) or native (no encapsulation: the underlay routes pod CIDRs); the node keeps it (default none)")
	cmd.Flags().StringVar(&agentFlags.tunnel, "tunnel", "", "reach pods of other nodes through an overlay: vxlan (the node keeps it; default none)")
	cmd.Flags().StringVar(&agentFlags.underlay, "underlay-addr", "", "with --routing, --tunnel or --masquerade: this node's IPv4 address other nodes tunnel to (default with --kubeconfig: the Node's InternalIP)")
	cmd.Flags().BoolVar(&agentFlags.masquerade, "masquerade", false, "pods' traffic to outside the cluster leaves from the node's address (--underlay-addr), translated in BPF on its uplink (the node keeps it)")
	cmd.Flags().StringVar(&agentFlags.masqExclude, "masquerade-exclude", "", "with --masquerade: comma-separated CIDRs pods reach with their own address (default: the cluster CIDR, service CIDR and node addresses)")
	cmd.Flags().StringVar(&agentFlags.masqPorts, "masquerade-ports", "", "with --masquerade: source ports of masqueraded flows, MIN-MAX (default "+dpinfo.DefaultMasqPorts.String()+", outside Linux's ephemeral range)")
	cmd.Flags().StringVar(&agentFlags.nodePortMode, "nodeport-mode", "", "how flows from outside reach backends on other nodes: snat (default), dsr (direct server return, with native routing or the overlay) or hybrid (DSR for TCP, SNAT for UDP)")
	cmd.Flags().IntVar(&agentFlags.nodeLeaseSeconds, "node-lease-duration-seconds", 0, "with --kubeconfig and --run-pods: the node's Lease duration, renewed every quarter of it (kubelet's flag; default 40, the node keeps it)")
	cmd.Flags().IntVar(&multi.nodes, "nodes", 0, "build a lab of this many nodes (2-9), each an agent in a network namespace of its own joined by an underlay, with a host outside the cluster ('lab exec --external'); the lab keeps its nodes (default: as it is, else one node)")
	cmd.Flags().DurationVar(&multi.nodeGrace, "node-grace", 0, "with --nodes: how long a node's agent may go silent before the node is NotReady and its pods leave every Service (default 40s)")
	cmd.Flags().StringVar(&agentFlags.lbPool, "lb-pool", "", "IPv4 CIDR the lab's LoadBalancer Services get their address from (status.loadBalancer.ingress, as Cilium's LB-IPAM); with --nodes the external host routes it to node-1 (default none: they stay pending)")
	cmd.Flags().StringVar(&agentFlags.nodePortAddrs, "nodeport-addresses", "", "comma-separated IPv4 CIDRs (and \"primary\") selecting the node addresses NodePorts are served on, as kube-proxy's flag; one holding 127.0.0.1 serves them to the node's processes at 127.0.0.1 (default: every node address but 127.0.0.1)")
	cmd.Flags().StringVar(&agentFlags.driftPeriod, "drift-check-period", "", "how often the agent compares the maps it fully determines with the desired state and repairs what differs, e.g. 1s, 10m; 0: only on demand, with 'shunt sync --verify' (default 2m)")
	cmd.Flags().Var(negatedBool{&agentFlags.besideKubeProxy}, "kube-proxy-replacement", "with --kubeconfig: false leaves NodePorts, load balancer addresses and externalIPs to a kube-proxy running on the node (shuntd's flag)")
	cmd.Flags().Lookup("kube-proxy-replacement").NoOptDefVal = "true"
	cmd.Flags().BoolVar(&agentFlags.removeKubeProxy, "remove-kube-proxy-rules", false, "with --kubeconfig: remove kube-proxy's rules found on the node at start instead of refusing to start (shuntd's flag; stop kube-proxy first)")
	cmd.Flags().StringVar(&agentFlags.clusterDNS, "cluster-dns", "", "with --kubeconfig: the cluster DNS Service's address (kubelet's --cluster-dns; 'shunt dev cluster up --dns' runs one at the service CIDR's .10) that pods of dnsPolicy ClusterFirst get in their resolv.conf (default none: the node's resolver)")
	cmd.Flags().StringVar(&agentFlags.clusterDomain, "cluster-domain", "", "with --kubeconfig: the cluster's DNS domain (kubelet's --cluster-domain; default cluster.local)")
	cmd.Flags().BoolVar(&agentFlags.noSchedule, "no-schedule", false, "with --kubeconfig: leave pods that name no node to kube-scheduler instead of binding them to this node")
	cmd.Flags().BoolVar(&agentFlags.runPods, "run-pods", true, "with --kubeconfig: the lab plays the node's kubelet and scheduler, running the API's pods here (false: a container runtime calls shunt-cni)")
	return cmd
}

// negatedBool is a boolean flag stored negated: --kube-proxy-replacement
// (default true) sets besideKubeProxy when false.
type negatedBool struct{ p *bool }

func (b negatedBool) String() string {
	if b.p == nil {
		return "true"
	}
	return strconv.FormatBool(!*b.p)
}

func (b negatedBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	*b.p = !v
	return err
}

func (negatedBool) Type() string { return "bool" }

// runFlags are shuntd settings that apply to this run of the agent only
// (unlike mode and CIDRs, which the node keeps).
type runFlags struct {
	flowSampling, metricsAddr string
	flowHistory, flowBuffer   int
	socketAccel               bool
	accelNode                 bool
	accelUnsafe               bool
	ctSingleTable             bool
	overlayDecapInDevice      bool
	overlayEncapInDevice      bool
	bpfStats                  bool
	conntrackMax              int
	kubeconfig, nodeName      string
	runPods                   bool
	noSchedule                bool
	besideKubeProxy           bool // --kube-proxy-replacement=false
	removeKubeProxy           bool
	clusterDNS, clusterDomain string
	nodeLeaseSeconds          int
	routing, tunnel, underlay string
	clusterCIDR               string
	masquerade                bool
	masqExclude, masqPorts    string
	nodePortMode              string
	driftPeriod               string
	lbPool                    string
	nodePortAddrs             string
}

func (f runFlags) args() []string {
	var args []string
	if f.flowSampling != "" {
		args = append(args, "--flow-sampling", f.flowSampling)
	}
	if f.flowHistory > 0 {
		args = append(args, "--flow-history", fmt.Sprint(f.flowHistory))
	}
	if f.flowBuffer > 0 {
		args = append(args, "--flow-buffer-bytes", fmt.Sprint(f.flowBuffer))
	}
	if f.metricsAddr != "" {
		args = append(args, "--metrics-addr", f.metricsAddr)
	}
	if f.socketAccel {
		args = append(args, "--socket-acceleration")
	}
	if f.accelNode {
		args = append(args, "--accelerate-node-processes")
	}
	if f.accelUnsafe {
		args = append(args, "--accelerate-without-backpressure")
	}
	if f.conntrackMax != 0 {
		args = append(args, "--conntrack-max", fmt.Sprint(f.conntrackMax))
	}
	if f.ctSingleTable {
		args = append(args, "--conntrack-single-table")
	}
	if f.overlayDecapInDevice {
		args = append(args, "--overlay-decap-in-device")
	}
	if f.overlayEncapInDevice {
		args = append(args, "--overlay-encap-in-device")
	}
	if f.bpfStats {
		args = append(args, "--bpf-stats")
	}
	if f.kubeconfig != "" {
		args = append(args, "--kubeconfig", f.kubeconfig)
	}
	if f.nodeName != "" {
		args = append(args, "--node-name", f.nodeName)
	}
	if f.besideKubeProxy {
		args = append(args, "--kube-proxy-replacement=false")
	}
	if f.removeKubeProxy {
		args = append(args, "--remove-kube-proxy-rules")
	}
	if f.kubeconfig != "" && f.runPods {
		args = append(args, "--run-pods")
		if f.noSchedule {
			args = append(args, "--no-schedule")
		}
		if f.nodeLeaseSeconds > 0 {
			args = append(args, "--node-lease-duration-seconds", fmt.Sprint(f.nodeLeaseSeconds))
		}
		if f.clusterDNS != "" {
			args = append(args, "--cluster-dns", f.clusterDNS)
		}
		if f.clusterDomain != "" {
			args = append(args, "--cluster-domain", f.clusterDomain)
		}
	}
	if f.routing != "" {
		args = append(args, "--routing", f.routing)
	}
	if f.tunnel != "" {
		args = append(args, "--tunnel", f.tunnel)
	}
	if f.underlay != "" {
		args = append(args, "--underlay-addr", f.underlay)
	}
	if f.clusterCIDR != "" {
		args = append(args, "--cluster-cidr", f.clusterCIDR)
	}
	if f.masquerade {
		args = append(args, "--masquerade")
	}
	if f.masqExclude != "" {
		args = append(args, "--masquerade-exclude", f.masqExclude)
	}
	if f.masqPorts != "" {
		args = append(args, "--masquerade-ports", f.masqPorts)
	}
	if f.nodePortMode != "" {
		args = append(args, "--nodeport-mode", f.nodePortMode)
	}
	if f.driftPeriod != "" {
		args = append(args, "--drift-check-period", f.driftPeriod)
	}
	if f.lbPool != "" {
		args = append(args, "--lb-pool", f.lbPool)
	}
	if f.nodePortAddrs != "" {
		args = append(args, "--nodeport-addresses", f.nodePortAddrs)
	}
	return args
}

// ensureAgent starts shuntd for the instance unless one answers already;
// extra are run flags for a new agent, asked the settings the user gave
// explicitly, which a running agent is made to have or refused
// (reconcileRunningAgent).
func ensureAgent(c *api.Client, inst instance.Instance, mode, podCIDR, serviceCIDR string, extra []string, asked labSettings) error {
	return ensureAgentIn("", c, inst, mode, podCIDR, serviceCIDR, extra, asked)
}

// ensureAgentIn is ensureAgent for an agent whose node's host side is the
// network namespace at netnsPath ("": this one).
func ensureAgentIn(netnsPath string, c *api.Client, inst instance.Instance, mode, podCIDR, serviceCIDR string, extra []string, asked labSettings) error {
	if c.Alive() {
		var st api.Status
		if err := c.Do("GET", "/v1/status", nil, &st); err != nil {
			return err
		}
		return reconcileRunningAgent(c, inst, st, mode, podCIDR, serviceCIDR, asked)
	}
	exe, err := siblingExecutable("shuntd")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(inst.StateDir(), 0o700); err != nil {
		return err
	}
	logPath := filepath.Join(inst.StateDir(), "shuntd.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"--instance", inst.Name}
	if mode != "" {
		args = append(args, "--mode", mode)
	}
	if podCIDR != "" {
		args = append(args, "--pod-cidr", podCIDR)
	}
	if serviceCIDR != "" {
		args = append(args, "--service-cidr", serviceCIDR)
	}
	agentCmd := exec.Command(exe, append(args, extra...)...)
	agentCmd.Stdout, agentCmd.Stderr = logf, logf
	agentCmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := podexec.Start(podexec.Target{NetnsPath: netnsPath}, agentCmd); err != nil {
		return fmt.Errorf("starting %s: %w", exe, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- agentCmd.Wait() }()
	wait, err := agentStartTimeout()
	if err != nil {
		return err
	}
	deadline := time.After(wait)
	for !c.Alive() {
		select {
		case err := <-exited:
			return fmt.Errorf("shuntd exited (%v):\n%s", err, tail(logPath, 15))
		case <-deadline:
			return fmt.Errorf("shuntd did not answer within %v (SHUNT_AGENT_START_TIMEOUT sets the limit); its log %s ends with:\n%s", wait, logPath, tail(logPath, 15))
		case <-time.After(50 * time.Millisecond):
		}
	}
	fmt.Fprintf(os.Stderr, "shuntd started for lab %q (pid %d, log %s)\n", inst.Name, agentCmd.Process.Pid, logPath)
	return nil
}

// agentStartTimeout is how long a lab waits for its agent's first answer:
// 20 s, or SHUNT_AGENT_START_TIMEOUT (a Go duration) where loading the
// programs takes longer, as in an emulated VM (scripts/kernel-vm.sh).
func agentStartTimeout() (time.Duration, error) {
	v := os.Getenv("SHUNT_AGENT_START_TIMEOUT")
	if v == "" {
		return 20 * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("SHUNT_AGENT_START_TIMEOUT=%q: want a positive duration such as 2m", v)
	}
	return d, nil
}

// siblingExecutable finds another shunt binary next to this one, else on PATH.
func siblingExecutable(name string) (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("cannot find %s next to this binary or on PATH: run `make build`", name)
	}
	return p, nil
}

func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitPodsRunning waits until every container of every pod runs, and fails
// early when one has already exited with an error.
func waitPodsRunning(c *api.Client, timeout time.Duration) error {
	if timeout == 0 {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		var list corev1.PodList
		if err := c.Do("GET", "/v1/pods", nil, &list); err != nil {
			return err
		}
		var waiting []string
		for _, p := range list.Items {
			switch p.Status.Phase {
			case corev1.PodRunning, corev1.PodSucceeded:
				continue
			case corev1.PodFailed:
				return fmt.Errorf("pod %s/%s failed: see `shunt lab logs %s -n %s`", p.Namespace, p.Name, p.Name, p.Namespace)
			}
			waiting = append(waiting, p.Namespace+"/"+p.Name)
		}
		if len(waiting) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pods not running after %s: %s", timeout, strings.Join(waiting, ", "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func newLabDownCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "remove the lab: pods, programs, pins, interfaces, cgroups, state",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return uninstall(g) },
	}
}

func newUninstallCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "uninstall",
		Short: "remove everything this shunt instance created (a second run is a no-op)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return uninstall(g) },
	}
}

// uninstall asks a running agent to tear down and exit, or cleans up
// directly when none runs.
func uninstall(g *globals) error {
	c, inst, err := g.client()
	if err != nil {
		return err
	}
	if l, err := labnet.Load(inst); err != nil || l != nil {
		if err != nil {
			return err
		}
		return uninstallLab(inst, l)
	}
	existed := c.Alive() || labLeftovers(inst)
	// Processes in the pods' namespaces outside their cgroups (lab exec,
	// ip netns exec), which the agent's teardown does not stop.
	stopProcesses := podnet.StopProcesses(instanceNetns(inst))
	if err := stopAgent(c, true); err != nil {
		return err
	}
	stopProcesses()
	// Also sweeps whatever a crashed agent left behind.
	if err := teardown.Instance(inst); err != nil {
		return err
	}
	if !existed {
		fmt.Printf("no lab %q: nothing to remove\n", inst.Name)
		return nil
	}
	fmt.Printf("lab %q removed\n", inst.Name)
	return nil
}

// podTarget locates a running pod's namespace and cgroup, and the node
// instance that runs it.
func podTarget(g *globals, ns, name string) (podexec.Target, instance.Instance, string, error) {
	base, err := g.inst()
	if err != nil {
		return podexec.Target{}, base, "", err
	}
	if err := noLab(base); err != nil {
		return podexec.Target{}, base, "", err
	}
	inst, err := podInstance(base, ns, name)
	if err != nil {
		return podexec.Target{}, inst, "", err
	}
	root, err := cgroup.Root()
	if err != nil {
		return podexec.Target{}, inst, "", err
	}
	t := podexec.Target{
		NetnsPath:  podnet.NetnsPath(inst.PodNetns(ns, name)),
		CgroupPath: inst.PodCgroupDir(root, ns, name),
	}
	if _, err := os.Stat(t.NetnsPath); err != nil {
		t.NetnsPath = podnet.NetnsPath(inst.LegacyPodNetns(ns, name))
		if _, err := os.Stat(t.NetnsPath); err != nil {
			return t, inst, root, fmt.Errorf("pod %s/%s not found in lab %q", ns, name, base.Name)
		}
	}
	return t, inst, root, nil
}

func newLabExecCmd(g *globals) *cobra.Command {
	var ns, container string
	var external, nodePrivileges bool
	cmd := &cobra.Command{
		Use:   "exec (POD [-n NS] [-c CONTAINER] [--node-privileges] | --external) -- CMD [ARGS...]",
		Short: "run a command inside a pod's container, as kubectl exec does (or on the lab's host outside the cluster); its exit code is passed through",
		Long: `Run a command inside a pod's container as the container runs: in its network
and mount namespaces (the node's shunt directories are empty there), its
cgroup, as its user, with its capabilities and its environment, as kubectl
exec does. The container must be running.

--node-privileges runs the command in the pod's network namespace and cgroup
with the node's privileges instead: every capability, the node's mounts (its
agent sockets and pinned maps) and this shell's environment. It is the node
admin's tool (tcpdump in a pod, a container that has exited); no pod's own
process ever has that.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var t podexec.Target
			var c *exec.Cmd
			// As in the pod's containers, shunt's own tools are on PATH.
			if self, err := os.Executable(); err == nil {
				os.Setenv("PATH", filepath.Dir(self)+":"+os.Getenv("PATH"))
			}
			switch {
			case external:
				if cmd.ArgsLenAtDash() != 0 || nodePrivileges || container != "" {
					return errors.New("usage: shunt lab exec --external -- CMD [ARGS...]")
				}
				var err error
				if t, err = externalTarget(g); err != nil {
					return err
				}
				c = exec.Command(args[0], args[1:]...)
				c.Env = os.Environ()
			case cmd.ArgsLenAtDash() != 1 || len(args) < 2:
				return errors.New("usage: shunt lab exec POD [-n NS] [-c CONTAINER] [--node-privileges] -- CMD [ARGS...]")
			case nodePrivileges:
				if container != "" {
					return errors.New("--node-privileges runs in the pod's network namespace, in no container: drop -c")
				}
				var err error
				if t, _, _, err = podTarget(g, ns, args[0]); err != nil {
					return err
				}
				c = exec.Command(args[1], args[2:]...)
				c.Env = append(os.Environ(), "SHUNT_POD_NAME="+args[0], "SHUNT_POD_NAMESPACE="+ns)
			default:
				_, inst, root, err := podTarget(g, ns, args[0])
				if err != nil {
					return err
				}
				j, err := lab.JoinContainer(inst.StateDir(), ns, args[0], container, root)
				if err != nil {
					var nr lab.ErrContainerNotRunning
					if errors.As(err, &nr) {
						return fmt.Errorf("%w: `shunt lab logs %s -n %s` shows its output; `shunt lab exec --node-privileges` runs a command in the pod's network namespace with the node's privileges", err, args[0], ns)
					}
					return err
				}
				t = j.Target
				if c, err = j.Command(args[1:]); err != nil {
					return err
				}
			}
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
			// SIGTERM and SIGINT go to the command, and exec waits for it:
			// killing `lab exec` must not leave its command running.
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
			defer signal.Stop(sigs)
			if err := podexec.Start(t, c); err != nil {
				return err
			}
			done := make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case s := <-sigs:
						c.Process.Signal(s)
					case <-done:
						return
					}
				}
			}()
			err := c.Wait()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return exitError{ee.ExitCode()}
			}
			return err
		},
	}
	cmd.Flags().StringVarP(&ns, "namespace", "n", "default", "namespace of the pod")
	cmd.Flags().StringVarP(&container, "container", "c", "", "the pod's container to run in (default: its first)")
	cmd.Flags().BoolVar(&nodePrivileges, "node-privileges", false, "run in the pod's network namespace and cgroup with the node's privileges and mounts, in no container (the node admin's tool)")
	cmd.Flags().BoolVar(&external, "external", false, "run on the lab's host outside the cluster (a lab of several nodes: on their underlay)")
	return cmd
}

func newLabLogsCmd(g *globals) *cobra.Command {
	var ns, container string
	cmd := &cobra.Command{
		Use:   "logs POD [-n NS] [-c CONTAINER]",
		Short: "print the output of a pod's containers",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			base, err := g.inst()
			if err != nil {
				return err
			}
			if err := noLab(base); err != nil {
				return err
			}
			inst, err := podInstance(base, ns, args[0])
			if err != nil {
				return err
			}
			dir := filepath.Join(inst.StateDir(), "pods", instance.PodFileName(ns, args[0]))
			names, files, err := lab.ContainerLogFiles(dir)
			if err != nil {
				return err
			}
			if len(names) == 0 {
				return fmt.Errorf("pod %s/%s not found in lab %q", ns, args[0], inst.Name)
			}
			// Each container's instances oldest first, as the text they
			// wrote (the files are in the CRI's log format).
			for _, name := range names {
				if container != "" && name != container {
					continue
				}
				if container == "" && len(names) > 1 {
					fmt.Printf("==> %s <==\n", name)
				}
				for _, f := range files[name] {
					if err := lab.WriteLogText(os.Stdout, f); err != nil {
						return err
					}
				}
				if container != "" {
					return nil
				}
			}
			if container != "" {
				return fmt.Errorf("container %q not found in pod %s/%s", container, ns, args[0])
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&ns, "namespace", "n", "default", "namespace of the pod")
	cmd.Flags().StringVarP(&container, "container", "c", "", "container name (default: all)")
	return cmd
}

func newStatusCmd(g *globals) *cobra.Command {
	var output, node string
	cmd := &cobra.Command{
		Use:   "status [-o json]",
		Short: "summarise the agent (every node's, in a lab of several): mode, pod network, peers, datapath counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, inst, err := g.client()
			if err != nil {
				return err
			}
			insts, layout, err := nodeInstances(inst)
			if err != nil {
				return err
			}
			if layout != nil && node != "" && g.socket == "" {
				// One node of a lab of several: its agent's status alone.
				var names []string
				for i, n := range layout.Nodes {
					names = append(names, n.Name)
					if n.Name == node {
						c, layout = api.NewClient(insts[i].Socket()), nil
					}
				}
				if layout != nil {
					return fmt.Errorf("--node %s: lab %q has nodes %s", node, inst.Name, strings.Join(names, ", "))
				}
			} else if node != "" && (layout == nil || g.socket != "") {
				return fmt.Errorf("--node %s: lab %q has one node; --node picks one of a lab of several (`shunt lab up --nodes N`)", node, inst.Name)
			}
			if layout == nil || g.socket != "" {
				var st api.Status
				if err := c.Do("GET", "/v1/status", nil, &st); err != nil {
					return err
				}
				if done, err := printStructured(output, st, 0, nil); done {
					return err
				}
				printStatus(st)
				return nil
			}
			// A lab of several nodes: each node's agent, in turn.
			var all []api.Status
			var errs []error
			for i, n := range layout.Nodes {
				var st api.Status
				if err := api.NewClient(insts[i].Socket()).Do("GET", "/v1/status", nil, &st); err != nil {
					errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
					continue
				}
				all = append(all, st)
			}
			if done, err := printStructured(output, all, 0, nil); done {
				return errors.Join(append(errs, err)...)
			}
			for i, st := range all {
				if i > 0 {
					fmt.Println()
				}
				fmt.Printf("== node %s ==\n", st.NodeName)
				printStatus(st)
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	cmd.Flags().StringVar(&node, "node", "", "a lab of several nodes: only this node's agent (default: every node's, in turn)")
	return cmd
}

// servicesLine is the status's services line: the service CIDR and, when
// the node serves clients from outside the cluster, how their flows reach
// backends on other nodes (--nodeport-mode).
func servicesLine(st api.Status) string {
	how := map[dpinfo.NodePortMode]string{
		dpinfo.NodePortSNAT:   "replies back through this node",
		dpinfo.NodePortDSR:    "replies straight from the backend's node",
		dpinfo.NodePortHybrid: "DSR for TCP, SNAT for UDP",
	}[dpinfo.NodePortMode(st.NodePortMode)]
	switch {
	case st.NodePortMode == "":
		return st.ServiceCIDR
	case how == "":
		return fmt.Sprintf("%s; NodePorts from outside: %s", st.ServiceCIDR, st.NodePortMode)
	}
	return fmt.Sprintf("%s; NodePorts from outside: %s (%s)", st.ServiceCIDR, st.NodePortMode, how)
}

// printStatus prints one agent's status for people.
func printStatus(st api.Status) {
	fmt.Printf("node:      %s\n", st.NodeName)
	fmt.Printf("instance:  %s (shuntd pid %d, up %s)\nsource:    %s\nhealth:    %s\nmode:      %s\npod CIDR:  %s (node %s)\nservices:  %s\npods:      %d\npins:      %s\n",
		st.Instance, st.PID, time.Since(st.Started).Round(time.Second), orNone(st.Source), strings.Join(st.Health, "; "), st.Mode,
		st.PodCIDR, st.NodeIP, servicesLine(st), st.Pods, st.PinDir)
	if r := st.Routing; r != nil && r.Mode != "tunnel" {
		fmt.Printf("routing:   %s out of %s from %s (pod MTU %d)\n", r.Mode, r.Device, r.Underlay, r.PodMTU)
	}
	if t := st.Tunnel; t != nil {
		fmt.Printf("tunnel:    %s on %s from %s (pod MTU %d)\n", t.Kind, t.Device, t.Underlay, t.PodMTU)
	}
	if r := st.Routing; r != nil {
		for _, p := range r.Peers {
			state := "ready"
			if !p.Ready {
				state = "NOT READY"
			}
			if p.Address == "" {
				p.Address, state = "no address", "its pods unreachable"
			}
			fmt.Printf("peer:      %s at %s, pods %s (%s)\n", p.Node, p.Address, p.PodCIDR, state)
		}
	}
	if m := st.Masquerade; m != nil {
		fmt.Printf("masquerade: pods' traffic to outside leaves %s from %s, ports %s (not to %s)\n",
			m.Uplink, m.Address, m.Ports, strings.Join(m.Exclude, ", "))
	}
	if st.ExternalByKubeProxy {
		fmt.Printf("services:  ClusterIPs and hostPorts by shunt; NodePorts, load balancer addresses and externalIPs by kube-proxy (--kube-proxy-replacement=false)\n")
	}
	for _, p := range st.Problems {
		fmt.Printf("left out:  %s\n", p)
	}
	fmt.Printf("flows:     sampling %s, %d emitted, %d lost, %d kept", st.FlowSampling, st.Flows.Emitted, st.Flows.Lost, st.Flows.History)
	if st.MetricsAddr != "" {
		fmt.Printf("; metrics on http://%s/metrics", st.MetricsAddr)
	}
	fmt.Printf("\nL7 proxy:  %s", proxyLine(st.Proxy))
	fmt.Printf("\nsocket acceleration: %s", accelLine(st.Accel))
	fmt.Printf("\ndrift:     %s", driftLine(st.Drift))
	fmt.Printf("\nkernel:    %s\n", st.Kernel.Line())
	fmt.Printf("uses:      %s\n", strings.Join(st.Features, ", "))
	var hooks []string
	for _, h := range slices.Sorted(maps.Keys(st.Hooks)) {
		hooks = append(hooks, fmt.Sprintf("%s x%d", h, st.Hooks[h]))
	}
	fmt.Printf("programs:  %s\n", strings.Join(hooks, ", "))
	if st.ProgramStatsOn {
		var times []string
		for _, p := range st.ProgramStats {
			if p.Runs > 0 {
				times = append(times, fmt.Sprintf("%s %d runs %.0f ns/run", p.Hook, p.Runs, p.NsPerRun()))
			}
		}
		fmt.Printf("run time:  %s\n", orNone(strings.Join(times, ", ")))
	}
	var pressure []string
	for _, m := range st.Maps {
		if m.Entries > 0 && m.Fills() {
			pressure = append(pressure, fmt.Sprintf("%s %d/%d", m.Name, m.Entries, m.Capacity))
		}
	}
	fmt.Printf("maps:      %s\n", strings.Join(pressure, ", "))
	if len(st.Counters) > 0 {
		fmt.Println("datapath counters:")
		for _, c := range st.Counters {
			if c.SocketHook() {
				fmt.Printf("  %-22s %-11s %10d calls\n", c.Reason, c.Direction, c.Packets)
				continue
			}
			fmt.Printf("  %-22s %-11s %10d packets %12d bytes\n", c.Reason, c.Direction, c.Packets, c.Bytes)
		}
	}
}

// labLeftovers says whether anything of the instance is on the machine:
// state, run directory, pins, cgroup, namespaces or its node interface.
func labLeftovers(inst instance.Instance) bool {
	paths := []string{inst.StateDir(), inst.RunDir(), inst.PinDir(), "/sys/class/net/" + inst.NodeIf(), "/sys/class/net/" + inst.TunnelIf()}
	if root, err := cgroup.Root(); err == nil {
		paths = append(paths, inst.CgroupDir(root))
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return len(instanceNetns(inst)) > 0
}

// instanceNetns are the paths of the instance's pod network namespaces
// (a lab of several nodes lists its own in its layout).
func instanceNetns(inst instance.Instance) []string {
	return teardown.PodNetns(inst)
}

// noLab is the error of a command for a lab that does not exist.
func noLab(inst instance.Instance) error {
	if _, err := os.Stat(inst.StateDir()); err == nil {
		return nil
	}
	return fmt.Errorf("no lab running for instance %s: run `shunt --instance %s lab up`", inst.Name, inst.Name)
}
