package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/services"
)

// TestNodePortFullTableKeepsNewReplies: a NodePort flow to a local backend
// keeps its reply entry until its SYN-ACK in a full shunt_nodeport_nat,
// as a busy node's table is: one outside client cycling through its
// ports to three NodePorts in turn (as bench/run nodeport's client does,
// ports reused within seconds), the client's packets on one CPU and the
// backends' on the other, as on a node, a few handshakes in flight. An
// entry the LRU takes anyway is written again and counted (lib/lru.h):
// either way no SYN-ACK may leave with the pod's address.
func TestNodePortFullTableKeepsNewReplies(t *testing.T) {
	d, ns, uplink := nodePortTestNode(t, 0)
	syncNodePortPods(t, d)
	frontendPorts := []uint16{30080, 30081, 30082}
	var svcs []services.Port
	for _, fp := range frontendPorts {
		svcs = append(svcs, services.Port{Frontend: services.Frontend{VIP: npNode, Port: fp, Proto: 6},
			Kind: services.KindNodePort, Name: fmt.Sprintf("default/local-%d:http", fp), Backends: []services.Backend{{IP: npLocalPod, Port: 8080}}})
	}
	if _, err := d.SyncServices(svcs); err != nil {
		t.Fatal(err)
	}
	max := int(d.objs.ShuntNodeportNat.MaxEntries())
	fromUplink, fromPod := d.uplink.ShuntFromUplink, d.objs.ShuntFromPod
	client := netip.MustParseAddr("198.18.0.1")
	run := func(p *ebpf.Program, pkt []byte, ctx []byte) ([]byte, error) {
		out := make([]byte, len(pkt)+256)
		opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
		if ctx != nil {
			opts.Context = ctx
		}
		_, err := p.Run(opts)
		return out, err
	}
	toFrontend := func(port, fp uint16, flags byte) error {
		_, err := run(fromUplink, withChecksum(packet(client, npNode, 6, tcpSegment(port, fp, flags))), skbContext(uplink))
		return err
	}
	// reply reports whether the backend's packet left with the frontend
	// as its source.
	reply := func(port, fp uint16, flags byte) (bool, error) {
		out, err := run(fromPod, withChecksum(packet(npLocalPod, client, 6, tcpSegment(8080, port, flags))), nil)
		if err != nil {
			return false, err
		}
		src := netip.AddrFrom4([4]byte(out[14+12 : 14+16]))
		return src == npNode && binary.BigEndian.Uint16(out[14+20:]) == fp, nil
	}
	const clientPorts = 40000 // ports × (frontends + 1) entries: past the table's size
	lost := map[uint16]int{}
	flows := 0
	pin := func(cpu int) error {
		runtime.LockOSThread()
		var one unix.CPUSet
		one.Set(cpu)
		return unix.SchedSetaffinity(0, &one)
	}
	type pending struct{ port, fp uint16 }
	handshakes := make(chan pending, 4)
	acks := make(chan pending, 1<<20)
	errs := make(chan error, 2)
	// CPU 1: the backends' answers, as the pods' side of the node.
	go func() {
		errs <- netnsrun.Do(ns, func() error {
			defer runtime.UnlockOSThread()
			if err := pin(1); err != nil {
				return err
			}
			defer close(acks)
			for h := range handshakes {
				ok, err := reply(h.port, h.fp, tcpSYNACK)
				if err != nil {
					return err
				}
				flows++
				if !ok {
					lost[h.fp]++
				}
				if _, err := reply(h.port, h.fp, tcpACK|0x01); err != nil {
					return err
				}
				acks <- h
			}
			return nil
		})
	}()
	// CPU 0: the client's packets, as the uplink's side.
	go func() {
		errs <- netnsrun.Do(ns, func() error {
			defer runtime.UnlockOSThread()
			if err := pin(0); err != nil {
				return err
			}
			defer close(handshakes)
			for round := 0; round < 4; round++ {
				fp := frontendPorts[round%len(frontendPorts)]
				for i := 0; i < clientPorts; i++ {
					port := uint16(1024 + i)
					if err := toFrontend(port, fp, tcpSYN); err != nil {
						return err
					}
					handshakes <- pending{port, fp}
				drain:
					for {
						select {
						case h := <-acks:
							if err := toFrontend(h.port, h.fp, tcpACK); err != nil {
								return err
							}
							if err := toFrontend(h.port, h.fp, tcpACK|0x01); err != nil {
								return err
							}
						default:
							break drain
						}
					}
				}
			}
			return nil
		})
	}()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if len(lost) > 0 {
		t.Errorf("SYN-ACKs that left untranslated (their reply entry gone), by NodePort: %v, of %d flows (table of %d)", lost, flows, max)
	}
}
