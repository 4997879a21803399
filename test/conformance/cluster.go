package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/shuntnet/shunt/deploy"
	"github.com/shuntnet/shunt/internal/kubecluster"
)

// env is a cluster the suites run against: `shunt dev cluster`'s control
// plane (etcd, kube-apiserver, kube-controller-manager with the workload
// controllers, kube-scheduler) on loopback, and lab nodes, each an agent
// playing the node's kubelet (shuntd --run-pods --no-schedule) in a
// network namespace of its own, joined by an underlay bridge, reaching the
// other's pods through a VXLAN overlay. No kube-proxy: Services are
// shunt's.
type env struct {
	logf     func(string, ...any)
	shuntBin string // bin/ of this repository: shunt, shuntd, shunt-cni
	cluster  *kubecluster.Cluster
	client   *kubernetes.Clientset
	id       string
	subnet   string // the underlay's /24, "a.b.c."
	underlay string // its namespace
	hostIf   string // the machine's own leg on the underlay
	nodes    []labNode
	dns      netip.Addr // Service kube-dns
	relays   []io.Closer
	// undo runs in reverse at down.
	undo []func() error
}

type labNode struct {
	instance string // also the Node's name
	netns    string
	addr     string
}

// up builds the cluster in dir with n lab nodes. On error what was built
// is torn down.
func up(ctx context.Context, dir, shuntBin, kubeBin string, n int, logf func(string, ...any)) (_ *env, err error) {
	e := &env{logf: logf, shuntBin: shuntBin, id: fmt.Sprintf("%04d", rand.IntN(10000))}
	defer func() {
		if err != nil {
			e.down()
		}
	}()
	logf("control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) in %s", dir)
	e.cluster, err = kubecluster.Up(ctx, kubecluster.Options{
		Dir: dir, BinDir: kubeBin, NodeLifecycle: true, Scheduler: true, WorkloadControllers: true, Logf: logf,
		ServiceCIDR: serviceCIDR, ClusterCIDR: fmt.Sprintf("10.%d.0.0/16", 150+rand.IntN(48)),
	})
	if err != nil {
		return nil, err
	}
	e.undo = append(e.undo, e.cluster.Stop)
	// shunt's CRDs, as `shunt dev cluster up` installs them: the agents
	// need ShuntIdentities.
	if err := e.cluster.Apply(ctx, bytes.NewReader(deploy.CRDs()), "-"); err != nil {
		return nil, fmt.Errorf("installing shunt's CRDs: %w", err)
	}
	if e.client, err = e.cluster.Clientset(); err != nil {
		return nil, err
	}
	// The cluster DNS, as `shunt dev cluster up --dns` runs it: CoreDNS on
	// a node's network, Service kube-dns, the nodes' kubelets pointing
	// pods at it.
	if e.dns, err = e.cluster.DeployDNS(ctx, true); err != nil {
		return nil, err
	}
	logf("cluster DNS: Service kube-system/kube-dns at %s (CoreDNS, %s)", e.dns, kubecluster.DNSImage)
	if err := e.buildUnderlay(n); err != nil {
		return nil, err
	}
	for i := range e.nodes {
		if err := e.startNode(ctx, &e.nodes[i]); err != nil {
			return nil, err
		}
	}
	if err := e.waitNodesReady(ctx); err != nil {
		return nil, err
	}
	return e, e.routePods(ctx)
}

// The cluster's ranges: not the lab's defaults (10.244.0.0/16,
// 10.96.0.0/16), which a one-node lab on this machine may be using, since
// this machine routes the pod CIDRs to the nodes (routePods); the pods'
// is 10.X.0.0/16 with X drawn from 150-197, so that two runs at once
// (make test on two worktrees) rarely route the same one.
const serviceCIDR = "10.198.0.0/16"

