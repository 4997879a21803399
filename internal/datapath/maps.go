package datapath

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/policy"
)

// mapDesc is everything the datapath knows about one of its maps, in one
// place: `shunt map list` and `map dump`, the map pressure of `shunt
// status`, the shunt_map_entries/capacity metrics and the capacity checks
// before a sync all read it. TestMapTable fails for a map of the BPF
// objects that is not here exactly once.
type mapDesc struct {
	name  string
	about string                    // what the map holds, one line
	of    func(*Datapath) *ebpf.Map // nil: not loaded (yet)
	// dump decodes the entries into rows with readable addresses, ports,
	// protocols and flags; nil when they cannot be listed from user space
	// (ring buffer, socket storage).
	dump func(*Datapath) ([]Row, error)
	// refuse: the agent writes the map from the desired state and refuses
	// a change that needs more entries than it holds before any write
	// (checkFits); the error ends with this advice.
	refuse string
	// insertFailed: a program inserts into the map, and an insert that
	// fails is counted (and named in flows) under this reason.
	insertFailed string
	// flushed: the programs rebuild the map from the traffic, so `shunt
	// map flush` may empty it; this says what that does to the traffic.
	// Empty for the maps the agent writes, which are never flushed.
	flushed string
}

// What emptying each kind of per-connection state does.
const (
	ctFlushed = "every connection is recorded anew from its next packet, whichever end sends it: one policy admits either way goes on, " +
		"one it refuses both ways ends"
	natFlushed = "translated connections lose their translation: their next packets are translated as a new connection's " +
		"(another source port, maybe another backend), so most of them end"
)

// The advice when a policy map is too small.
const policyStays = "the previous policy stays in force"

