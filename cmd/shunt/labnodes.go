package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/labnet"
	"github.com/shuntnet/shunt/internal/podexec"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/procstat"
	"github.com/shuntnet/shunt/internal/teardown"
)

// A lab of several nodes (`shunt lab up --nodes N`, internal/labnet): each
// node is an agent of its own instance in a network namespace of its own;
// the first serves the lab's control plane, the others join it.

// multiNodeFlags are what `lab up` takes for a lab of several nodes.
type multiNodeFlags struct {
	nodes       int
	clusterCIDR string
	nodeGrace   time.Duration
}

// settleLayout returns the lab's layout: the one it has, or a new one of
// n nodes made on the machine. A lab of one node stays one.
func settleLayout(c *api.Client, inst instance.Instance, f multiNodeFlags, run runFlags) (*labnet.Layout, error) {
	layout, err := labnet.Load(inst)
	if err != nil {
		return nil, err
	}
	if layout == nil && f.nodes <= 1 {
		return nil, nil
	}
	routing := run.routing
	if routing == "" && run.tunnel != "" {
		routing = "tunnel"
	}
	switch {
	case run.kubeconfig != "":
		return nil, errors.New("--nodes with --kubeconfig: nodes of a Kubernetes cluster are its Node objects; start each with --kubeconfig --node-name")
	case run.underlay != "" || run.clusterCIDR != "" && layout != nil:
		return nil, errors.New("--underlay-addr (and --cluster-cidr once the lab exists) are the lab's to choose with --nodes: leave them out")
	case routing != "" && routing != "tunnel" && routing != "native":
		return nil, fmt.Errorf("--routing %q: use tunnel or native", routing)
	}
	if layout != nil {
		if f.nodes > 1 && f.nodes != len(layout.Nodes) {
			return nil, fmt.Errorf("lab %q has %d nodes; run `shunt --instance %s lab down` first to make it %d", inst.Name, len(layout.Nodes), inst.Name, f.nodes)
		}
		if routing != "" && routing != layout.Routing {
			return nil, fmt.Errorf("lab %q routes between nodes with %s; run `shunt --instance %s lab down` first to change it to %s", inst.Name, layout.Routing, inst.Name, routing)
		}
		if f.nodeGrace > 0 && f.nodeGrace.String() != layout.NodeGrace {
			return nil, fmt.Errorf("lab %q runs with --node-grace %s; run `shunt --instance %s lab down` first to change it", inst.Name, orDefault(layout.NodeGrace), inst.Name)
		}
		return layout, layout.Create() // namespaces lost (a reboot) are made again
	}
	if c.Alive() {
		return nil, fmt.Errorf("lab %q runs as one node; run `shunt --instance %s lab down` first to make it a lab of %d nodes", inst.Name, inst.Name, f.nodes)
	}
	cluster := labnet.DefaultClusterCIDR
	if run.clusterCIDR != "" {
		if cluster, err = netip.ParsePrefix(run.clusterCIDR); err != nil {
			return nil, fmt.Errorf("--cluster-cidr %q: %w", run.clusterCIDR, err)
		}
	}
	if routing == "" {
		routing = "tunnel"
	}
	l, err := labnet.Plan(inst, f.nodes, cluster, routing)
	if err != nil {
		return nil, err
	}
	if f.nodeGrace > 0 {
		l.NodeGrace = f.nodeGrace.String() // the lab keeps it, as its routing
	}
	if err := l.Save(inst); err != nil {
		return nil, err
	}
	if err := l.Create(); err != nil {
		return nil, fmt.Errorf("building the lab's nodes: %w (`shunt lab down` removes what was made)", err)
	}
	return &l, nil
}

// ensureLabNodes starts every node's agent that does not run, the first
// (the control plane) first.
func ensureLabNodes(base instance.Instance, l *labnet.Layout, mode, serviceCIDR string, run runFlags, asked labSettings) error {
	lbPool := run.lbPool // the control plane's alone
	run.routing, run.tunnel, run.underlay, run.clusterCIDR, run.masquerade, run.lbPool = "", "", "", "", false, ""
	deleted, err := deletedLabNodes(base, l)
	if err != nil {
		return err
	}
	for i, n := range l.Nodes {
		ni, err := instance.New(n.Instance)
		if err != nil {
			return err
		}
		if deleted[n.Name] {
			// `shunt delete node` removed its Node while its agent ran: the
			// agent registers the Node when it starts, so it starts again.
			fmt.Fprintf(os.Stderr, "node %s was deleted from lab %q: restarting its agent, which registers it again\n", n.Name, base.Name)
			if err := stopAgent(api.NewClient(ni.Socket()), false); err != nil {
				return fmt.Errorf("node %s (instance %s): stopping its agent: %w", n.Name, n.Instance, err)
			}
		}
		args := append(run.args(), "--node-name", n.Name, "--cluster-cidr", l.ClusterCIDR, "--underlay-addr", n.Addr,
			// Pods reach the external host from their node's address.
			"--masquerade")
		if l.Routing == "native" {
			args = append(args, "--routing", "native")
		} else {
			args = append(args, "--tunnel", "vxlan")
		}
		if i == 0 {
			args = append(args, "--lab-control-plane")
			if lbPool != "" {
				args = append(args, "--lb-pool", lbPool)
			}
			if l.NodeGrace != "" {
				args = append(args, "--node-grace", l.NodeGrace)
			}
		} else {
			args = append(args, "--lab-join", base.Socket())
		}
		if err := ensureAgentIn(labnet.NetnsPath(n.Netns), api.NewClient(ni.Socket()), ni, mode, n.PodCIDR, serviceCIDR, args, asked); err != nil {
			return fmt.Errorf("node %s (instance %s): %w", n.Name, n.Instance, err)
		}
	}
	if lbPool != "" && len(l.Nodes) > 0 {
		// What a router announcing the pool (BGP, or ARP as MetalLB's
		// L2 mode) gives the outside: the way to its addresses, here
		// through node-1.
		if out, err := exec.Command("ip", "-n", l.External.Netns, "route", "replace", lbPool, "via", l.Nodes[0].Addr).CombinedOutput(); err != nil {
			return fmt.Errorf("routing the load balancer pool %s to node-1 on the external host: %v: %s", lbPool, err, out)
		}
	}
	return nil
}

