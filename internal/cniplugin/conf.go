// Package cniplugin is shunt's CNI plugin (cmd/shunt-cni), per CNI 1.1:
// ADD plumbs a pod with internal/podnet into the namespace the runtime
// gives it, takes its address from the node's pod CIDR (internal/addrstore)
// and hands the endpoint to the agent, which answers once the datapath is
// programmed; DEL undoes that and is idempotent; CHECK, STATUS, GC and
// VERSION as the specification says. Errors are CNI error objects whose
// message says what failed and what to do.
package cniplugin

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/shuntnet/shunt/internal/instance"
)

// Versions are the CNI specification versions the plugin speaks.
var Versions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// DefaultDataDir holds address reservations, one directory per network, as
// host-local's default does.
const DefaultDataDir = "/var/lib/cni/networks"

// ErrPluginNotAvailable is the CNI 1.1 STATUS code for "cannot serve ADD".
const ErrPluginNotAvailable uint = 50

// NetConf is the network configuration:
//
//	{"cniVersion": "1.1.0", "name": "shunt", "type": "shunt-cni",
//	 "agentSocket": "/run/shunt/shunt/shuntd.sock",
//	 "podCIDR": "10.244.0.0/24", "mtu": 1450, "dataDir": "/var/lib/cni/networks",
//	 "capabilities": {"cgroupPath": true}}
//
// Only name, cniVersion and type are required: the agent socket defaults to
// the instance SHUNT_INSTANCE names (default "shunt"), the pod CIDR and MTU to what the agent says of
// its node (spec.podCIDR).
type NetConf struct {
	types.PluginConf
	AgentSocket string `json:"agentSocket,omitempty"`
	PodCIDR     string `json:"podCIDR,omitempty"`
	MTU         int    `json:"mtu,omitempty"`
	DataDir     string `json:"dataDir,omitempty"`
	// RuntimeConfig carries the runtime's capability arguments: the pod's
	// cgroup (capability "cgroupPath"), which socket hooks use to know the
	// pod's processes.
	RuntimeConfig struct {
		CgroupPath string `json:"cgroupPath,omitempty"`
	} `json:"runtimeConfig,omitempty"`

	podCIDR netip.Prefix
}

func parseConf(stdin []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot decode the network configuration: "+err.Error(),
			"stdin must be a JSON network configuration such as "+`{"cniVersion":"1.1.0","name":"shunt","type":"shunt-cni"}`)
	}
	if conf.AgentSocket == "" {
		// The runtime's SHUNT_INSTANCE names the node's agent where one
		// machine holds several (lab nodes), as for shunt and shuntd.
		name := os.Getenv("SHUNT_INSTANCE")
		if name == "" {
			name = instance.Default
		}
		conf.AgentSocket = instance.Instance{Name: name}.Socket()
	}
	if conf.DataDir == "" {
		conf.DataDir = DefaultDataDir
	}
	if conf.PodCIDR != "" {
		p, err := netip.ParsePrefix(conf.PodCIDR)
		if err != nil || !p.Addr().Is4() || p.Bits() > 29 {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("podCIDR %q is not an IPv4 CIDR of /29 or larger", conf.PodCIDR),
				"set podCIDR to the node's spec.podCIDR (e.g. 10.244.0.0/24) or leave it out to take the agent's")
		}
		conf.podCIDR = p.Masked()
	}
	if conf.MTU != 0 && (conf.MTU < 576 || conf.MTU > 65535) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("mtu %d is out of range", conf.MTU),
			"use an MTU between 576 and 65535, or leave it out for the node's")
	}
	return conf, nil
}

// podRef is the pod an attachment belongs to, from CNI_ARGS as kubelet
// and containerd pass it.
type podRef struct{ Namespace, Name string }

func (p podRef) String() string { return p.Namespace + "/" + p.Name }

func parsePodArgs(args string) (podRef, error) {
	var p podRef
	for _, kv := range strings.Split(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			p.Namespace = v
		case "K8S_POD_NAME":
			p.Name = v
		}
	}
	if p.Namespace == "" || p.Name == "" || strings.Contains(p.Namespace+p.Name, "/") {
		return p, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_ARGS %q does not name the pod", args),
			"the runtime must pass K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS, as kubelet does")
	}
	return p, nil
}
