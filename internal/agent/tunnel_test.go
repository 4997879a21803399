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
