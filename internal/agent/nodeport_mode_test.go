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
