package datapath

import (
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/shuntnet/shunt/internal/policy"
)

// MapInfo describes one map of the datapath.
type MapInfo struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Entries  int    `json:"entries"` // -1: not countable (ring buffer, socket storage)
	Capacity int    `json:"capacity"`
	Pinned   bool   `json:"pinned"`
	Dumpable bool   `json:"dumpable"`
}

// Row is one decoded map entry: column name -> value.
type Row map[string]any

// mapDumpers decode each map's entries into rows with readable addresses,
// ports, protocols and flags. Maps missing here (ring buffer, socket
// storage) cannot be listed from user space.
func (d *Datapath) mapDumpers() map[string]func() ([]Row, error) {
	return map[string]func() ([]Row, error){
		"shunt_endpoints": func() ([]Row, error) {
			return dump(d.objs.ShuntEndpoints, func(k podtcEndpointKey, v podtcEndpointInfo) Row {
				return Row{"ip": fromBe32(k.Ip4).String(), "ifindex": v.Ifindex, "identity": v.Identity,
					"flags": flagsText(v.Flags, endpointFlagNames), "podMAC": macText(v.PodMac[:]), "nodeMAC": macText(v.NodeMac[:])}
			})
		},
		"shunt_ipcache":         func() ([]Row, error) { return dumpPrefixes(d.objs.ShuntIpcache) },
		"shunt_cidr_identities": func() ([]Row, error) { return dumpPrefixes(d.objs.ShuntCidrIdentities) },
		"shunt_policy": func() ([]Row, error) {
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
		"shunt_ct": func() ([]Row, error) {
			now := monotonicNow()
			return dump(d.objs.ShuntCt, func(k podtcCtKey, v podtcCtValue) Row {
				a := fmt.Sprintf("%s:%d", fromBe32(k.AddrA), fromBe16(k.PortA))
				b := fmt.Sprintf("%s:%d", fromBe32(k.AddrB), fromBe16(k.PortB))
				src, dst := a, b
				if v.Flags&uint32(podtcCtFlagsCT_F_ORIG_IS_A) == 0 {
					src, dst = b, a
				}
				return Row{"source": src, "destination": dst, "protocol": ProtoName(k.Proto), "state": ctFlagsText(v.Flags), "flags": flagsText(v.Flags, ctFlagNames),
					"ageSeconds": secondsSince(now, v.CreatedNs), "idleSeconds": secondsSince(now, v.LastSeenNs), "ruleID": v.RuleId}
			})
		},
		"shunt_tc_nat": func() ([]Row, error) {
			return dump(d.objs.ShuntTcNat, func(k podtcTcNatKey, v podtcTcNatValue) Row {
				what := "destination"
				if v.Reply == 1 {
					what = "source"
				}
				return Row{"flow": fmt.Sprintf("%s:%d -> %s:%d/%s", fromBe32(k.Saddr), fromBe16(k.Sport), fromBe32(k.Daddr),
					fromBe16(k.Dport), ProtoName(k.Proto)), "rewrite": what, "to": fmt.Sprintf("%s:%d", fromBe32(v.Addr), fromBe16(v.Port))}
			})
		},
		"shunt_services": func() ([]Row, error) {
			return dump(d.sock.ShuntServices, func(k socklbServiceKey, v socklbServiceValue) Row {
				r := Row{"frontend": fmt.Sprintf("%s:%d/%s", fromBe32(k.Vip), fromBe16(k.Port), ProtoName(k.Proto)), "slot": k.Slot}
				if k.Slot == 0 {
					r["serviceID"], r["backends"], r["affinitySeconds"] = v.Id, v.BackendCount, v.AffinityTimeout
				} else {
					r["backendID"] = v.Id
				}
				return r
			})
		},
		"shunt_backends": func() ([]Row, error) {
			return dump(d.sock.ShuntBackends, func(k uint32, v socklbBackendValue) Row {
				return Row{"id": k, "backend": fmt.Sprintf("%s:%d/%s", fromBe32(v.Ip), fromBe16(v.Port), ProtoName(v.Proto))}
			})
		},
		"shunt_affinity": func() ([]Row, error) {
			now := monotonicNow()
			return dump(d.sock.ShuntAffinity, func(k socklbAffinityKey, v socklbAffinityValue) Row {
				return Row{"clientNetnsCookie": k.ClientCookie, "serviceID": k.ServiceId, "backendID": v.BackendId,
					"idleSeconds": secondsSince(now, v.LastUsedNs)}
			})
		},
		"shunt_revnat": func() ([]Row, error) {
			return dump(d.sock.ShuntRevnat, func(k socklbRevnatKey, v socklbRevnatValue) Row {
				return Row{"netnsCookie": k.NetnsCookie, "socketCookie": k.SockCookie,
					"backend": fmt.Sprintf("%s:%d", fromBe32(k.BackendIp), fromBe16(k.BackendPort)),
					"service": fmt.Sprintf("%s:%d", fromBe32(v.Vip), fromBe16(v.Vport))}
			})
		},
		"shunt_metrics": func() ([]Row, error) {
			cs, err := d.Counters()
			var rows []Row
			for _, c := range cs {
				rows = append(rows, Row{"reason": c.Reason, "direction": c.Direction, "packets": c.Packets, "bytes": c.Bytes})
			}
			return rows, err
		},
		"shunt_flow_config": func() ([]Row, error) {
			var v podtcFlowConfig
			err := d.objs.ShuntFlowConfig.Lookup(uint32(0), &v)
			return []Row{{"sampling": FlowMode(v.Mode).String()}}, err
		},
		"shunt_flow_stats": func() ([]Row, error) {
			e, l, err := d.FlowStats()
			return []Row{{"emitted": e, "lost": l}}, err
		},
	}
}

// allMaps names every map of the instance.
func (d *Datapath) allMaps() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		"shunt_endpoints": d.objs.ShuntEndpoints, "shunt_ipcache": d.objs.ShuntIpcache,
		"shunt_cidr_identities": d.objs.ShuntCidrIdentities, "shunt_policy": d.objs.ShuntPolicy,
		"shunt_ct": d.objs.ShuntCt, "shunt_tc_nat": d.objs.ShuntTcNat, "shunt_metrics": d.objs.ShuntMetrics,
		"shunt_flow_config": d.objs.ShuntFlowConfig, "shunt_flow_stats": d.objs.ShuntFlowStats,
		"shunt_flows": d.objs.ShuntFlows, "shunt_services": d.sock.ShuntServices, "shunt_backends": d.sock.ShuntBackends,
		"shunt_affinity": d.sock.ShuntAffinity, "shunt_revnat": d.sock.ShuntRevnat, "shunt_sock_svc": d.sock.ShuntSockSvc,
	}
}

