package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/shuntnet/shunt/internal/policy"
)

// The policy package states the C side's numbers for compute; these fail
// to compile when bpf/include/shunt.h changes one of them (a negative or
// non-zero difference is an invalid array index).
var (
	_ = [1]struct{}{}[policy.IdentityAny-uint32(podtcShuntIdentitySHUNT_ID_ANY)]
	_ = [1]struct{}{}[policy.IdentityHost-uint32(podtcShuntIdentitySHUNT_ID_HOST)]
	_ = [1]struct{}{}[policy.IdentityWorld-uint32(podtcShuntIdentitySHUNT_ID_WORLD)]
	_ = [1]struct{}{}[policy.IdentityRemoteNode-uint32(podtcShuntIdentitySHUNT_ID_REMOTE_NODE)]
	_ = [1]struct{}{}[policy.FirstPodIdentity-uint32(podtcShuntIdentitySHUNT_ID_FIRST_POD)]
	_ = [1]struct{}{}[policy.FirstCIDRIdentity-uint32(podtcShuntIdentitySHUNT_ID_FIRST_CIDR)]
	_ = [1]struct{}{}[policy.VerdictNone-policy.Verdict(podtcPolicyVerdictPOLICY_NONE)]
	_ = [1]struct{}{}[policy.VerdictAllow-policy.Verdict(podtcPolicyVerdictPOLICY_ALLOW)]
	_ = [1]struct{}{}[policy.VerdictDeny-policy.Verdict(podtcPolicyVerdictPOLICY_DENY)]
)

func policyKey(k policy.Key) podtcPolicyKey {
	k = k.Canonical()
	key := podtcPolicyKey{
		Prefixlen: policy.PrefixFixed, Endpoint: be32(k.Endpoint), Identity: k.Identity, Proto: k.Proto, Dport: be16(k.Port),
	}
	if k.Egress {
		key.Egress = 1
	}
	if k.Proto != 0 {
		key.Prefixlen = policy.PrefixProto + uint32(k.PortBits)
	}
	return key
}

func fromPolicyKey(k podtcPolicyKey) policy.Key {
	pk := policy.Key{Endpoint: fromBe32(k.Endpoint), Egress: k.Egress == 1, Identity: k.Identity, Proto: k.Proto}
	if k.Prefixlen >= policy.PrefixProto {
		pk.Port, pk.PortBits = fromBe16(k.Dport), uint8(k.Prefixlen-policy.PrefixProto)
	} else {
		pk.Proto = 0
	}
	return pk.Canonical()
}

func ipcacheKey(p netip.Prefix) podtcIpcacheKey {
	p = p.Masked()
	return podtcIpcacheKey{Prefixlen: uint32(p.Bits()), Ip4: be32(p.Addr())}
}

func fromIpcacheKey(k podtcIpcacheKey) netip.Prefix {
	return netip.PrefixFrom(fromBe32(k.Ip4), int(k.Prefixlen))
}

// mirroredMap keeps the content of one BPF map in memory, read from the
// kernel once, so a sync writes only what changed without reading the map
// back every time.
type mirroredMap[K comparable, V comparable] struct {
	m      *ebpf.Map
	name   string
	loaded bool
	have   map[K]V
}

func (mm *mirroredMap[K, V]) load() error {
	if mm.loaded {
		return nil
	}
	mm.have = map[K]V{}
	var k K
	var v V
	it := mm.m.Iterate()
	for it.Next(&k, &v) {
		mm.have[k] = v
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", mm.name, err)
	}
	mm.loaded = true
	return nil
}

// write puts every new or changed entry and returns the stale keys, which
// the caller deletes (prune) once everything that replaces them is in.
// When old and new together do not fit, the stale entries dropFirst picks
// are deleted before the writes (for policy: allows, so the squeeze fails
// closed). The caller checks the desired content fits (capacity).
func (mm *mirroredMap[K, V]) write(want map[K]V, dropFirst func(V) bool) ([]K, error) {
	if err := mm.load(); err != nil {
		return nil, err
	}
	max := int(mm.m.MaxEntries())
	var stale []K
	for k := range mm.have {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	if added := len(want) - (len(mm.have) - len(stale)); len(mm.have)+added > max && dropFirst != nil {
		var keep []K
		for _, k := range stale {
			if dropFirst(mm.have[k]) {
				if err := mm.delete(k); err != nil {
					return nil, err
				}
			} else {
				keep = append(keep, k)
			}
		}
		stale = keep
	}
	for k, v := range want {
		if old, ok := mm.have[k]; ok && old == v {
			continue
		}
		if err := mm.m.Put(k, v); err != nil {
			return nil, fmt.Errorf("writing %s (max %d entries): %w", mm.name, max, err)
		}
		mm.have[k] = v
	}
	return stale, nil
}

func (mm *mirroredMap[K, V]) delete(k K) error {
	if err := mm.m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting from %s: %w", mm.name, err)
	}
	delete(mm.have, k)
	return nil
}

