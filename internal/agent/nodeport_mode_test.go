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