// mapTable describes every map of the datapath, by name.
var mapTable = []mapDesc{
	{
		name:  "shunt_endpoints",
		about: "local pods: address -> host veth, MACs, identity, policy flags",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntEndpoints },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.objs.ShuntEndpoints, func(k podtcEndpointKey, v podtcEndpointInfo) Row {
				return Row{"ip": fromBe32(k.Ip4).String(), "ifindex": v.Ifindex, "identity": v.Identity,
					"flags": flagsText(v.Flags, endpointFlagNames), "podMAC": macText(v.PodMac[:]), "nodeMAC": macText(v.NodeMac[:])}
			})
		},
		refuse: policyStays,
	},
	{
		name:   "shunt_ipcache",
		about:  "identities of pods and node addresses: address -> identity, and the node hosting a pod of another node (tunnel, LPM trie)",
		of:     func(d *Datapath) *ebpf.Map { return d.objs.ShuntIpcache },
		dump:   func(d *Datapath) ([]Row, error) { return dumpPrefixes(d.objs.ShuntIpcache) },
		refuse: policyStays,
	},
	{
		name:   "shunt_cidr_identities",
		about:  "prefixes policies name (ipBlock, cidr) -> their identity (LPM trie)",
		of:     func(d *Datapath) *ebpf.Map { return d.objs.ShuntCidrIdentities },
		dump:   func(d *Datapath) ([]Row, error) { return dumpPrefixes(d.objs.ShuntCidrIdentities) },
		refuse: policyStays,
	},
	{
		name:  "shunt_policy",
		about: "policy per pod and direction: (peer identity, protocol, port prefix) -> allow/deny, rule (LPM trie)",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntPolicy },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.objs.ShuntPolicy, func(k podtcPolicyKey, v podtcPolicyValue) Row {
				pk := fromPolicyKey(k)
				dir := "ingress"
				if pk.Egress {
					dir = "egress"
				}
				return Row{"endpoint": pk.Endpoint.String(), "direction": dir, "identity": pk.Identity,
					"ports": PortsText(pk), "verdict": policy.Verdict(v.Verdict).String(), "ruleID": v.RuleId}
			})
		},
		refuse: policyStays,
	},
	{
		// Its dump shows shunt_ct_new's entries too: every tracked
		// connection, each with the table it is in.
		name:  "shunt_ct",
		about: "connection tracking, assured connections (TCP handshake completed, others replied and 2 s old): found from either direction (LRU)",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntCt },
		dump: func(d *Datapath) ([]Row, error) {
			assured, err := ctRows(d.objs.ShuntCt, ctTableAssured)
			if err != nil {
				return nil, err
			}
			unassured, err := ctRows(d.objs.ShuntCtNew, ctTableNew)
			return append(assured, unassured...), err
		},
		insertFailed: dpinfo.ReasonCTPromoteFailed.String(),
		flushed:      ctFlushed,
	},
	{
		name:         "shunt_ct_new",
		about:        "connection tracking, connections not assured yet: a flood of new ones evicts only these, never an established one (LRU)",
		of:           func(d *Datapath) *ebpf.Map { return d.objs.ShuntCtNew },
		dump:         func(d *Datapath) ([]Row, error) { return ctRows(d.objs.ShuntCtNew, ctTableNew) },
		insertFailed: dpinfo.ReasonCTFull.String(),
		flushed:      ctFlushed,
	},
	{
		name:  "shunt_tc_nat",
		about: "service translation of the tc path, per flow: original and reply direction (LRU)",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntTcNat },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.objs.ShuntTcNat, func(k podtcTcNatKey, v podtcTcNatValue) Row {
				what := "destination"
				if v.Reply == 1 {
					what = "source"
				}
				return Row{"flow": fmt.Sprintf("%s:%d -> %s:%d/%s", fromBe32(k.Saddr), fromBe16(k.Sport), fromBe32(k.Daddr),
					fromBe16(k.Dport), dpinfo.ProtoName(k.Proto)), "rewrite": what, "to": fmt.Sprintf("%s:%d", fromBe32(v.Addr), fromBe16(v.Port))}
			})
		},
		insertFailed: dpinfo.ReasonNATInsertFailed.String(),
		flushed:      natFlushed,
	},
	{
		name:         "shunt_masq_nat",
		about:        "masquerade: pods' flows to outside the cluster, by tuple of either direction -> the node's address and port or the pod's (LRU)",
		of:           func(d *Datapath) *ebpf.Map { return d.uplink.ShuntMasqNat },
		dump:         func(d *Datapath) ([]Row, error) { return d.masqRows() },
		insertFailed: dpinfo.ReasonMasqInsertFailed.String(),
		flushed:      natFlushed,
	},
	{
		name:         "shunt_nodeport_nat",
		about:        "traffic from outside to the node's Services (NodePort, externalIPs, load balancer): the tuple as it arrives -> the tuple written over it, the client's packets and the backends' replies (LRU)",
		of:           func(d *Datapath) *ebpf.Map { return d.objs.ShuntNodeportNat },
		dump:         func(d *Datapath) ([]Row, error) { return d.nodePortRows() },
		insertFailed: dpinfo.ReasonNATInsertFailed.String(),
		flushed:      natFlushed,
	},
	{
		name: "shunt_maglev",
		about: "Maglev tables of the Services reached from outside: service id -> an array of M backend ids, " +
			"computed alike on every node (hash of maps; each row a table's backends and their shares)",
		of:     func(d *Datapath) *ebpf.Map { return d.objs.ShuntMaglev },
		dump:   func(d *Datapath) ([]Row, error) { return d.maglevRows() },
		refuse: "the previous tables stay in force",
	},
	{
		name:  "shunt_lb_source_ranges",
		about: "loadBalancerSourceRanges: (load balancer frontend's service id, client prefix) -> admitted, or the frontend's catch-all that refuses (LPM trie)",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntLbSourceRanges },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.objs.ShuntLbSourceRanges, func(k uplinktcLbSourceRangeKey, v uplinktcLbSourceRangeValue) Row {
				id, p := rangeOfKey(k)
				return Row{"serviceID": id, "clients": p.String(), "admit": v.Allow == 1}
			})
		},
		refuse: "remove loadBalancerSourceRanges (one entry per range of a load balancer frontend and one per such frontend); the previous ranges stay in force",
	},
	{
		name:  "shunt_masq_exclude",
		about: "masquerade: destinations pods reach with their own address (cluster, services, nodes, --masquerade-exclude; LPM trie)",
		of:    func(d *Datapath) *ebpf.Map { return d.uplink.ShuntMasqExclude },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.uplink.ShuntMasqExclude, func(k podtcIpcacheKey, _ uplinktcMasqExcludeValue) Row {
				return Row{"prefix": fromIpcacheKey(k).String()}
			})
		},
		refuse: "the previous exclusions stay in force",
	},
	{
		name:  "shunt_dsr_nodes",
		about: "DSR: the cluster's other nodes' underlay addresses, the only outer sources DSR's IPIP is taken from",
		of:    func(d *Datapath) *ebpf.Map { return d.uplink.ShuntDsrNodes },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.uplink.ShuntDsrNodes, func(k uplinktcDsrNodeKey, _ uplinktcDsrNodeValue) Row {
				return Row{"node": dsrNodeKeyText(k)}
			})
		},
		refuse: "the previous nodes stay in force",
	},
	{
		name:  "shunt_overlay_wire",
		about: "the uplink program's tail call (slot 0) into the overlay program that takes VXLAN off the wire (not pinned, filled at load)",
		of:    func(d *Datapath) *ebpf.Map { return d.uplink.ShuntOverlayWire },
	},
	{
		name:  "shunt_encap_scratch",
		about: "per CPU room for the overlay's encapsulation in BPF: route lookup, headers, tunnel key (one per object that encapsulates, not pinned, no state between packets)",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntEncapScratch },
	},
	{
		name:  "shunt_services",
		about: "service ports: (VIP, port, protocol, slot) -> slot 0: the service, slot n: its n-th backend",
		of:    func(d *Datapath) *ebpf.Map { return d.sockAddr.ShuntServices },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.sockAddr.ShuntServices, func(k sockaddrServiceKey, v sockaddrServiceValue) Row {
				r := Row{"frontend": fmt.Sprintf("%s:%d/%s", fromBe32(k.Vip), fromBe16(k.Port), dpinfo.ProtoName(k.Proto)), "slot": k.Slot}
				if k.Slot == 0 {
					r["serviceID"], r["backends"], r["affinitySeconds"] = v.Id, v.BackendCount, v.AffinityTimeout
					if m := forwardingOf(v.Flags); m != "" {
						r["forwarding"] = string(m) // the Service's own (shunt.io/forwarding-mode)
					}
				} else {
					r["backendID"] = v.Id
				}
				return r
			})
		},
		refuse: "remove services or endpoints (one entry per service port and one per endpoint of it)",
	},
	{
		// Never fuller than shunt_services, which has a slot for each.
		name:  "shunt_backends",
		about: "service backends: id -> address, port, protocol",
		of:    func(d *Datapath) *ebpf.Map { return d.sockAddr.ShuntBackends },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.sockAddr.ShuntBackends, func(k uint32, v sockaddrBackendValue) Row {
				return Row{"id": k, "backend": fmt.Sprintf("%s:%d/%s", fromBe32(v.Ip), fromBe16(v.Port), dpinfo.ProtoName(v.Proto))}
			})
		},
	},
	{
		name:  "shunt_affinity",
		about: "ClientIP session affinity: (client netns at the socket layer, or client address on the uplink and in tc; service) -> backend, last use (LRU)",
		of:    func(d *Datapath) *ebpf.Map { return d.sockAddr.ShuntAffinity },
		dump: func(d *Datapath) ([]Row, error) {
			now := monotonicNow()
			return dump(d.sockAddr.ShuntAffinity, func(k sockaddrAffinityKey, v sockaddrAffinityValue) Row {
				row := Row{"serviceID": k.ServiceId, "backendID": v.BackendId, "idleSeconds": secondsSince(now, v.LastUsedNs)}
				if k.ClientKind == uint32(sockaddrAffinityClientKindAFFINITY_CLIENT_ADDR) {
					row["client"] = fromBe32(uint32(k.ClientCookie)).String()
				} else {
					row["clientNetnsCookie"] = k.ClientCookie
				}
				return row
			})
		},
		insertFailed: dpinfo.ReasonAffinityInsertFailed.String(),
		flushed:      "clients with ClientIP affinity get a backend chosen anew at their next connection",
	},
	{
		name:  "shunt_revnat",
		about: "UDP reverse NAT: (netns, socket, backend) -> the service address replies get back (LRU)",
		of:    func(d *Datapath) *ebpf.Map { return d.sockAddr.ShuntRevnat },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.sockAddr.ShuntRevnat, func(k sockaddrRevnatKey, v sockaddrRevnatValue) Row {
				return Row{"netnsCookie": k.NetnsCookie, "socketCookie": k.SockCookie,
					"backend": fmt.Sprintf("%s:%d", fromBe32(k.BackendIp), fromBe16(k.BackendPort)),
					"service": fmt.Sprintf("%s:%d", fromBe32(v.Vip), fromBe16(v.Vport))}
			})
		},
		insertFailed: dpinfo.ReasonRevNATInsertFailed.String(),
	},
	{
		name:         "shunt_sock_svc",
		about:        "per socket: the service and backend its connect was translated to (socket storage)",
		of:           func(d *Datapath) *ebpf.Map { return d.sockAddr.ShuntSockSvc },
		insertFailed: dpinfo.ReasonSockStorageFailed.String(),
	},
	{
		name:  "shunt_l7_redirect",
		about: "L7 redirection: TCP destination (service port, pod port) -> the proxy its connects go to",
		of:    func(d *Datapath) *ebpf.Map { return d.sockAddr.ShuntL7Redirect },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.sockAddr.ShuntL7Redirect, func(k sockaddrL7RedirectKey, v sockaddrL7RedirectValue) Row {
				return Row{"destination": fmt.Sprintf("%s:%d", fromBe32(k.Ip), fromBe16(k.Port)), "protocol": dpinfo.ProtoName(k.Proto),
					"proxy": fmt.Sprintf("%s:%d", fromBe32(v.ProxyIp), fromBe16(v.ProxyPort))}
			})
		},
		refuse: "the previous L7 redirections stay in force",
	},
	{
		name:         "shunt_sock_proxied",
		about:        "per socket redirected to a proxy: the destination it dialled (socket storage)",
		of:           func(d *Datapath) *ebpf.Map { return d.sockAddr.ShuntSockProxied },
		insertFailed: dpinfo.ReasonProxyOriginFailed.String(),
	},
	{
		name:  "shunt_proxy_origins",
		about: "connections redirected to a proxy: (client, proxy) tuple -> original destination, for SO_ORIGINAL_DST, and who redirected it (LRU)",
		of:    func(d *Datapath) *ebpf.Map { return d.sockOps.ShuntProxyOrigins },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.sockOps.ShuntProxyOrigins, func(k sockopsProxyOriginKey, v sockopsProxyOrigin) Row {
				return Row{"client": fmt.Sprintf("%s:%d", fromBe32(k.ClientIp), fromBe16(k.ClientPort)),
					"proxy":        fmt.Sprintf("%s:%d", fromBe32(k.ProxyIp), fromBe16(k.ProxyPort)),
					"destination":  fmt.Sprintf("%s:%d", fromBe32(v.Ip), fromBe16(v.Port)),
					"redirectedBy": map[bool]string{true: "tc", false: "socket-hook"}[v.Flags&proxyOriginByTC != 0]}
			})
		},
		insertFailed: dpinfo.ReasonProxyOriginFailed.String(),
	},
	{
		name:  "shunt_identity_endpoints",
		about: "per local identity, one of its pods: whose egress rules judge a proxy's upstream connection for that identity",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntIdentityEndpoints },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.objs.ShuntIdentityEndpoints, func(k uint32, v podtcIdentityEndpoint) Row {
				return Row{"identity": k, "endpoint": fromBe32(v.Ip).String(), "flags": flagsText(v.Flags, endpointFlagNames)}
			})
		},
		refuse: policyStays,
	},
	{
		name:         "shunt_sockhash",
		about:        "socket acceleration: established local sockets by (network namespace, tuple local end first); sk_msg sends to the peer's ingress",
		of:           func(d *Datapath) *ebpf.Map { return d.sockOps.ShuntSockhash },
		dump:         func(d *Datapath) ([]Row, error) { return d.accelRows() },
		insertFailed: dpinfo.ReasonAccelInsertFailed.String(),
	},
	{
		name:  "shunt_accel_connecting",
		about: "socket acceleration: connecting ends just accelerated, until their accepting end follows (LRU)",
		of:    func(d *Datapath) *ebpf.Map { return d.sockOps.ShuntAccelConnecting },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.sockOps.ShuntAccelConnecting, func(k sockopsSockKey, _ uint8) Row { return sockKeyRow(k) })
		},
	},
	{
		name: "shunt_accel_sk_addrs",
		about: "socket acceleration: each accelerated socket's kernel address by its key, where its peer's sk_msg reads " +
			"how full its queue is (the address itself is not shown)",
		of: func(d *Datapath) *ebpf.Map { return d.sockOps.ShuntAccelSkAddrs },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.sockOps.ShuntAccelSkAddrs, func(k sockopsSockKey, _ uint64) Row { return sockKeyRow(k) })
		},
	},
	{
		name:  "shunt_accel_socks",
		about: "socket storage of accelerated sockets: the peer's key, bytes and sends through the redirect (reported in flows when they close)",
		of:    func(d *Datapath) *ebpf.Map { return d.sockOps.ShuntAccelSocks },
	},
	{
		name:  "shunt_netns_pods",
		about: "network namespace cookie -> local pod address (loopback is accelerated only inside pods)",
		of:    func(d *Datapath) *ebpf.Map { return d.sockOps.ShuntNetnsPods },
		dump: func(d *Datapath) ([]Row, error) {
			return dump(d.sockOps.ShuntNetnsPods, func(k uint64, v uint32) Row {
				return Row{"netnsCookie": k, "ip": fromBe32(v).String()}
			})
		},
		refuse: policyStays,
	},
	{
		name:  "shunt_accel_config",
		about: "socket acceleration switch (new connections join the sockhash only when on)",
		of:    func(d *Datapath) *ebpf.Map { return d.sockOps.ShuntAccelConfig },
		dump: func(d *Datapath) ([]Row, error) {
			c, n, err := d.AccelStatus()
			return []Row{{"enabled": c.On, "nodeProcesses": c.NodeProcesses, "sockets": n}}, err
		},
	},
	{
		name:  "shunt_metrics",
		about: "outcome counters by (reason, direction) of every program, per CPU",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntMetrics },
		dump: func(d *Datapath) ([]Row, error) {
			cs, err := d.Counters()
			var rows []Row
			for _, c := range cs {
				rows = append(rows, Row{"reason": c.Reason, "direction": c.Direction, "packets": c.Packets, "bytes": c.Bytes})
			}
			return rows, err
		},
	},
	{
		name:  "shunt_flow_config",
		about: "flow sampling: off, default or all",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntFlowConfig },
		dump: func(d *Datapath) ([]Row, error) {
			var v podtcFlowConfig
			err := d.objs.ShuntFlowConfig.Lookup(uint32(0), &v)
			return []Row{{"sampling": FlowMode(v.Mode).String()}}, err
		},
	},
	{
		name:  "shunt_flow_stats",
		about: "flow events emitted and lost (ring buffer full), per CPU",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntFlowStats },
		dump: func(d *Datapath) ([]Row, error) {
			e, l, err := d.FlowStats()
			return []Row{{"emitted": e, "lost": l}}, err
		},
	},
	{
		name:  "shunt_flows",
		about: "flow events to the agent (ring buffer; not pinned, sized at start)",
		of:    func(d *Datapath) *ebpf.Map { return d.objs.ShuntFlows },
	},
	{
		name:  "shunt_gone_backends",
		about: "UDP backends gone, for one run of the socket-destroy iterator (empty between runs)",
		of:    func(d *Datapath) *ebpf.Map { return d.destroyer.goneBackends() },
		dump: func(d *Datapath) ([]Row, error) {
			m := d.destroyer.goneBackends()
			if m == nil {
				return nil, nil
			}
			return dump(m, func(k sockdestroyGoneBackend, _ uint8) Row {
				return Row{"backend": fmt.Sprintf("%s:%d/%s", fromBe32(k.Ip), fromBe16(k.Port), dpinfo.ProtoName(k.Proto))}
			})
		},
	},
}

