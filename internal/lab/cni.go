package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/shuntnet/shunt/internal/podnet"
)

// The lab's container runtime side of pod networking: it creates the
// pod's network namespace and cgroup, then calls shunt-cni through libcni
// exactly as containerd does for kubelet (ADD, CHECK, DEL with the pod in
// CNI_ARGS and its cgroup as a capability argument). The plugin plumbs the
// pod and hands its endpoint to the agent, which answers once the datapath
// is programmed.

// cniNetwork is the network name, as in /etc/cni/net.d.
const cniNetwork = "shunt"

// cniRuntime runs shunt-cni for one lab node.
type cniRuntime struct {
	cni  *libcni.CNIConfig
	conf *libcni.NetworkConfigList
	// confDir (Config.CNIConfDir): the network configuration is the first
	// of this directory, read at each call, as a runtime reads it once a
	// CNI installs it; conf is nil then.
	confDir string
}

// ErrNoCNIConfig says the node's CNI configuration directory has none yet.
var ErrNoCNIConfig = errors.New("no CNI network configuration installed yet (cni plugin not initialized)")

// network is the configuration list pods are plumbed with.
func (c *cniRuntime) network() (*libcni.NetworkConfigList, error) {
	if c.confDir == "" {
		return c.conf, nil
	}
	files, err := libcni.ConfFiles(c.confDir, []string{".conflist"})
	if err != nil {
		return nil, fmt.Errorf("CNI configuration directory %s: %w", c.confDir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: %w", c.confDir, ErrNoCNIConfig)
	}
	slices.Sort(files)
	return libcni.ConfListFromFile(files[0])
}

// newCNIRuntime configures libcni for the instance: the plugin from binDir,
// the agent's socket, address reservations and libcni's result cache in
// the instance's state directory (so `lab down` sweeps them).
func newCNIRuntime(cfg Config) (*cniRuntime, error) {
	state := cfg.Instance.StateDir()
	if cfg.CNIConfDir != "" {
		// The node's own configuration and plugins, installed by the
		// CNI's DaemonSet.
		return &cniRuntime{
			cni:     libcni.NewCNIConfigWithCacheDir([]string{cfg.CNIBinDir}, filepath.Join(state, "cni", "cache"), nil),
			confDir: cfg.CNIConfDir,
		}, nil
	}
	raw := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"shunt-cni","agentSocket":%q,"dataDir":%q,"capabilities":{"cgroupPath":true}}]}`,
		cniNetwork, cfg.Instance.Socket(), filepath.Join(state, "cni", "networks"))
	conf, err := libcni.ConfListFromBytes([]byte(raw))
	if err != nil {
		return nil, fmt.Errorf("the lab's CNI configuration: %w", err)
	}
	return &cniRuntime{
		cni:  libcni.NewCNIConfigWithCacheDir([]string{cfg.BinDir}, filepath.Join(state, "cni", "cache"), nil),
		conf: conf,
	}, nil
}

func newContainerID() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *cniRuntime) runtimeConf(rec *PodRecord) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: rec.ContainerID, NetNS: podnet.NetnsPath(rec.Netns), IfName: podnet.PodIfName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", rec.Namespace}, {"K8S_POD_NAME", rec.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", rec.ContainerID},
		},
		CapabilityArgs: map[string]any{"cgroupPath": rec.Cgroup},
	}
}

// add runs ADD for the pod's sandbox and records its address and veth.
func (c *cniRuntime) add(ctx context.Context, rec *PodRecord) error {
	conf, err := c.network()
	if err != nil {
		return err
	}
	r, err := c.cni.AddNetworkList(ctx, conf, c.runtimeConf(rec))
	if err != nil {
		return fmt.Errorf("shunt-cni ADD: %w", err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return fmt.Errorf("shunt-cni ADD result: %w", err)
	}
	if len(res.IPs) == 0 || len(res.Interfaces) == 0 {
		return fmt.Errorf("shunt-cni ADD returned no address or interface: %+v", res)
	}
	ip, ok := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	if !ok {
		return fmt.Errorf("shunt-cni ADD returned %s, not an IPv4 address", res.IPs[0].Address.IP)
	}
	rec.IP, rec.HostIf = ip.String(), res.Interfaces[0].Name
	return nil
}

// check runs CHECK: plumbing, address and the agent's endpoint in place.
func (c *cniRuntime) check(ctx context.Context, rec *PodRecord) error {
	conf, err := c.network()
	if err != nil {
		return err
	}
	return c.cni.CheckNetworkList(ctx, conf, c.runtimeConf(rec))
}

// del runs DEL (idempotent; a no-op for a pod that never had a sandbox).
func (c *cniRuntime) del(ctx context.Context, rec *PodRecord) error {
	if rec.ContainerID == "" {
		return nil
	}
	conf, err := c.network()
	if errors.Is(err, ErrNoCNIConfig) {
		// The CNI is gone (uninstalled): nothing of it to undo.
		return nil
	}
	if err != nil {
		return err
	}
	if err := c.cni.DelNetworkList(ctx, conf, c.runtimeConf(rec)); err != nil {
		return fmt.Errorf("pod %s: shunt-cni DEL: %w", rec.key(), err)
	}
	return nil
}
