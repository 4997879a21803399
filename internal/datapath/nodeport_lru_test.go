package datapath

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/services"
)

// TestNodePortFullTableKeepsNewReplies: in a shunt_nodeport_nat full of
// flows in use (each of their entries looked up again since the LRU last
// moved it), a new NodePort flow to a local backend keeps its reply entry
// until its SYN-ACK, which comes after the next flow's SYN (one handshake
// in flight). The kernel's LRU evicts entries nobody looked up first: with
// every old entry in use, those were the entries just written for flows
// not answered yet, and each refill of the CPU's free nodes (every 128
// writes) took the reply entry of the flow in flight, whose SYN-ACK then
// left with the pod's address (bench/run nodeport's local collapse).
// lib/lru.h marks an entry used as it is written. One CPU, so that every
// write goes through the same LRU lists.
func TestNodePortFullTableKeepsNewReplies(t *testing.T) {
	d, ns, uplink := nodePortTestNode(t, 0)
	syncNodePortPods(t, d)
	if _, err := d.SyncServices([]services.Port{{Frontend: services.Frontend{VIP: npNode, Port: 30080, Proto: 6},
		Kind: services.KindNodePort, Name: "default/local:http", Backends: []services.Backend{{IP: npLocalPod, Port: 8080}}}}); err != nil {
		t.Fatal(err)
	}
	tableSize := int(d.objs.ShuntNodeportNat.MaxEntries())
	fromUplink, fromPod := d.uplink.ShuntFromUplink, d.objs.ShuntFromPod
	clientOf := func(i int) (netip.Addr, uint16) {
		return netip.AddrFrom4([4]byte{198, 18, byte(i >> 14), byte(i >> 6)}), uint16(20000 + i&0x3f)
	}
	run := func(p *ebpf.Program, pkt, ctx []byte) ([]byte, error) {
		out := make([]byte, len(pkt)+256)
		opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
		if ctx != nil {
			opts.Context = ctx
		}
		_, err := p.Run(opts)
		return out, err
	}
	fromClient := func(i int, flags byte) error {
		c, port := clientOf(i)
		_, err := run(fromUplink, withChecksum(packet(c, npNode, 6, tcpSegment(port, 30080, flags))), skbContext(uplink))
		return err
	}
	// fromBackend reports whether flow i's packet left with the frontend
	// as its source.
	fromBackend := func(i int, flags byte) (bool, error) {
		c, port := clientOf(i)
		out, err := run(fromPod, withChecksum(packet(npLocalPod, c, 6, tcpSegment(8080, port, flags))), nil)
		if err != nil {
			return false, err
		}
		src := netip.AddrFrom4([4]byte(out[14+12 : 14+16]))
		return src == npNode && binary.BigEndian.Uint16(out[14+20:]) == 30080, nil
	}
	inUse := tableSize / 2 // two entries a flow: the table full
	const measured = 6000  // new flows: under one turn of the LRU's active list
	var lost []int
	if err := netnsrun.Do(ns, func() error {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var one unix.CPUSet
		one.Set(0)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return err
		}
		for i := 0; i < inUse; i++ {
			if err := fromClient(i, tcpSYN); err != nil {
				return err
			}
			if _, err := fromBackend(i, tcpSYNACK); err != nil {
				return err
			}
			if err := fromClient(i, tcpACK); err != nil {
				return err
			}
		}
		// A packet each way of every flow: all of them in use.
		for i := 0; i < inUse; i++ {
			if err := fromClient(i, tcpACK); err != nil {
				return err
			}
			if _, err := fromBackend(i, tcpACK); err != nil {
				return err
			}
		}
		for i := inUse; i <= inUse+measured; i++ {
			if err := fromClient(i, tcpSYN); err != nil {
				return err
			}
			if i == inUse {
				continue
			}
			ok, err := fromBackend(i-1, tcpSYNACK)
			if err != nil {
				return err
			}
			if !ok {
				lost = append(lost, i-1)
			}
			if err := fromClient(i-1, tcpACK); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d new flows' SYN-ACKs left with the pod's address, their reply entry evicted (table of %d entries full of flows in use); first: flow %d",
			len(lost), measured, tableSize, lost[0])
	}
}
