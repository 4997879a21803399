package agent

import (
	"net/netip"
	"strings"
	"testing"
	"time"

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
// follows the same API server as that node, with the same Lease duration
// (a new one given replaces it); another server or node name is refused; a
// lab node stays a lab node.
func TestSettleSource(t *testing.T) {
	inst := instance.Instance{Name: "t1"}
	state := &State{}
	first := Config{Instance: inst, Kubernetes: true, Kubeconfig: "/k/config", NodeName: "n1", RunPods: true, NodeLeaseDuration: 8 * time.Second}
	if err := settleSource(state, &first); err != nil || state.Source == nil || state.Source.NodeName != "n1" || state.Source.NodeLeaseSeconds != 8 {
		t.Fatalf("first start: %v, state %+v", err, state.Source)
	}
	again := Config{Instance: inst}
	if err := settleSource(state, &again); err != nil || !again.Kubernetes || again.Kubeconfig != "/k/config" || again.NodeName != "n1" || !again.RunPods ||
		again.NodeLeaseDuration != 8*time.Second {
		t.Errorf("restart without flags: %v, config %+v", err, again)
	}
	longer := Config{Instance: inst, Kubernetes: true, Kubeconfig: "/k/config", NodeLeaseDuration: 40 * time.Second}
	if err := settleSource(state, &longer); err != nil || state.Source.NodeLeaseSeconds != 40 {
		t.Errorf("restart with another lease duration: %v, state %+v", err, state.Source)
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

// TestSettleRouting: --tunnel vxlan alone is the overlay, as before
// --routing; --routing tunnel takes vxlan; native routing has no tunnel; a
// node keeps its routing across restarts (a state file from before
// --routing included) and refuses another without lab down.
func TestSettleRouting(t *testing.T) {
	inst := instance.Instance{Name: "t1"}
	for _, tc := range []struct {
		name            string
		state           State
		flags           Config
		routing, tunnel string
		want            string // an error saying this, or "" for none
	}{
		{"none", State{}, Config{}, "", "", ""},
		{"--tunnel vxlan", State{}, Config{Tunnel: TunnelVXLAN}, RoutingTunnel, TunnelVXLAN, ""},
		{"--routing tunnel", State{}, Config{Routing: RoutingTunnel}, RoutingTunnel, TunnelVXLAN, ""},
		{"--routing native", State{}, Config{Routing: RoutingNative}, RoutingNative, "", ""},
		{"native with a tunnel", State{}, Config{Routing: RoutingNative, Tunnel: TunnelVXLAN}, "", "", "native routing has no tunnel"},
		{"unknown", State{}, Config{Routing: "bgp"}, "", "", `--routing "bgp": use tunnel`},
		{"restart of a native node", State{Routing: RoutingNative}, Config{}, RoutingNative, "", ""},
		{"restart of an overlay node of an older version", State{Tunnel: TunnelVXLAN}, Config{}, RoutingTunnel, TunnelVXLAN, ""},
		{"native asked of an overlay node", State{Tunnel: TunnelVXLAN}, Config{Routing: RoutingNative}, "", "", "already runs with routing tunnel"},
		{"the overlay asked of a native node", State{Routing: RoutingNative}, Config{Tunnel: TunnelVXLAN}, "", "", "already runs with routing native"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, cfg := tc.state, tc.flags
			cfg.Instance = inst
			err := settleRouting(&state, &cfg)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("got %v, want an error saying %q", err, tc.want)
				}
				return
			}
			if err != nil || cfg.Routing != tc.routing || cfg.Tunnel != tc.tunnel || state.Routing != tc.routing || state.Tunnel != tc.tunnel {
				t.Errorf("got %v, routing %q tunnel %q (state %q %q); want routing %q tunnel %q", err, cfg.Routing, cfg.Tunnel,
					state.Routing, state.Tunnel, tc.routing, tc.tunnel)
			}
		})
	}
	if _, err := nativeUnderlay(Config{Instance: inst, Routing: RoutingNative, Underlay: netip.MustParseAddr("192.168.77.1")}, datapath.ModeBridge); err == nil ||
		!strings.Contains(err.Error(), "needs a BPF forwarding mode") {
		t.Errorf("native routing in bridge mode: %v, want a refusal", err)
	}
}
