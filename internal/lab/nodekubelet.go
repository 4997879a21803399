package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/kubeclient"
	"github.com/shuntnet/shunt/internal/teardown"
)

// A lab node whose agent comes from a DaemonSet (`shuntd kubelet`, as
// `helm install` of deploy/helm/shunt puts it there): the lab's kubelet
// alone, with no shuntd of the lab's. It registers its Node, runs the
// pods bound to it — the agent's from its image (rootfs.go) — and plumbs
// the others with the CNI configuration and plugin the agent's init
// container installs in the node's own directories; until there is one,
// the Node is not Ready (NetworkReady=false), as with kubelet, and only
// pods of the host's network run.
//
// Nodes of the lab share one machine: the paths every node has
// (/etc/cni/net.d, /opt/cni/bin) are each node's directories below
// NodeDir (Config.HostPaths); the agent's own (/run/shunt, /sys/fs/bpf,
// /var/lib/shunt) are per instance already, the agent's instance named
// after the node (the chart's extraEnv SHUNT_INSTANCE from spec.nodeName).

// NodeKubeletConfig is one such node.
type NodeKubeletConfig struct {
	Kubeconfig string
	NodeName   string
	// Instance is the kubelet's own (its pods' cgroups, namespaces and
	// records); the agent's instance is another (AgentInstance).
	Instance instance.Instance
	// AgentInstance is the instance the node's agent runs as: shunt-cni
	// finds its socket by it (SHUNT_INSTANCE in the plugin's environment).
	AgentInstance string
	NodeAddr      netip.Addr // the Node's InternalIP; the kubelet API listens there
	Layouts       []string   // OCI image layouts the node's images come from
	NodeDir       string     // the node's own /etc/cni/net.d and /opt/cni/bin are below it
	ShimExe       string
	LeaseDuration time.Duration
	Log           *slog.Logger
}

// NodeCNIDirs are the node's CNI configuration and plugin directories.
func (c NodeKubeletConfig) NodeCNIDirs() (conf, bin string) {
	return filepath.Join(c.NodeDir, "etc/cni/net.d"), filepath.Join(c.NodeDir, "opt/cni/bin")
}

// RunNodeKubelet registers the node and runs its pods until ctx ends.
func RunNodeKubelet(ctx context.Context, c NodeKubeletConfig) error {
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", c.Kubeconfig, err)
	}
	api, err := kubeclient.New(rc)
	if err != nil {
		return err
	}
	node, err := registerNode(ctx, api, c)
	if err != nil {
		return err
	}
	pool, err := ipam.NewPool(node.Spec.PodCIDR)
	if err != nil {
		return fmt.Errorf("node %s: pod CIDR %q: %w", c.NodeName, node.Spec.PodCIDR, err)
	}
	root, err := cgroup.Root()
	if err != nil {
		return err
	}
	for _, d := range []string{c.Instance.StateDir(), c.Instance.CgroupDir(root)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if c.AgentInstance != "" {
		// libcni hands the plugins this process's environment.
		os.Setenv("SHUNT_INSTANCE", c.AgentInstance)
	}
	confDir, binDir := c.NodeCNIDirs()
	cfg := Config{
		Instance: c.Instance, NodeName: c.NodeName, NodeIP: c.NodeAddr, PodPool: pool,
		CgroupRoot: root, ShimExe: c.ShimExe, Images: Images{Layouts: c.Layouts}, Log: c.Log,
		NodeLeaseDuration: c.LeaseDuration,
		HostPaths:         map[string]string{"/etc/cni/net.d": confDir, "/opt/cni/bin": binDir},
		CNIConfDir:        confDir, CNIBinDir: binDir,
	}
	noWait := func(context.Context, []*corev1.Pod) error { return nil } // no lab agent to wait for
	kl, err := NewAPIKubelet(cfg, api, false, noWait)
	if err != nil {
		return err
	}
	ca := rc.TLSClientConfig.CAData
	if len(ca) == 0 && rc.TLSClientConfig.CAFile != "" {
		ca, _ = os.ReadFile(rc.TLSClientConfig.CAFile)
	}
	if _, err := kl.ServeKubeletAPI(ctx, c.NodeAddr, KubeletPort, ca); err != nil {
		c.Log.Warn("the node's kubelet API is not served: kubectl exec, logs and port-forward fail on its pods", "err", err)
	}
	if err := kl.Run(ctx); err != nil {
		return err
	}
	c.Log.Info("node kubelet running", "node", c.NodeName, "podCIDR", pool.CIDR, "cniConf", confDir)
	<-ctx.Done()
	return nil
}

// RemoveNodeKubelet removes what the node's kubelet made: its pods'
// sandboxes and processes, its records and cgroups, the node's CNI
// directories (a node given back).
func RemoveNodeKubelet(c NodeKubeletConfig) error {
	return errors.Join(teardown.Instance(c.Instance), os.RemoveAll(c.NodeDir))
}

// registerNode creates the Node as kubelet registers it (labels, address,
// capacity, system information) and waits for its pod CIDR (the node IPAM
// controller's).
func registerNode(ctx context.Context, api *kubeclient.Client, c NodeKubeletConfig) (*corev1.Node, error) {
	nodes := api.Nodes()
	_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.NodeName, Labels: map[string]string{
		"kubernetes.io/hostname": c.NodeName, "kubernetes.io/os": "linux", "kubernetes.io/arch": runtime.GOARCH,
	}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("registering Node %s: %w", c.NodeName, err)
	}
	machine, _ := machineStatus()
	deadline := time.Now().Add(time.Minute)
	for {
		node, err := nodes.Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if len(node.Status.Addresses) == 0 {
			node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: c.NodeAddr.String()}}
			node.Status.Capacity, node.Status.Allocatable, node.Status.NodeInfo = machine.Capacity, machine.Allocatable, machine.NodeInfo
			if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
				return nil, fmt.Errorf("writing the status of Node %s: %w", c.NodeName, err)
			}
			continue
		}
		if node.Spec.PodCIDR != "" {
			return node, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("node %s has no spec.podCIDR after a minute: the control plane's node IPAM controller gives one (kube-controller-manager --allocate-node-cidrs)", c.NodeName)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
