package agent

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/ipam"
)

// settleMasquerade keeps the node's masquerade across restarts, as its
// tunnel: started again without --masquerade it masquerades as before;
// other ports or exclusions need `lab down` first.
func settleMasquerade(state *State, cfg *Config) error {
	given := cfg.MasqueradePorts != (dpinfo.PortRange{}) || cfg.MasqueradeExclude != nil
	if given && !cfg.Masquerade && state.Masquerade == nil {
		return fmt.Errorf("--masquerade-ports and --masquerade-exclude go with --masquerade")
	}
	if cfg.MasqueradePorts == (dpinfo.PortRange{}) {
		cfg.MasqueradePorts = dpinfo.DefaultMasqPorts
	}
	want := &MasqueradeState{Ports: cfg.MasqueradePorts.String()}
	for _, p := range cfg.MasqueradeExclude {
		want.Exclude = append(want.Exclude, p.String())
	}
	was := state.Masquerade
	switch {
	case was == nil && cfg.Masquerade:
		state.Masquerade = want
		return nil
	case was == nil:
		return nil
	case cfg.Masquerade && given && (was.Ports != want.Ports || !slices.Equal(was.Exclude, want.Exclude)):
		return fmt.Errorf("instance %q already masquerades with ports %s, exclusions %v; run `shunt --instance %s lab down` first to change them",
			cfg.Instance.Name, was.Ports, was.Exclude, cfg.Instance.Name)
	}
	ports, err := dpinfo.ParsePortRange(was.Ports)
	if err != nil {
		return fmt.Errorf("the persisted masquerade: %w", err)
	}
	var exclude []netip.Prefix
	for _, s := range was.Exclude {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("the persisted masquerade exclusion %q: %w", s, err)
		}
		exclude = append(exclude, p)
	}
	cfg.Masquerade, cfg.MasqueradePorts, cfg.MasqueradeExclude = true, ports, exclude
	return nil
}

// needsUnderlay says whether the node needs its underlay address: to be
// reached by other nodes (tunnel or native routing), or to masquerade
// from.
func needsUnderlay(cfg Config) bool {
	return cfg.Routing != "" || cfg.Masquerade
}

// underlayUser names the flag that needs the node's underlay address.
func underlayUser(cfg Config) string {
	switch {
	case cfg.Tunnel != "":
		return "--tunnel " + cfg.Tunnel
	case cfg.Routing != "":
		return "--routing " + cfg.Routing
	}
	return "--masquerade"
}

// nativeUnderlay is, with native routing, the ifindex of the interface
// holding the node's underlay address, out of which pods' packets for
// other nodes leave routed (0: no native routing). The pod programs read
// it at load time.
func nativeUnderlay(cfg Config, mode datapath.Mode) (int, error) {
	if cfg.Routing != RoutingNative {
		return 0, nil
	}
	if !mode.UsesBPF() {
		return 0, fmt.Errorf("--routing native needs a BPF forwarding mode (%s or %s), not %s: the tc programs route",
			datapath.ModeRedirectPeer, datapath.ModeRedirect, mode)
	}
	_, ifindex, err := datapath.UplinkOf(cfg.Underlay)
	if err != nil {
		return 0, fmt.Errorf("--routing native: %w", err)
	}
	return ifindex, nil
}

// attachUplink attaches the uplink programs to the interface holding the
// node's address and returns its name.
func (a *Agent) attachUplink() (string, error) {
	name, ifindex, err := datapath.UplinkOf(a.cfg.Underlay)
	if err != nil {
		return "", err
	}
	return name, a.dp.AttachUplink(name, ifindex)
}

// masqueradeOf is the datapath's masquerade for this configuration (nil:
// none), refused when it cannot work: the tc programs translate, and the
// ports must be outside those the node's own connections take, or their
// replies would be taken for a pod's.
func masqueradeOf(cfg Config, mode datapath.Mode) (*datapath.Masquerade, error) {
	if !cfg.Masquerade {
		return nil, nil
	}
	if !mode.UsesBPF() {
		return nil, fmt.Errorf("--masquerade needs a BPF forwarding mode (%s or %s), not %s: the tc programs translate",
			datapath.ModeRedirectPeer, datapath.ModeRedirect, mode)
	}
	eph, err := datapath.EphemeralPorts()
	if err != nil {
		return nil, err
	}
	if cfg.MasqueradePorts.Overlaps(eph) {
		return nil, fmt.Errorf("--masquerade-ports %s overlaps the node's ephemeral ports %s (net.ipv4.ip_local_port_range): "+
			"the node's own connections would take ports the masquerade hands out; choose ports outside it (default %s)",
			cfg.MasqueradePorts, eph, dpinfo.DefaultMasqPorts)
	}
	return &datapath.Masquerade{Addr: cfg.Underlay, Ports: cfg.MasqueradePorts}, nil
}

// startMasquerade writes the destinations the masquerade (on the uplink,
// attachUplink) leaves alone.
func (a *Agent) startMasquerade(podPool, svcPool ipam.Pool) error {
	exclude := a.cfg.MasqueradeExclude
	if exclude == nil {
		cluster := a.cfg.ClusterCIDR
		if !cluster.IsValid() {
			cluster = podPool.CIDR
		}
		exclude = []netip.Prefix{cluster, svcPool.CIDR,
			netip.PrefixFrom(a.cfg.Underlay, 32), netip.PrefixFrom(podPool.NodeIP(), 32)}
	}
	if err := a.dp.SyncMasqExclude(exclude); err != nil {
		return err
	}
	a.masq = &api.MasqueradeStatus{Uplink: a.uplink, Address: a.cfg.Underlay.String(), Ports: a.cfg.MasqueradePorts.String()}
	for _, p := range exclude {
		a.masq.Exclude = append(a.masq.Exclude, p.String())
	}
	return nil
}
