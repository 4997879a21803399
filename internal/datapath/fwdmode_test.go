package datapath

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/services"
)

// TestNodePortForwardingModePerService: a Service's forwarding mode
// (annotation shunt.io/forwarding-mode, services.Port.Forwarding) holds
// over the node's: on a SNAT node the Service that asks for DSR is sent
// by DSR (IPIP to the backend's node, no reply entry here) while the
// others stay SNAT, and on a DSR node the Service that asks for SNAT is
// SNATed while the others go by DSR. UDP follows the Service's mode too.
func TestNodePortForwardingModePerService(t *testing.T) {
	const ipip = 4
	remote := []services.Backend{{IP: npRemotePod, Port: 8080}}
	for _, c := range []struct {
		node, service dpinfo.NodePortMode
	}{
		{dpinfo.NodePortSNAT, dpinfo.NodePortDSR},
		{dpinfo.NodePortDSR, dpinfo.NodePortSNAT},
		{dpinfo.NodePortHybrid, dpinfo.NodePortSNAT},
	} {
		t.Run(string(c.node)+" node, "+string(c.service)+" Service", func(t *testing.T) {
			d, fromOutside, _ := dsrNode(t, c.node)
			if _, err := d.SyncServices(append(dsrTestPorts(),
				services.Port{Frontend: services.Frontend{VIP: npNode, Port: 30090, Proto: 6}, Kind: services.KindNodePort,
					Name: "annotated", Backends: remote, Forwarding: c.service},
				services.Port{Frontend: services.Frontend{VIP: npNode, Port: 30091, Proto: 17}, Kind: services.KindNodePort,
					Name: "annotated-udp", Backends: []services.Backend{{IP: npRemotePod, Port: 5353}}, Forwarding: c.service},
			)); err != nil {
				t.Fatal(err)
			}
			rows, err := d.DumpMap("shunt_services", false)
			if err != nil {
				t.Fatal(err)
			}
			marked := map[string]any{}
			for _, r := range rows {
				if m, ok := r["forwarding"]; ok {
					marked[r["frontend"].(string)] = m
				}
			}
			if want := (map[string]any{fmt.Sprintf("%s:30090/TCP", npNode): string(c.service), fmt.Sprintf("%s:30091/UDP", npNode): string(c.service)}); !reflect.DeepEqual(marked, want) {
				t.Errorf("map dump shunt_services: forwarding %v, want %v (the annotated ports only)", marked, want)
			}
			// mode says how the SYN (or datagram) pkt went: DSR (IPIP),
			// or SNAT from the node's pod-network address.
			mode := func(pkt []byte) dpinfo.NodePortMode {
				t.Helper()
				ret, out := fromOutside(withChecksum(pkt))
				if ret != tcActRedirect {
					t.Fatalf("verdict %d, want redirect", ret)
				}
				if out[14+9] == ipip {
					return dpinfo.NodePortDSR
				}
				if got := checkedTuple(t, out); got.src != npSNAT || got.dst != npRemotePod {
					t.Fatalf("neither DSR nor SNAT: %+v", got)
				}
				return dpinfo.NodePortSNAT
			}
			if got := mode(packet(npClient, npNode, 6, tcpSegment(40001, 30090, tcpSYN))); got != c.service {
				t.Errorf("the annotated Service's TCP flow went by %s, want %s", got, c.service)
			}
			if got := mode(packet(npClient, npNode, 17, udpDatagram(40001, 30091))); got != c.service {
				t.Errorf("the annotated Service's UDP flow went by %s, want %s", got, c.service)
			}
			if got := mode(packet(npClient, npNode, 6, tcpSegment(40001, 30081, tcpSYN))); got == c.service {
				t.Errorf("the Service without annotation went by %s, want the node's mode %s", got, c.node)
			}
		})
	}
}

