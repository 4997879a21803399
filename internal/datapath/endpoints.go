package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Endpoint is the desired shunt_endpoints entry of one local pod.
type Endpoint struct {
	IP      netip.Addr
	Ifindex int
	PodMAC  net.HardwareAddr
	NodeMAC net.HardwareAddr
}

// endpointKey keeps the address in network order: the C side compares it
// with iphdr->daddr.
func endpointKey(ip netip.Addr) podtcEndpointKey { return podtcEndpointKey{Ip4: be32(ip)} }

func endpointValue(e Endpoint) podtcEndpointInfo {
	v := podtcEndpointInfo{Ifindex: uint32(e.Ifindex)}
	copy(v.PodMac[:], e.PodMAC)
	copy(v.NodeMac[:], e.NodeMAC)
	return v
}

// SyncEndpoints makes shunt_endpoints hold exactly the desired entries:
// new and changed entries are written before stale ones are deleted, so no
// pod is ever missing from the map while it exists.
func (d *Datapath) SyncEndpoints(desired []Endpoint) error {
	want := make(map[podtcEndpointKey]podtcEndpointInfo, len(desired))
	for _, e := range desired {
		if !e.IP.Is4() {
			return fmt.Errorf("endpoint %s: only IPv4 pod addresses are supported", e.IP)
		}
		want[endpointKey(e.IP)] = endpointValue(e)
	}
	m := d.objs.ShuntEndpoints
	have := map[podtcEndpointKey]podtcEndpointInfo{}
	var k podtcEndpointKey
	var v podtcEndpointInfo
	it := m.Iterate()
	for it.Next(&k, &v) {
		have[k] = v
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading shunt_endpoints: %w", err)
	}
	for k, v := range want {
		if old, ok := have[k]; ok && old == v {
			continue
		}
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("writing shunt_endpoints (max %d entries): %w", m.MaxEntries(), err)
		}
	}
	for k := range have {
		if _, ok := want[k]; ok {
			continue
		}
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from shunt_endpoints: %w", err)
		}
	}
	return nil
}