// Maps lists every map with its fill level (entries are counted by walking
// the keys: a scrape of a full 128k-entry table takes tens of ms).
func (d *Datapath) Maps() ([]MapInfo, error) {
	dumpers := d.mapDumpers()
	var out []MapInfo
	all := d.allMaps()
	for _, name := range slices.Sorted(maps.Keys(all)) {
		m := all[name]
		info := MapInfo{Name: name, Type: m.Type().String(), Capacity: int(m.MaxEntries()), Entries: -1, Pinned: name != "shunt_flows"}
		_, info.Dumpable = dumpers[name]
		switch m.Type() {
		case ebpf.RingBuf, ebpf.SkStorage:
		case ebpf.Array, ebpf.PerCPUArray:
			info.Entries = info.Capacity
		default:
			n, err := countKeys(m)
			if err != nil {
				return nil, fmt.Errorf("counting %s: %w", name, err)
			}
			info.Entries = n
		}
		out = append(out, info)
	}
	return out, nil
}

func countKeys(m *ebpf.Map) (int, error) {
	key := make([]byte, m.KeySize())
	n := 0
	var cur any // nil: the first key
	for {
		err := m.NextKey(cur, &key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
		cur = key
	}
}

// DumpMap decodes a map's entries; raw gives keys and values in hex as the
// kernel holds them.
func (d *Datapath) DumpMap(name string, raw bool) ([]Row, error) {
	m, ok := d.allMaps()[name]
	if !ok {
		return nil, fmt.Errorf("no map %q: `shunt map list` shows them", name)
	}
	dumper, ok := d.mapDumpers()[name]
	if !ok {
		return nil, fmt.Errorf("%s is a %s: its entries cannot be listed from user space", name, m.Type())
	}
	if !raw {
		return dumper()
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
		return Row{"prefix": fromIpcacheKey(k).String(), "identity": v.Identity}
	})
}

// ProtoName names an IP protocol number.
func ProtoName(p uint8) string {
	switch p {
	case 0:
		return "any"
	case 1:
		return "ICMP"
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// PortsText shows a policy key's protocol and port prefix: "80/TCP",
// "8000-8063/TCP", "all/UDP", "any".
func PortsText(k policy.Key) string {
	if k.Proto == 0 {
		return "any"
	}
	proto := ProtoName(k.Proto)
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

func ctFlagsText(f uint32) string {
	state := "opening"
	switch {
	case f&uint32(podtcCtFlagsCT_F_RST) != 0:
		state = "reset"
	case f&uint32(podtcCtFlagsCT_F_FIN_A) != 0 && f&uint32(podtcCtFlagsCT_F_FIN_B) != 0:
		state = "closed"
	case f&uint32(podtcCtFlagsCT_F_FIN_A|podtcCtFlagsCT_F_FIN_B) != 0:
		state = "closing"
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
	return float64((now - time.Duration(ns)).Milliseconds()) / 1000
}
