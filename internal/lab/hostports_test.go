package lab

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// hostPortPod is a pod of node-1 with one container port taking hostPort
// (extra: more YAML flow entries of the port, each ending in ", ").
func hostPortPod(name string, hostPort int, extra string) string {
	return fmt.Sprintf("---\napiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec:\n  nodeName: node-1\n"+
		"  containers: [{name: c, command: [sleep, infinity], ports: [{%scontainerPort: 8080, hostPort: %d}]}]\n", name, extra, hostPort)
}

// TestHostPortsRefused: a hostPort another pod of the node takes (same
// port and protocol, on the same hostIP or either on every address) is
// refused with file, object and field, as the scheduler keeps such pods
// apart; another protocol, another hostIP or the pod itself applied again
// are not.
func TestHostPortsRefused(t *testing.T) {
	cp, _ := newControlPlane(t)
	// Admitted only (no kubelet runs the pods): each request against the
	// objects the first one made.
	var store *model.Store
	apply := func(doc string) error {
		objs, err := manifest.Decode(docs(doc))
		if err != nil {
			return err
		}
		from := store
		if from == nil {
			from = cp.Store()
		}
		next, _, _, err := cp.admitApply(from, objs)
		if err == nil && store == nil {
			store = next
		}
		return err
	}
	if err := apply(hostPortPod("a", 8000, "") + hostPortPod("lo", 9000, "hostIP: 127.0.0.1, ")); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{
		hostPortPod("a", 8000, ""),                          // itself again
		hostPortPod("udp", 8000, "protocol: UDP, "),         // another protocol
		hostPortPod("other-ip", 9000, "hostIP: 10.0.0.1, "), // another address than 127.0.0.1
	} {
		if err := apply(ok); err != nil {
			t.Errorf("refused: %v", err)
		}
	}
	for _, tc := range []struct{ doc, want string }{
		{hostPortPod("b", 8000, ""), "<stdin>#1: Pod default/b: spec.containers[0].ports[0].hostPort: 8000/TCP is already taken on node node-1 by Pod default/a"},
		{hostPortPod("c", 8000, "hostIP: 127.0.0.1, "), "Pod default/c: spec.containers[0].ports[0].hostPort: 8000/TCP (hostIP 127.0.0.1) is already taken on node node-1 by Pod default/a"},
		{hostPortPod("d", 9000, ""), "Pod default/d: spec.containers[0].ports[0].hostPort: 9000/TCP is already taken on node node-1 by Pod default/lo"},
	} {
		if err := apply(tc.doc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}
