package lab

import (
	"cmp"
	"fmt"
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/services"
)

// hostPortUse is one hostPort of a pod on its node: the address (invalid:
// every address of the node, hostIP unset or 0.0.0.0), port and protocol.
type hostPortUse struct {
	node  string
	addr  netip.Addr
	port  int32
	proto corev1.Protocol
}

// clashes says whether two uses take the same port of the node: the same
// protocol and port, and the same address or either on every address.
func (u hostPortUse) clashes(o hostPortUse) bool {
	return u.node == o.node && u.port == o.port && u.proto == o.proto && (!u.addr.IsValid() || !o.addr.IsValid() || u.addr == o.addr)
}

// hostPortField is where a use is written in its pod, for errors.
type hostPortField struct {
	use   hostPortUse
	field string
}

func hostPortsOf(p *corev1.Pod) []hostPortField {
	var out []hostPortField
	for i, c := range p.Spec.Containers {
		for j, cp := range c.Ports {
			if cp.HostPort == 0 {
				continue
			}
			u := hostPortUse{node: p.Spec.NodeName, addr: services.HostIPOf(cp), port: cp.HostPort, proto: cmp.Or(cp.Protocol, corev1.ProtocolTCP)}
			out = append(out, hostPortField{u, fmt.Sprintf("spec.containers[%d].ports[%d].hostPort", i, j)})
		}
	}
	return out
}

// checkHostPorts refuses a pod that changes create or update whose
// hostPort another pod of its node already takes (same port and
// protocol, on the same hostIP or either on all of them), as the
// scheduler keeps such pods apart; or that takes one twice itself.
// Returns the problems, one per line, with file, object and field.
func checkHostPorts(next *model.Store, changes []model.Change) []string {
	var problems []string
	var all []*corev1.Pod
	for _, ch := range changes {
		if ch.Key.Kind != manifest.KindPod || (ch.Action != model.Created && ch.Action != model.Configured) {
			continue
		}
		o, ok := next.Get(ch.Key)
		if !ok {
			continue
		}
		pod := o.Obj.(*corev1.Pod)
		mine := hostPortsOf(pod)
		if len(mine) == 0 || pod.Spec.NodeName == "" {
			continue
		}
		if all == nil {
			all = next.Pods()
		}
		label := fmt.Sprintf("%s: Pod %s/%s: ", o.Source, pod.Namespace, pod.Name)
		for i, m := range mine {
			for _, earlier := range mine[:i] {
				if m.use.clashes(earlier.use) {
					problems = append(problems, fmt.Sprintf("%s%s: %d/%s is also %s", label, m.field, m.use.port, m.use.proto, earlier.field))
				}
			}
			for _, other := range all {
				if other.Namespace == pod.Namespace && other.Name == pod.Name {
					continue
				}
				for _, theirs := range hostPortsOf(other) {
					if m.use.clashes(theirs.use) {
						problems = append(problems, fmt.Sprintf("%s%s: %d/%s%s is already taken on node %s by Pod %s/%s", label, m.field,
							m.use.port, m.use.proto, hostIPText(m.use.addr), pod.Spec.NodeName, other.Namespace, other.Name))
					}
				}
			}
		}
	}
	sort.Strings(problems)
	return problems
}

func hostIPText(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return " (hostIP " + a.String() + ")"
}