// deletedLabNodes are the lab's nodes whose agent runs but whose Node the
// control plane (the first node's agent) no longer has.
func deletedLabNodes(base instance.Instance, l *labnet.Layout) (map[string]bool, error) {
	cp := api.NewClient(base.Socket())
	if !cp.Alive() {
		return nil, nil // no control plane to ask: its agent starts below, and every node registers with it
	}
	var nodes corev1.NodeList
	if err := cp.Do("GET", "/v1/nodes", nil, &nodes); err != nil {
		return nil, fmt.Errorf("listing lab %q's nodes: %w", base.Name, err)
	}
	deleted := map[string]bool{}
	for _, n := range l.Nodes {
		ni, err := instance.New(n.Instance)
		if err != nil {
			return nil, err
		}
		registered := slices.ContainsFunc(nodes.Items, func(o corev1.Node) bool { return o.Name == n.Name })
		if !registered && api.NewClient(ni.Socket()).Alive() {
			deleted[n.Name] = true
		}
	}
	return deleted, nil
}

func orDefault(s string) string {
	if s == "" {
		return "default (40s)"
	}
	return s
}

// nodeInstances are the instances of the lab's nodes (just inst for a lab
// of one node).
func nodeInstances(inst instance.Instance) ([]instance.Instance, *labnet.Layout, error) {
	l, err := labnet.Load(inst)
	if err != nil || l == nil {
		return []instance.Instance{inst}, nil, err
	}
	var out []instance.Instance
	for _, n := range l.Nodes {
		ni, err := instance.New(n.Instance)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, ni)
	}
	return out, l, nil
}

// podInstance is the instance of the node that runs pod ns/name: the one
// whose pod namespace exists (a lab of one node: inst).
func podInstance(inst instance.Instance, ns, name string) (instance.Instance, error) {
	insts, _, err := nodeInstances(inst)
	if err != nil {
		return inst, err
	}
	for _, ni := range insts {
		for _, netns := range []string{ni.PodNetns(ns, name), ni.LegacyPodNetns(ns, name)} {
			if _, err := os.Stat(labnet.NetnsPath(netns)); err == nil {
				return ni, nil
			}
		}
	}
	return inst, nil
}

// uninstallLab stops every node's agent (joined nodes first) and removes
// what each made, then the lab's namespaces.
func uninstallLab(inst instance.Instance, l *labnet.Layout) error {
	var errs []error
	netns := l.NetnsPaths()
	for _, n := range l.Nodes {
		if ni, err := instance.New(n.Instance); err == nil {
			netns = append(netns, instanceNetns(ni)...)
		}
	}
	stopProcesses := podnet.StopProcesses(netns)
	nodes := slices.Clone(l.Nodes)
	slices.Reverse(nodes)
	for _, n := range nodes {
		ni, err := instance.New(n.Instance)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, stopAgent(api.NewClient(ni.Socket()), true))
	}
	// What else runs in the lab's namespaces (lab exec --external, lab
	// exec or ip netns exec in a pod's, ...), before the namespaces go.
	stopProcesses()
	for _, n := range nodes {
		if ni, err := instance.New(n.Instance); err == nil {
			errs = append(errs, teardown.Instance(ni))
		}
	}
	errs = append(errs, l.Remove())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("lab %q removed (%d nodes)\n", inst.Name, len(l.Nodes))
	return nil
}

// stopAgent asks a running agent to exit (and to tear down, with
// uninstall), and waits until it has: with uninstall as long as the
// agent's own teardown may take (agent.Uninstall gives its pods two
// minutes), so that the caller's sweep does not run beside a kubelet that
// still builds and removes pods, and the caller does not exit (a benchmark
// whose processes die with it) while the agent is half-way through a pod.
// An agent still running after that is said, and the caller sweeps anyway.
func stopAgent(c *api.Client, uninstall bool) error {
	if !c.Alive() {
		return nil
	}
	var st api.Status
	if err := c.Do("GET", "/v1/status", nil, &st); err != nil {
		return err
	}
	if err := c.Do("POST", "/v1/shutdown?uninstall="+strconv.FormatBool(uninstall), nil, nil); err != nil {
		return err
	}
	wait := 20 * time.Second
	if uninstall {
		wait = 2*time.Minute + 10*time.Second
	}
	for deadline := time.Now().Add(wait); procstat.Running(st.PID); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "shunt: the agent (PID %d) is still running %v after it was asked to stop; removing what it created anyway\n", st.PID, wait)
			break
		}
	}
	return nil
}

// externalTarget is the lab's host outside the cluster.
func externalTarget(g *globals) (podexec.Target, error) {
	inst, err := g.inst()
	if err != nil {
		return podexec.Target{}, err
	}
	if err := noLab(inst); err != nil {
		return podexec.Target{}, err
	}
	l, err := labnet.Load(inst)
	if err != nil {
		return podexec.Target{}, err
	}
	if l == nil {
		return podexec.Target{}, fmt.Errorf("lab %q has one node and no external host: `shunt lab up --nodes 2` makes a lab with one", inst.Name)
	}
	return podexec.Target{NetnsPath: labnet.NetnsPath(l.External.Netns)}, nil
}
