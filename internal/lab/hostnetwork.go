package lab

import "github.com/shuntnet/shunt/internal/cgroup"

// hostNetwork pods, as a kubelet runs them: in the node's network
// namespace (no namespace, veth or address of their own, so no CNI call),
// their address the node's. The datapath sees them as the node: the
// reconciler gives them no identity of their own.

// plumbHostNetwork gives a hostNetwork pod the node's address; its cgroup
// exists already.
func (k *kubelet) plumbHostNetwork(rec *PodRecord) error {
	rec.IP, rec.HostIf, rec.ContainerID = k.cfg.NodeIP.String(), "", ""
	return nil
}

// unplumbHostNetwork stops a hostNetwork pod's processes (its cgroup).
func (k *kubelet) unplumbHostNetwork(rec *PodRecord) error {
	err := cgroup.Remove(rec.Cgroup)
	rec.IP = ""
	return err
}