func (mm *mirroredMap[K, V]) prune(stale []K) error {
	for _, k := range stale {
		if err := mm.delete(k); err != nil {
			return err
		}
	}
	return nil
}

// policyMaps are the mirrors of the maps SyncPolicy writes.
type policyMaps struct {
	endpoints mirroredMap[podtcEndpointKey, podtcEndpointInfo]
	ipcache   mirroredMap[podtcIpcacheKey, podtcIpcacheValue]
	cidrs     mirroredMap[podtcIpcacheKey, podtcIpcacheValue]
	policy    mirroredMap[podtcPolicyKey, podtcPolicyValue]
	// identities: for each local identity one of its endpoints, so tc can
	// judge a proxy's upstream connection by the client's egress rules.
	identities mirroredMap[uint32, podtcIdentityEndpoint]
	// netnsPods: each local pod's network namespace cookie -> its
	// address, so sockops accelerates loopback only inside pods.
	netnsPods mirroredMap[uint64, uint32]
}

func (d *Datapath) initPolicyMaps() {
	d.pol = policyMaps{
		endpoints: mirroredMap[podtcEndpointKey, podtcEndpointInfo]{m: d.objs.ShuntEndpoints, name: "shunt_endpoints"},
		ipcache:   mirroredMap[podtcIpcacheKey, podtcIpcacheValue]{m: d.objs.ShuntIpcache, name: "shunt_ipcache"},
		cidrs:     mirroredMap[podtcIpcacheKey, podtcIpcacheValue]{m: d.objs.ShuntCidrIdentities, name: "shunt_cidr_identities"},
		policy:    mirroredMap[podtcPolicyKey, podtcPolicyValue]{m: d.objs.ShuntPolicy, name: "shunt_policy"},
		identities: mirroredMap[uint32, podtcIdentityEndpoint]{
			m: d.objs.ShuntIdentityEndpoints, name: "shunt_identity_endpoints",
		},
		netnsPods: mirroredMap[uint64, uint32]{m: d.sockOps.ShuntNetnsPods, name: "shunt_netns_pods"},
	}
}

func prefixMap(list []policy.PrefixIdentity, what string) (map[podtcIpcacheKey]podtcIpcacheValue, error) {
	out := make(map[podtcIpcacheKey]podtcIpcacheValue, len(list))
	for _, p := range list {
		if !p.Prefix.Addr().Is4() {
			return nil, fmt.Errorf("%s %s: only IPv4 prefixes are supported", what, p.Prefix)
		}
		v := podtcIpcacheValue{Identity: p.Identity}
		if p.Tunnel.IsValid() {
			// The overlay's underlay is IPv4 (tunnel_ip4); 0.0.0.0 would
			// read as "not behind the overlay".
			if !p.Tunnel.Is4() || p.Tunnel.IsUnspecified() {
				return nil, fmt.Errorf("%s %s: tunnel endpoint %s: only a node's IPv4 underlay address is supported",
					what, p.Prefix, p.Tunnel)
			}
			v.TunnelIp4 = be32(p.Tunnel)
		}
		out[ipcacheKey(p.Prefix)] = v
	}
	return out, nil
}

