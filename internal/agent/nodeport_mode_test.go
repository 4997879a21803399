package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
)

// DSR and hybrid need native routing: refused with the overlay, or with no
// routing between nodes, before anything of the node is made; snat goes
// with either.
func TestNodePortModeNeedsNativeRouting(t *testing.T) {
	for _, mode := range []dpinfo.NodePortMode{dpinfo.NodePortDSR, dpinfo.NodePortHybrid} {
		for _, routing := range []string{RoutingTunnel, ""} {
			_, err := nodePortOf(Config{NodePortMode: mode, Routing: routing}, datapath.ModeRedirectPeer, netip.Addr{})
			if err == nil || !strings.Contains(err.Error(), "needs --routing native") {
				t.Errorf("mode %s, routing %q: %v; want refused, naming --routing native", mode, routing, err)
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
		{Config{Routing: RoutingTunnel, Underlay: underlay}, "routing is tunnel: DSR needs --routing native"},
		{Config{Underlay: underlay}, "routing is the host stack's"},
		{Config{Routing: RoutingTunnel}, ""},
		{Config{Routing: RoutingTunnel, Underlay: underlay, LeaveExternalToKubeProxy: true}, ""},
	} {
		got := (&Agent{cfg: c.cfg}).dsrUnavailable()
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("routing %q, underlay %v, kube-proxy %v: %q, want %q", c.cfg.Routing, c.cfg.Underlay, c.cfg.LeaveExternalToKubeProxy, got, c.want)
		}
	}
}