// TestNodePortTupleReused: a client that reuses its port for a new
// connection after the last one on the same tuple closed (FIN both
// ways) starts over: its SYN clears the closed flags in both entries of
// the flow, and the new connection, once answered, is an established one
// (nat_timeout: hours), not a closed one whose SNAT port another client
// may take a second later. Before, the new connection inherited
// fin-out|fin-in: idle one second, its port went to the next client and
// its replies to that client.
func TestNodePortTupleReused(t *testing.T) {
	const tcpFINACK = 0x11
	d, fromOutside, _ := dsrNode(t, dpinfo.NodePortSNAT)
	client := podtcTcNatKey{Saddr: be32(npClient), Daddr: be32(npNode), Sport: be16(40011), Dport: be16(30081), Proto: 6}
	var reply podtcTcNatKey
	flags := func(k podtcTcNatKey) uint32 {
		t.Helper()
		var v uplinktcNodeportNatValue
		if err := d.objs.ShuntNodeportNat.Lookup(k, &v); err != nil {
			t.Fatalf("entry %+v: %v", k, err)
		}
		return v.Flags
	}
	send := func(what string, pkt []byte) tuple {
		t.Helper()
		ret, out := fromOutside(withChecksum(pkt))
		if ret != tcActRedirect {
			t.Fatalf("%s: verdict %d, want redirect", what, ret)
		}
		return checkedTuple(t, out)
	}
	connect := func() {
		t.Helper()
		sent := send("the client's SYN", packet(npClient, npNode, 6, tcpSegment(40011, 30081, tcpSYN)))
		if sent.src != npSNAT {
			t.Fatalf("SYN sent as %+v, want from %s", sent, npSNAT)
		}
		reply = podtcTcNatKey{Saddr: be32(npRemotePod), Daddr: be32(npSNAT), Sport: be16(8080), Dport: be16(sent.sport), Proto: 6}
		if got, want := send("the SYN-ACK", packet(npRemotePod, npSNAT, 6, tcpSegment(8080, sent.sport, tcpSYNACK))), (tuple{npNode, npClient, 30081, 40011}); got != want {
			t.Fatalf("SYN-ACK delivered as %+v, want %+v", got, want)
		}
	}
	reset := uint32(uplinktcMasqFlagsMASQ_F_FIN_OUT | uplinktcMasqFlagsMASQ_F_FIN_IN | uplinktcMasqFlagsMASQ_F_RST)
	established := uint32(uplinktcMasqFlagsMASQ_F_REPLY_SEEN)

	connect()
	send("the client's FIN", packet(npClient, npNode, 6, tcpSegment(40011, 30081, tcpFINACK)))
	send("the backend's FIN", packet(npRemotePod, npSNAT, 6, tcpSegment(8080, fromBe16(reply.Dport), tcpFINACK)))
	for _, k := range []podtcTcNatKey{client, reply} {
		if f := flags(k); f&reset == 0 {
			t.Fatalf("after FIN both ways, entry %+v has flags %#x: want it closed", k, f)
		}
	}
	firstPort := reply.Dport
	connect()
	if reply.Dport != firstPort {
		t.Errorf("the new connection got SNAT port %d, want the tuple's %d", fromBe16(reply.Dport), fromBe16(firstPort))
	}
	for _, k := range []podtcTcNatKey{client, reply} {
		if f := flags(k); f != established {
			t.Errorf("after the new SYN and its SYN-ACK, entry %+v has flags %#x: want reply-seen only (established, open)", k, f)
		}
	}

	// The other SNAT port is held by a second client's live connection;
	// a third client a second later finds no port to take: the new
	// connection holds its own.
	send("the second client's SYN", packet(netip.MustParseAddr("192.0.2.10"), npNode, 6, tcpSegment(40011, 30081, tcpSYN)))
	time.Sleep(1100 * time.Millisecond)
	if ret, out := fromOutside(withChecksum(packet(netip.MustParseAddr("192.0.2.11"), npNode, 6, tcpSegment(40011, 30081, tcpSYN)))); ret != tcActShot {
		t.Errorf("a third client a second later: verdict %d, %+v; want drop (masq-port-exhausted): the reused tuple's connection is open",
			ret, checkedTuple(t, out))
	}
	if got, want := send("the reused connection's data", packet(npRemotePod, npSNAT, 6, tcpSegment(8080, fromBe16(firstPort), tcpACK))),
		(tuple{npNode, npClient, 30081, 40011}); got != want {
		t.Errorf("its reply delivered as %+v, want %+v", got, want)
	}
}

// TestMasqueradeTupleReused: as TestNodePortTupleReused for the
// masquerade: a pod reusing its port towards the same destination after
// the last connection on the tuple closed starts the flow's flags over
// in both entries (the same port, an open connection).
func TestMasqueradeTupleReused(t *testing.T) {
	const tcpFINACK = 0x11
	d := openMasqDatapath(t, nil)
	var port uint16 // the flow's port on the node
	run := func(what string, out bool, pkt []byte) tuple {
		t.Helper()
		prog, want := d.uplink.ShuntFromUplink, uint32(tcActRedirect)
		if out {
			prog, want = d.uplink.ShuntToUplink, tcActOK
		}
		ret, got, err := prog.Test(withChecksum(pkt))
		if err != nil || ret != want {
			t.Fatalf("%s: verdict %d, %v; want %d", what, ret, err, want)
		}
		return checkedTuple(t, got)
	}
	flagsOf := func() (uint32, uint32) {
		t.Helper()
		outKey := uplinktcMasqKey{Saddr: be32(mqPod), Daddr: be32(mqOutside), Sport: be16(40020), Dport: be16(443), Proto: 6}
		inKey := uplinktcMasqKey{Saddr: be32(mqOutside), Daddr: be32(mqNode), Sport: be16(443), Dport: be16(port), Proto: 6, Dir: uint8(uplinktcMasqDirMASQ_IN)}
		var o, i uplinktcMasqValue
		if err := d.uplink.ShuntMasqNat.Lookup(outKey, &o); err != nil {
			t.Fatalf("the pod's entry: %v", err)
		}
		if err := d.uplink.ShuntMasqNat.Lookup(inKey, &i); err != nil {
			t.Fatalf("the reply's entry: %v", err)
		}
		return o.Flags, i.Flags
	}
	connect := func() {
		t.Helper()
		got := run("SYN", true, packet(mqPod, mqOutside, 6, tcpSegment(40020, 443, tcpSYN)))
		if got.src != mqNode || (port != 0 && got.sport != port) {
			t.Fatalf("SYN sent as %+v, want from %s (port %d: the tuple's)", got, mqNode, port)
		}
		port = got.sport
		run("SYN-ACK", false, packet(mqOutside, mqNode, 6, tcpSegment(443, port, tcpSYNACK)))
	}
	connect()
	run("the pod's FIN", true, packet(mqPod, mqOutside, 6, tcpSegment(40020, 443, tcpFINACK)))
	run("the outside's FIN", false, packet(mqOutside, mqNode, 6, tcpSegment(443, port, tcpFINACK)))
	closed := uint32(uplinktcMasqFlagsMASQ_F_FIN_OUT | uplinktcMasqFlagsMASQ_F_FIN_IN)
	if o, i := flagsOf(); o&closed != closed || i&closed != closed {
		t.Fatalf("after FIN both ways: flags %#x and %#x, want fin-out|fin-in in both", o, i)
	}
	connect()
	established := uint32(uplinktcMasqFlagsMASQ_F_REPLY_SEEN)
	if o, i := flagsOf(); o != established || i != established {
		t.Errorf("after the new SYN and its SYN-ACK: flags %#x and %#x, want reply-seen only in both (open)", o, i)
	}
}