// SyncPolicy makes the endpoint, ipcache and policy maps hold exactly the
// desired state, in an order that never opens what neither the old nor the
// new state allows for longer than the sync itself: new identities and
// policy entries first, then the endpoints (identities, isolation), then
// what is stale. When a policy map is too small for the desired state the
// sync is refused before anything changes, so the previous policy stays in
// force (fail closed).
func (d *Datapath) SyncPolicy(state policy.State, endpoints []Endpoint) error {
	wantEP := make(map[podtcEndpointKey]podtcEndpointInfo, len(endpoints))
	wantID := map[uint32]podtcIdentityEndpoint{}
	wantNetns := map[uint64]uint32{}
	for _, e := range endpoints {
		if !e.IP.Is4() {
			return fmt.Errorf("endpoint %s: only IPv4 pod addresses are supported", e.IP)
		}
		var cookie uint64
		if e.Netns != "" {
			var err error
			if cookie, err = d.netns.cookie(e.Netns); err != nil {
				return fmt.Errorf("endpoint %s: %w", e.IP, err)
			}
		}
		if cookie != 0 {
			wantNetns[cookie] = be32(e.IP)
		}
		v := endpointValue(e, cookie)
		wantEP[endpointKey(e.IP)] = v
		// Pods of one identity have the same rules: the lowest address
		// stands for them, so the choice is stable across syncs.
		if old, ok := wantID[e.Identity]; !ok || e.IP.Less(fromBe32(old.Ip)) {
			wantID[e.Identity] = podtcIdentityEndpoint{Ip: be32(e.IP), Flags: v.Flags}
		}
	}
	wantIP, err := prefixMap(state.IPCache, "ipcache entry")
	if err != nil {
		return err
	}
	wantCIDR, err := prefixMap(state.CIDRIdentities, "CIDR identity")
	if err != nil {
		return err
	}
	wantPol := make(map[podtcPolicyKey]podtcPolicyValue, len(state.Entries))
	for _, e := range state.Entries {
		if !e.Endpoint.Is4() {
			return fmt.Errorf("policy entry for %s: only IPv4 pods are supported", e.Endpoint)
		}
		wantPol[policyKey(e.Key)] = podtcPolicyValue{Verdict: uint8(e.Verdict), RuleId: e.RuleID}
	}
	if err := d.PolicyFits(state, len(wantEP)); err != nil {
		return err
	}

	isAllow := func(v podtcPolicyValue) bool { return v.Verdict == uint8(policy.VerdictAllow) }
	staleIP, err := d.pol.ipcache.write(wantIP, nil)
	if err != nil {
		return err
	}
	staleCIDR, err := d.pol.cidrs.write(wantCIDR, nil)
	if err != nil {
		return err
	}
	stalePol, err := d.pol.policy.write(wantPol, isAllow)
	if err != nil {
		return err
	}
	staleEP, err := d.pol.endpoints.write(wantEP, nil)
	if err != nil {
		return err
	}
	staleID, err := d.pol.identities.write(wantID, nil)
	if err != nil {
		return err
	}
	staleNetns, err := d.pol.netnsPods.write(wantNetns, nil)
	if err != nil {
		return err
	}
	inUse := make(map[uint64]bool, len(wantNetns))
	for c := range wantNetns {
		inUse[c] = true
	}
	d.netns.forget(inUse)
	return errors.Join(d.pol.netnsPods.prune(staleNetns), d.pol.identities.prune(staleID), d.pol.endpoints.prune(staleEP),
		d.pol.policy.prune(stalePol), d.pol.cidrs.prune(staleCIDR), d.pol.ipcache.prune(staleIP))
}

// PolicyFits says whether a desired policy state (and this many local pods)
// fits the maps, so a change can be refused before anything is built.
func (d *Datapath) PolicyFits(state policy.State, endpoints int) error {
	for _, c := range []struct {
		name string
		want int
	}{
		{"shunt_ipcache", len(state.IPCache)},
		{"shunt_cidr_identities", len(state.CIDRIdentities)},
		{"shunt_policy", len(state.Entries)},
		{"shunt_endpoints", endpoints},
		{"shunt_identity_endpoints", endpoints}, // at most one per endpoint
		{"shunt_netns_pods", endpoints},
	} {
		if err := d.checkFits(c.name, c.want); err != nil {
			return err
		}
	}
	return nil
}

// PolicyEntries reads shunt_policy back from the kernel, decoded.
func (d *Datapath) PolicyEntries() ([]policy.Entry, error) {
	var out []policy.Entry
	var k podtcPolicyKey
	var v podtcPolicyValue
	it := d.objs.ShuntPolicy.Iterate()
	for it.Next(&k, &v) {
		out = append(out, policy.Entry{Key: fromPolicyKey(k), Verdict: policy.Verdict(v.Verdict), RuleID: v.RuleId})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading shunt_policy: %w", err)
	}
	slices.SortFunc(out, func(a, b policy.Entry) int { return a.Key.Compare(b.Key) })
	return out, nil
}
