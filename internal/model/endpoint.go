package model

import (
	"net"
	"net/netip"
	"strings"
)

// Endpoint is what the node knows of a pod that runs on it beyond the Pod
// object: where its network is. The CNI plugin (in the lab, the lab's
// kubelet) reports it when the pod's interface is up, as a CNI ADD result
// reaches the agent; the reconciler programs the datapath from it and from
// the objects. Pods of other nodes have no Endpoint: their object
// (status.podIP, spec.nodeName) is all a node needs.
type Endpoint struct {
	Pod     string     // namespace/name
	IP      netip.Addr // the pod's address (status.podIP)
	Ifname  string     // host side of the pod's veth
	Ifindex int
	PodMAC  net.HardwareAddr // MAC of the pod's eth0
	NodeMAC net.HardwareAddr // MAC of the host side: the pod's gateway
	// CgroupID identifies the pod's cgroup (its inode), which socket hooks
	// report for the calling process.
	CgroupID uint64
	// Cgroup is that cgroup's path: socket programs a pod asks for (its own
	// proxy's SO_ORIGINAL_DST) attach there.
	Cgroup string
	// Netns is the pod's network namespace (bind mount path, as CNI's
	// CNI_NETNS): where its sockets live when some must be closed.
	Netns string
}

// SplitName splits a "namespace/name" key, as Endpoint.Pod holds.
func SplitName(key string) (namespace, name string) {
	namespace, name, _ = strings.Cut(key, "/")
	return namespace, name
}
