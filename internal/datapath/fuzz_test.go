package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/policy"
)

// FuzzDecodeFlow: any bytes from the flow ring decode to a flow or an
// error, never a panic (enum values out of range included).
func FuzzDecodeFlow(f *testing.F) {
	f.Add(make([]byte, 96))
	f.Add([]byte{1, 2, 3})
	full := make([]byte, 256)
	for i := range full {
		full[i] = 0xff
	}
	f.Add(full)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if fl, err := decodeFlow(raw, time.Unix(0, 0)); err == nil && fl.Verdict == "" {
			t.Fatalf("decoded flow without a verdict name: %+v", fl)
		}
	})
}

// FuzzPodPrograms runs the tc programs of the pod interfaces and of the
// overlay device on arbitrary frames (BPF_PROG_TEST_RUN): truncated
// headers, IPv4 options, fragments, bad lengths, IPv6, VLAN tags, ICMP
// errors quoting anything, packets for a pod of another node (encapsulated;
// test runs carry no tunnel key, so the overlay program stops at it). A program
// the verifier accepted must still answer every frame with a verdict it
// is meant to give (pass, drop, redirect) and never fail to run.
func FuzzPodPrograms(f *testing.F) {
	d := openFuzzDatapath(f)
	podMAC, _ := net.ParseMAC("02:00:00:00:00:0b")
	nodeMAC, _ := net.ParseMAC("02:00:00:00:00:0c")
	a, b := netip.MustParseAddr("10.99.0.10"), netip.MustParseAddr("10.99.0.11")
	remote := netip.MustParseAddr("10.98.0.20")
	state := policy.State{IPCache: []policy.PrefixIdentity{
		{Prefix: netip.PrefixFrom(remote, 32), Identity: 400, Tunnel: netip.MustParseAddr("172.31.0.2")},
	}}
	if err := d.SyncPolicy(state, []Endpoint{
		{IP: a, Ifindex: 1, PodMAC: podMAC, NodeMAC: nodeMAC, Identity: 300},
		{IP: b, Ifindex: 1, PodMAC: podMAC, NodeMAC: nodeMAC, Identity: 301},
	}); err != nil {
		f.Fatal(err)
	}
	f.Add(ipv4Packet(a, b, 64))
	f.Add(tcpPacket(a, 40000, remote, 80))
	f.Add(ipv4Packet(a, b, 1))
	f.Add(badIHL(ipv4Packet(a, b, 64)))
	f.Add(tcpPacket(a, 40000, b, 80))
	f.Add(append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xaa, 0, 0, 0, 0, 2, 0x08, 0x06}, make([]byte, 28)...))
	f.Add(append([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0x81, 0x00, 0, 1, 0x08, 0x00}, ipv4Packet(a, b, 64)[14:]...)) // VLAN
	f.Add(append([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0x86, 0xdd}, make([]byte, 60)...))                            // IPv6
	// The uplink's: a pod's flow to outside, and what comes back to the node.
	world := netip.MustParseAddr("198.51.100.7")
	f.Add(withChecksum(packet(a, world, 17, udpDatagram(5353, 53))))
	f.Add(withChecksum(packet(world, fuzzNode, 17, udpDatagram(53, 61000))))
	f.Add(withChecksum(packet(world, fuzzNode, 1, icmpUnreachable(withChecksum(packet(fuzzNode, world, 17, udpDatagram(61000, 53)))))))
	f.Fuzz(func(t *testing.T, frame []byte) {
		if testRunRefuses(frame) {
			return
		}
		for name, prog := range map[string]interface {
			Test([]byte) (uint32, []byte, error)
		}{"from_pod": d.objs.ShuntFromPod, "to_pod": d.objs.ShuntToPod, "from_overlay": d.overlay.ShuntFromOverlay,
			"to_uplink": d.uplink.ShuntToUplink, "from_uplink": d.uplink.ShuntFromUplink} {
			ret, _, err := prog.Test(frame)
			if err != nil {
				t.Fatalf("%s: test run: %v", name, err)
			}
			if ret != tcActOK && ret != tcActShot && ret != tcActRedirect {
				t.Fatalf("%s: verdict %d on %x", name, ret, frame)
			}
		}
	})
}

// testRunRefuses: frames BPF_PROG_TEST_RUN will not run a program on
// (EINVAL before the program starts, measured on 6.18): less than an
// Ethernet header, more than fits one page with the skb's head and tail
// room (3 712 bytes), or an IPv4 or IPv6 EtherType with less than that
// header behind it. Larger frames are GSO or jumbo frames, which the
// programs read no differently. A short frame does reach tc on a real interface, where
// ipv4_header's bounds checks drop it (and the verifier proved no read
// passes the frame's end); the test run just cannot feed it.
func testRunRefuses(frame []byte) bool {
	if len(frame) < 14 || len(frame) > 3712 {
		return true
	}
	switch uint16(frame[12])<<8 | uint16(frame[13]) {
	case 0x0800:
		return len(frame) < 14+20
	case 0x86dd:
		return len(frame) < 14+40
	}
	return false
}

// fuzzNode is the fuzzed node's address: what it masquerades pods' flows to.
var fuzzNode = netip.MustParseAddr("172.31.0.1")

// openFuzzDatapath loads the programs once per fuzzing process, with an
// overlay (test runs never perform the redirect: any ifindex will do) and
// the masquerade.
func openFuzzDatapath(f *testing.F) *Datapath {
	f.Helper()
	return openConfiguredDatapath(f, Config{Mode: ModeRedirectPeer, TunnelIfindex: 1, NodeIP: testNodeIP,
		Masquerade: &Masquerade{Addr: fuzzNode, Ports: dpinfo.DefaultMasqPorts}}, nil)
}
