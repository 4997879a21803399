// Command shunt-cni is shunt's CNI plugin: a container runtime (or the
// lab's kubelet, through libcni) runs it to plumb a pod into shunt's
// datapath. See internal/cniplugin.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/shuntnet/shunt/internal/cniplugin"
)

func main() {
	skel.PluginMainFuncs(cniplugin.Funcs(), cniplugin.VersionInfo(),
		"shunt-cni: plumbs pods into the shunt eBPF dataplane (https://github.com/shuntnet/shunt)")
}