// describe finds a map's description.
func describe(name string) (mapDesc, bool) {
	i := slices.IndexFunc(mapTable, func(m mapDesc) bool { return m.name == name })
	if i < 0 {
		return mapDesc{}, false
	}
	return mapTable[i], true
}

// whenFull says what happens when the map is full.
func (md mapDesc) whenFull(t ebpf.MapType) string {
	var parts []string
	if md.refuse != "" {
		parts = append(parts, "a change that does not fit is refused before any write: "+md.refuse)
	}
	if t == ebpf.LRUHash || t == ebpf.LRUCPUHash {
		parts = append(parts, "the least recently used entry makes room")
	}
	if md.insertFailed != "" {
		parts = append(parts, "an insert that fails is counted as "+md.insertFailed)
	}
	return strings.Join(parts, "; ")
}

// checkFits refuses desired content of need entries that the map cannot
// hold, before anything is written, so what the map holds stays in force.
func (d *Datapath) checkFits(name string, need int) error {
	md, ok := describe(name)
	if !ok {
		return fmt.Errorf("checking the capacity of %s: no such map", name)
	}
	if max := int(md.of(d).MaxEntries()); need > max {
		return fmt.Errorf("%s is full: %d entries needed, the map holds %d; nothing changed: %s", name, need, max, md.refuse)
	}
	return nil
}