// routePods routes each node's pod CIDR from this machine to the node over
// the underlay, as a control-plane host of a cluster reaches pods: the API
// server's pods/proxy and services/proxy connect to pod addresses.
func (e *env) routePods(ctx context.Context) error {
	for _, nd := range e.nodes {
		node, err := e.client.CoreV1().Nodes().Get(ctx, nd.instance, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if node.Spec.PodCIDR == "" {
			return fmt.Errorf("node %s has no pod CIDR (the node IPAM controller gives one)", nd.instance)
		}
		// The routes go with the underlay leg at teardown.
		if err := run("ip", "route", "add", node.Spec.PodCIDR, "via", nd.addr, "dev", e.hostIf); err != nil {
			return err
		}
	}
	return nil
}

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// buildUnderlay makes a bridge in a namespace of its own, one namespace
// per node joined to it at .1, .2, ... of a random 172.31.X.0/24, and a
// leg of this machine at .254 (e2e.test reaches the nodes' addresses, as
// it reaches a cluster's nodes).
func (e *env) buildUnderlay(n int) error {
	e.subnet = fmt.Sprintf("172.31.%d.", 100+rand.IntN(150))
	e.underlay = "cfu" + e.id
	if err := run("ip", "netns", "add", e.underlay); err != nil {
		return err
	}
	e.undo = append(e.undo, func() error { return run("ip", "netns", "del", e.underlay) })
	steps := [][]string{
		{"-n", e.underlay, "link", "add", "br0", "type", "bridge"},
		{"-n", e.underlay, "link", "set", "br0", "up"},
	}
	e.hostIf = "cfh" + e.id
	steps = append(steps,
		[]string{"link", "add", e.hostIf, "type", "veth", "peer", "name", "host", "netns", e.underlay},
		[]string{"-n", e.underlay, "link", "set", "host", "master", "br0", "up"},
		[]string{"addr", "add", e.subnet + "254/24", "dev", e.hostIf},
		[]string{"link", "set", e.hostIf, "up"},
	)
	for i := range n {
		nd := labNode{instance: fmt.Sprintf("cf%s%d", e.id, i+1), netns: fmt.Sprintf("cfn%d%s", i+1, e.id), addr: e.subnet + strconv.Itoa(i+1)}
		e.nodes = append(e.nodes, nd)
		leg := fmt.Sprintf("n%d", i+1)
		steps = append(steps,
			[]string{"netns", "add", nd.netns},
			[]string{"-n", nd.netns, "link", "set", "lo", "up"},
			[]string{"-n", nd.netns, "link", "add", "ul0", "type", "veth", "peer", "name", leg, "netns", e.underlay},
			[]string{"-n", nd.netns, "addr", "add", nd.addr + "/24", "dev", "ul0"},
			[]string{"-n", nd.netns, "link", "set", "ul0", "up"},
			[]string{"-n", e.underlay, "link", "set", leg, "master", "br0", "up"},
		)
	}
	e.undo = append(e.undo, func() error {
		var errs []error
		for _, nd := range e.nodes {
			if _, err := os.Stat("/run/netns/" + nd.netns); err == nil {
				errs = append(errs, run("ip", "netns", "del", nd.netns))
			}
		}
		if exec.Command("ip", "link", "show", e.hostIf).Run() == nil {
			errs = append(errs, run("ip", "link", "del", e.hostIf))
		}
		return errors.Join(errs...)
	})
	for _, s := range steps {
		if err := run("ip", s...); err != nil {
			return err
		}
	}
	return nil
}

// shunt runs bin/shunt for the node, in its namespace (nsenter, not `ip
// netns exec`, which remounts /sys and hides bpffs and the cgroup tree).
func (e *env) shunt(nd labNode, args ...string) error {
	argv := append([]string{"--net=/run/netns/" + nd.netns, filepath.Join(e.shuntBin, "shunt"), "--instance", nd.instance}, args...)
	return run("nsenter", argv...)
}

// startNode registers the Node with its address and starts its agent,
// whose kubelet writes the rest of its status (capacity, allocatable,
// system information) with its Ready condition.
func (e *env) startNode(ctx context.Context, nd *labNode) error {
	nodes := e.client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.instance, Labels: map[string]string{
		"kubernetes.io/hostname": nd.instance, "kubernetes.io/os": "linux", "kubernetes.io/arch": runtime.GOARCH,
	}}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Node %s: %w", nd.instance, err)
	}
	e.undo = append(e.undo, func() error {
		return nodes.Delete(context.Background(), nd.instance, metav1.DeleteOptions{})
	})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, nd.instance, metav1.GetOptions{})
		if err != nil {
			return err
		}
		// No Hostname address: the API server, which tries that type
		// first, could not resolve it; it reaches the node (its kubelet
		// port) at the InternalIP, through this machine's underlay leg.
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nd.addr}}
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("writing the status of Node %s: %w", nd.instance, err)
	}
	relay, err := e.cluster.RelayInto("/run/netns/" + nd.netns)
	if err != nil {
		return err
	}
	e.relays = append(e.relays, relay)
	e.undo = append(e.undo, func() error { return e.shunt(*nd, "lab", "down") })
	e.logf("lab node %s at %s (namespace %s)", nd.instance, nd.addr, nd.netns)
	return e.shunt(*nd, "lab", "up", "--kubeconfig", e.cluster.Kubeconfig, "--node-name", nd.instance,
		"--service-cidr", e.cluster.ServiceCIDR, "--cluster-cidr", e.cluster.ClusterCIDR, "--mode", "redirect-peer",
		"--tunnel", "vxlan", "--masquerade", "--no-schedule", "--cluster-dns", e.dns.String())
}

// waitNodesReady waits until every Node is Ready and has no taint left
// (the node-lifecycle controller's not-ready taint goes once it is Ready).
func (e *env) waitNodesReady(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := e.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var notReady []string
		for _, n := range list.Items {
			ready := false
			for _, c := range n.Status.Conditions {
				ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
			}
			if !ready || len(n.Spec.Taints) > 0 {
				notReady = append(notReady, fmt.Sprintf("%s (ready %v, taints %v)", n.Name, ready, n.Spec.Taints))
			}
		}
		if len(notReady) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodes not ready after 2 minutes: %s", strings.Join(notReady, ", "))
		}
		time.Sleep(time.Second)
	}
}

// down tears everything down, last built first, and says what it could not
// remove.
func (e *env) down() error {
	var errs []error
	for i := len(e.undo) - 1; i >= 0; i-- {
		if err := e.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	// The relays served the agents until they were down.
	for _, r := range e.relays {
		r.Close()
	}
	e.undo, e.relays = nil, nil
	return errors.Join(errs...)
}
