package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/instance"
)

// TestEnsureTunnelRefuses: what cannot make an overlay is refused before
// anything is created, with what to do.
func TestEnsureTunnelRefuses(t *testing.T) {
	inst := instance.Instance{Name: "t1"}
	underlay := netip.MustParseAddr("192.168.77.1")
	for _, tc := range []struct {
		name string
		cfg  Config
		mode datapath.Mode
		want string
	}{
		{"unknown kind", Config{Instance: inst, Tunnel: "geneve", Underlay: underlay}, datapath.ModeRedirectPeer, `--tunnel "geneve": use vxlan`},
		{"bridge mode", Config{Instance: inst, Tunnel: TunnelVXLAN, Underlay: underlay}, datapath.ModeBridge, "needs a BPF forwarding mode"},
		{"no underlay", Config{Instance: inst, Tunnel: TunnelVXLAN}, datapath.ModeRedirect, "give --underlay-addr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ensureTunnel(tc.cfg, tc.mode); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
	if ifindex, err := ensureTunnel(Config{Instance: inst}, datapath.ModeBridge); ifindex != 0 || err != nil {
		t.Errorf("no tunnel asked: ifindex %d, %v", ifindex, err)
	}
}

// TestSettleSource: a Kubernetes node restarted without --kubeconfig
// follows the same API server as that node; another server or node name
// is refused; a lab node stays a lab node.
func TestSettleSource(t *testing.T) {
	inst := instance.Instance{Name: "t1"}
	state := &State{}
	first := Config{Instance: inst, Kubernetes: true, Kubeconfig: "/k/config", NodeName: "n1", RunPods: true}
	if err := settleSource(state, &first); err != nil || state.Source == nil || state.Source.NodeName != "n1" {
		t.Fatalf("first start: %v, state %+v", err, state.Source)
	}
	again := Config{Instance: inst}
	if err := settleSource(state, &again); err != nil || !again.Kubernetes || again.Kubeconfig != "/k/config" || again.NodeName != "n1" || !again.RunPods {
		t.Errorf("restart without flags: %v, config %+v", err, again)
	}
	other := Config{Instance: inst, Kubernetes: true, Kubeconfig: "/k/config", NodeName: "n2"}
	if err := settleSource(state, &other); err == nil || !strings.Contains(err.Error(), "lab down") {
		t.Errorf("another node name: %v, want a refusal saying lab down", err)
	}
	lab := Config{Instance: inst}
	if err := settleSource(&State{}, &lab); err != nil || lab.Kubernetes {
		t.Errorf("lab node: %v, kubernetes %v", err, lab.Kubernetes)
	}
}