// Maps lists every map with its fill level (entries are counted by walking
// the keys: a scrape of a full 128k-entry table takes tens of ms).
func (d *Datapath) Maps() ([]dpinfo.MapInfo, error) {
	var out []dpinfo.MapInfo
	for _, md := range mapTable {
		m := md.of(d)
		if m == nil {
			continue
		}
		_, err := os.Stat(filepath.Join(d.cfg.PinDir, md.name))
		info := dpinfo.MapInfo{Name: md.name, About: md.about, Type: m.Type().String(), Capacity: int(m.MaxEntries()), Entries: -1,
			Pinned: err == nil, Dumpable: md.dump != nil, WhenFull: md.whenFull(m.Type())}
		switch m.Type() {
		case ebpf.RingBuf, ebpf.SkStorage:
		case ebpf.Array, ebpf.PerCPUArray:
			info.Entries = info.Capacity
		default:
			n, err := countKeys(m)
			if err != nil {
				return nil, fmt.Errorf("counting %s: %w", md.name, err)
			}
			info.Entries = n
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b dpinfo.MapInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// countKeys walks a map's keys. Metrics count every map at each scrape,
// 100 000 keys at 10 000 Services: the two key buffers are reused and passed
// as unsafe.Pointer, which cilium/ebpf hands to the kernel as they are,
// where a []byte in an interface would cost an allocation per key.
// A hash map whose key the walk stands on is deleted meanwhile starts the
// walk over from its first key (allKeys remembers keys to stop there; this
// would cost the allocations it avoids), so on a busy table the count may
// take some keys twice: it stops at the map's capacity, which bounds both
// the answer and the walk.
func countKeys(m *ebpf.Map) (int, error) {
	limit := int(m.MaxEntries())
	size := max(int(m.KeySize()), 1)
	buf := make([]byte, 2*size)
	cur, next := unsafe.Pointer(&buf[0]), unsafe.Pointer(&buf[size])
	n := 0
	var prev any // nil: the first key
	for {
		err := m.NextKey(prev, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
		if limit > 0 && n >= limit {
			return n, nil
		}
		cur, next = next, cur
		prev = cur
	}
}

// DumpMap decodes a map's entries; raw gives keys and values in hex as the
// kernel holds them.
func (d *Datapath) DumpMap(name string, raw bool) ([]Row, error) {
	md, ok := describe(name)
	var m *ebpf.Map
	if ok {
		m = md.of(d)
	}
	if m == nil {
		return nil, fmt.Errorf("no map %q: `shunt map list` shows them", name)
	}
	if md.dump == nil {
		return nil, fmt.Errorf("%s is a %s (%s): its entries cannot be listed from user space", name, m.Type(), md.about)
	}
	if !raw {
		return md.dump(d)
	}
	var rows []Row
	key, val := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	if m.Type() == ebpf.PerCPUArray || m.Type() == ebpf.PerCPUHash || m.Type() == ebpf.LRUCPUHash {
		return nil, fmt.Errorf("%s is per-CPU: use the decoded dump", name)
	}
	it := m.Iterate()
	for it.Next(&key, &val) {
		rows = append(rows, Row{"key": hex.EncodeToString(key), "value": hex.EncodeToString(val)})
	}
	return rows, it.Err()
}

// FlushMap deletes every entry the map holds now and says how many went:
// only maps of per-connection state the programs rebuild (mapDesc.flushed).
// Entries the programs add meanwhile stay. Keys are read first and deleted
// after, as deleting while walking a hash map can skip keys.
func (d *Datapath) FlushMap(name string) (dpinfo.MapFlush, error) {
	md, ok := describe(name)
	var m *ebpf.Map
	if ok {
		m = md.of(d)
	}
	if m == nil {
		return dpinfo.MapFlush{}, fmt.Errorf("no map %q: `shunt map list` shows them", name)
	}
	if md.flushed == "" {
		return dpinfo.MapFlush{}, fmt.Errorf("%s is not flushed: the agent writes it from the desired state (`shunt sync` compares and repairs it); "+
			"the maps of per-connection state are flushed: %s", name, strings.Join(flushable(), ", "))
	}
	keys, err := allKeys(m)
	if err != nil {
		return dpinfo.MapFlush{}, fmt.Errorf("flushing %s: reading its keys: %w", name, err)
	}
	out := dpinfo.MapFlush{Map: name, Effect: md.flushed}
	for _, k := range keys {
		switch err := m.Delete(k); {
		case err == nil:
			out.Removed++
		case errors.Is(err, ebpf.ErrKeyNotExist): // gone meanwhile (closed, evicted)
		default:
			return out, fmt.Errorf("flushing %s: %d entries deleted, then: %w", name, out.Removed, err)
		}
	}
	return out, nil
}

// flushable lists the maps FlushMap empties.
func flushable() []string {
	var out []string
	for _, md := range mapTable {
		if md.flushed != "" {
			out = append(out, md.name)
		}
	}
	return out
}

// allKeys reads every key of m, each in a buffer of its own. A hash map
// whose key the walk stands on is deleted meanwhile (a connection closed or
// evicted) starts the walk over from its first key: a key seen twice ends
// it, so that a busy map cannot keep it going.
func allKeys(m *ebpf.Map) ([][]byte, error) {
	var keys [][]byte
	seen := map[string]bool{}
	var prev any // nil: the first key
	for {
		next := make([]byte, max(int(m.KeySize()), 1))
		err := m.NextKey(prev, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return keys, nil
		}
		if err != nil {
			return keys, err
		}
		if seen[string(next)] {
			return keys, nil
		}
		seen[string(next)] = true
		keys = append(keys, next)
		prev = next
	}
}

func dump[K comparable, V any](m *ebpf.Map, row func(K, V) Row) ([]Row, error) {
	var out []Row
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, row(k, v))
	}
	return out, it.Err()
}

func dumpPrefixes(m *ebpf.Map) ([]Row, error) {
	return dump(m, func(k podtcIpcacheKey, v podtcIpcacheValue) Row {
		r := Row{"prefix": fromIpcacheKey(k).String(), "identity": v.Identity}
		if v.TunnelIp4 != 0 {
			r["tunnel"] = fromBe32(v.TunnelIp4).String()
		}
		return r
	})
}

// PortsText shows a policy key's protocol and port prefix: "80/TCP",
// "8000-8063/TCP", "all/UDP", "any".
func PortsText(k policy.Key) string {
	if k.Proto == 0 {
		return "any"
	}
	proto := dpinfo.ProtoName(k.Proto)
	if k.PortBits == 0 {
		return "all/" + proto
	}
	lo := k.Port
	hi := lo | ^(^uint16(0) << (16 - k.PortBits))
	if lo == hi {
		return fmt.Sprintf("%d/%s", lo, proto)
	}
	return fmt.Sprintf("%d-%d/%s", lo, hi, proto)
}

// The conntrack table an entry is in, as dumps name it.
const (
	ctTableAssured = "assured" // shunt_ct
	ctTableNew     = "new"     // shunt_ct_new
)

// ctRows decodes a conntrack table's entries, each named with its table.
func ctRows(m *ebpf.Map, table string) ([]Row, error) {
	now := monotonicNow()
	return dump(m, func(k podtcCtKey, v podtcCtValue) Row {
		a := fmt.Sprintf("%s:%d", fromBe32(k.AddrA), fromBe16(k.PortA))
		b := fmt.Sprintf("%s:%d", fromBe32(k.AddrB), fromBe16(k.PortB))
		src, dst := a, b
		if v.Flags&uint32(podtcCtFlagsCT_F_ORIG_IS_A) == 0 {
			src, dst = b, a
		}
		return Row{"source": src, "destination": dst, "protocol": dpinfo.ProtoName(k.Proto), "table": table, "state": ctState(v.Flags, table),
			"flags": flagsText(v.Flags, ctFlagNames), "ageSeconds": secondsSince(now, v.CreatedNs),
			"idleSeconds": secondsSince(now, v.LastSeenNs), "ruleID": v.RuleId}
	})
}

// ctState names a connection's state from its flags and table: a reply
// seen makes it "replied" until it is assured (in shunt_ct), then
// "established".
func ctState(f uint32, table string) string {
	state := "opening"
	switch {
	case f&uint32(podtcCtFlagsCT_F_RST) != 0:
		state = "reset"
	case f&uint32(podtcCtFlagsCT_F_FIN_A) != 0 && f&uint32(podtcCtFlagsCT_F_FIN_B) != 0:
		state = "closed"
	case f&uint32(podtcCtFlagsCT_F_FIN_A|podtcCtFlagsCT_F_FIN_B) != 0:
		state = "closing"
	case f&uint32(podtcCtFlagsCT_F_REPLY_SEEN) != 0 && table == ctTableNew:
		state = "replied"
	case f&uint32(podtcCtFlagsCT_F_REPLY_SEEN) != 0:
		state = "established"
	}
	return state
}

func macText(b []byte) string {
	parts := make([]string, len(b))
	for i, x := range b {
		parts[i] = fmt.Sprintf("%02x", x)
	}
	return strings.Join(parts, ":")
}

func monotonicNow() time.Duration { return time.Since(monotonicZero()) }

func secondsSince(now time.Duration, ns uint64) float64 {
	// The coarse clock's stamps (conntrack, NAT) trail CLOCK_MONOTONIC by
	// up to a tick: a just-refreshed entry reads as idle for no time.
	return float64(max(now-time.Duration(ns), 0).Milliseconds()) / 1000
}

// sockKeyRow shows a socket acceleration key: the socket's tuple, local end
// first, and its network namespace.
func sockKeyRow(k sockopsSockKey) Row {
	return Row{"local": fmt.Sprintf("%s:%d", fromBe32(k.LocalIp), fromBe16(k.LocalPort)),
		"remote": fmt.Sprintf("%s:%d", fromBe32(k.RemoteIp), fromBe16(k.RemotePort)), "netnsCookie": k.NetnsCookie}
}
