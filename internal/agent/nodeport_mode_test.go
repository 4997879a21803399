package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
)

// DSR and hybrid need routing between nodes: native or the overlay are
// taken (DSR's IPIP goes over the underlay either way), no routing is
// refused before anything of the node is made; snat goes with either.
func TestNodePortModeNeedsRouting(t *testing.T) {
	for _, mode := range []dpinfo.NodePortMode{dpinfo.NodePortDSR, dpinfo.NodePortHybrid} {
		_, err := nodePortOf(Config{NodePortMode: mode}, datapath.ModeRedirectPeer, netip.Addr{})
		if err == nil || !strings.Contains(err.Error(), "needs routing between nodes") {
			t.Errorf("mode %s, no routing: %v; want refused, naming the routing it needs", mode, err)
		}
		for _, routing := range []string{RoutingTunnel, RoutingNative} {
			// No underlay address: no NodePort, and no refusal.
			if np, err := nodePortOf(Config{NodePortMode: mode, Routing: routing}, datapath.ModeRedirectPeer, netip.Addr{}); err != nil || np != nil {
				t.Errorf("mode %s, routing %s: %v, %v; want taken (no NodePort without an underlay)", mode, routing, np, err)
			}
		}
	}
	if np, err := nodePortOf(Config{NodePortMode: dpinfo.NodePortSNAT, Routing: RoutingTunnel}, datapath.ModeRedirectPeer, netip.Addr{}); err != nil || np != nil {
		t.Errorf("snat with the overlay and no underlay: %v, %v; want no NodePort and no error", np, err)
	}
}

// A Service that asks for DSR on a node whose routing cannot carry it is
// SNATed there and named: dsrUnavailable says why, on the nodes that
// serve outside frontends (an underlay address, kube-proxy not doing it).
func TestDSRUnavailable(t *testing.T) {
	underlay := netip.MustParseAddr("192.0.2.1")
	for _, c := range []struct {
		cfg  Config
		want string // a substring; "": DSR possible, or nothing to say
	}{
		{Config{Routing: RoutingNative, Underlay: underlay}, ""},
		{Config{Routing: RoutingTunnel, Underlay: underlay}, ""},
		{Config{Underlay: underlay}, "no routing between nodes: DSR needs --routing native or --tunnel vxlan"},
		{Config{Routing: RoutingTunnel}, ""},
		{Config{Routing: RoutingTunnel, Underlay: underlay, LeaveExternalToKubeProxy: true}, ""},
	} {
		got := (&Agent{cfg: c.cfg}).dsrUnavailable()
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("routing %q, underlay %v, kube-proxy %v: %q, want %q", c.cfg.Routing, c.cfg.Underlay, c.cfg.LeaveExternalToKubeProxy, got, c.want)
		}
	}
}
