package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/teardown"
)

// requireBPF skips tests that need root and a BPF-capable kernel.
func requireBPF(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_NET_ADMIN) to load BPF programs")
	}
}

// openTestDatapath loads the objects with pins in a private directory that
// the test removes afterwards.
func openTestDatapath(t *testing.T, mode Mode) *Datapath {
	t.Helper()
	return openChangedDatapath(t, mode, nil)
}

// openChangedDatapath is openTestDatapath with the specs changed before
// loading (see open).
func openChangedDatapath(t *testing.T, mode Mode, change func(*ebpf.CollectionSpec)) *Datapath {
	t.Helper()
	return openConfiguredDatapath(t, Config{Mode: mode}, change)
}

// openConfiguredDatapath opens a datapath of this configuration under a
// pin directory of the test's own, removed when the test ends.
func openConfiguredDatapath(t testing.TB, cfg Config, change func(*ebpf.CollectionSpec)) *Datapath {
	t.Helper()
	requireBPF(t)
	cfg = thisKernel(t, cfg)
	cfg.PinDir = testPinDir(t)
	d, err := open(cfg, change)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// testPinDir names a pin directory of the test's own on bpffs; everything
// pinned in it is removed when the test ends (after the test's own
// cleanups, which close what they opened). The name is the test's
// temporary directory's (test name + random suffix), unique across the
// test processes that run at the same time, not its last element ("001").
func testPinDir(t testing.TB) string {
	t.Helper()
	pinDir := filepath.Join("/sys/fs/bpf", "shunt-test-"+filepath.Base(filepath.Dir(t.TempDir())))
	t.Cleanup(func() {
		if err := teardown.Pins(pinDir); err != nil {
			t.Error(err)
		}
	})
	return pinDir
}

// ipv4Packet builds Ethernet + IPv4 + 8 bytes of UDP-ish payload.
func ipv4Packet(src, dst netip.Addr, ttl uint8) []byte {
	var b bytes.Buffer
	b.Write([]byte{0xaa, 0, 0, 0, 0, 1, 0xaa, 0, 0, 0, 0, 2, 0x08, 0x00}) // dst, src, IPv4
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 28)
	ip[8] = ttl
	ip[9] = 17
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	b.Write(ip)
	b.Write([]byte{0x30, 0x39, 0x00, 0x50, 0, 8, 0, 0})
	return b.Bytes()
}

// arpFrame builds an Ethernet ARP request from sender to target, as a pod
// sends it (broadcast, sender MAC 02:00:00:00:00:0b).
func arpFrame(sender, target netip.Addr) []byte {
	mac := []byte{0x02, 0, 0, 0, 0, 0x0b}
	b := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac...)
	b = append(b, 0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1) // Ethernet, IPv4, request
	s, t := sender.As4(), target.As4()
	b = append(append(b, mac...), s[:]...)
	b = append(append(b, make([]byte, 6)...), t[:]...)
	return b
}

// badARPFormat makes an ARP frame claim 8-byte hardware addresses, which
// no Ethernet device reads.
func badARPFormat(frame []byte) []byte {
	frame[14+4] = 8 // the Ethernet header, then ar_hrd and ar_pro
	return frame
}

// badIHL sets the IPv4 header length field to 4 words, which no valid packet has.
func badIHL(pkt []byte) []byte {
	pkt[14] = 0x44
	return pkt
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

const (
	tcActOK       = 0
	tcActShot     = 2
	tcActRedirect = 7
)

func TestFromPodVerdicts(t *testing.T) {
	for _, mode := range []Mode{ModeRedirectPeer, ModeRedirect} {
		t.Run(string(mode), func(t *testing.T) {
			d := openTestDatapath(t, mode)
			podMAC, _ := net.ParseMAC("02:00:00:00:00:0b")
			nodeMAC, _ := net.ParseMAC("02:00:00:00:00:0c")
			known := netip.MustParseAddr("10.99.0.11")
			src := netip.MustParseAddr("10.99.0.10")
			elsewhere := netip.MustParseAddr("10.99.0.12") // a pod behind another veth
			// Test runs see the packet arrive on lo (ifindex 1): the
			// sending pod's veth as far as the source check goes.
			if err := d.SyncPolicy(policy.State{}, []Endpoint{
				{IP: known, Ifindex: 1, PodMAC: podMAC, NodeMAC: nodeMAC},
				{IP: src, Ifindex: 1, PodMAC: podMAC, NodeMAC: nodeMAC},
				{IP: elsewhere, Ifindex: 1 << 20, PodMAC: podMAC, NodeMAC: nodeMAC},
			}); err != nil {
				t.Fatal(err)
			}

			cases := []struct {
				name    string
				pkt     []byte
				verdict uint32
			}{
				{"to local pod is redirected", ipv4Packet(src, known, 64), tcActRedirect},
				{"to unknown address goes to the stack", ipv4Packet(src, netip.MustParseAddr("192.0.2.9"), 64), tcActOK},
				{"ttl 1 goes to the stack for ICMP", ipv4Packet(src, known, 1), tcActOK},
				{"arp for the pod's own address passes", arpFrame(src, netip.MustParseAddr("10.99.0.1")), tcActOK},
				{"an arp probe (sender 0.0.0.0) passes", arpFrame(netip.IPv4Unspecified(), src), tcActOK},
				{"arp claiming an unknown address is dropped", arpFrame(netip.MustParseAddr("10.99.0.99"), netip.MustParseAddr("10.99.0.1")), tcActShot},
				{"arp claiming a pod's address from another veth is dropped", arpFrame(elsewhere, netip.MustParseAddr("10.99.0.1")), tcActShot},
				{"arp that is not Ethernet/IPv4 is dropped", badARPFormat(arpFrame(src, known)), tcActShot},
				{"ipv4 header length below 20 bytes is dropped", badIHL(ipv4Packet(src, known, 64)), tcActShot},
				{"a source that is not the pod's address is dropped", ipv4Packet(netip.MustParseAddr("10.99.0.99"), known, 64), tcActShot},
			}
			for _, c := range cases {
				ret, out, err := d.objs.ShuntFromPod.Test(c.pkt)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if ret != c.verdict {
					t.Errorf("%s: verdict %d, want %d", c.name, ret, c.verdict)
				}
				if ret != tcActRedirect {
					continue
				}
				if !bytes.Equal(out[0:6], podMAC) || !bytes.Equal(out[6:12], nodeMAC) {
					t.Errorf("%s: MACs not rewritten: dst %x src %x", c.name, out[0:6], out[6:12])
				}
				ip := out[14:34]
				if ip[8] != 63 {
					t.Errorf("%s: TTL %d, want 63", c.name, ip[8])
				}
				if ipChecksum(ip) != 0 {
					t.Errorf("%s: IPv4 header checksum invalid after TTL decrement", c.name)
				}
			}

			got := packetsByReason(t, d)
			want := map[string]uint64{"forwarded": 1, "to-stack": 1, "ttl-exceeded": 1, "not-ipv4": 2, "invalid-packet": 2, "spoofed": 1, "arp-spoofed": 2}
			for r, n := range want {
				if got[r] != n {
					t.Errorf("counter %s = %d, want %d (all: %v)", r, got[r], n, got)
				}
			}
		})
	}
}

func TestSyncPolicyEndpointsDiff(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	a := Endpoint{IP: netip.MustParseAddr("10.99.0.1"), Ifindex: 5, PodMAC: mac, NodeMAC: mac}
	b := Endpoint{IP: netip.MustParseAddr("10.99.0.2"), Ifindex: 6, PodMAC: mac, NodeMAC: mac}
	if err := d.SyncPolicy(policy.State{}, []Endpoint{a, b}); err != nil {
		t.Fatal(err)
	}
	b.Ifindex = 7
	if err := d.SyncPolicy(policy.State{}, []Endpoint{b}); err != nil {
		t.Fatal(err)
	}
	var v podtcEndpointInfo
	if err := d.objs.ShuntEndpoints.Lookup(endpointKey(a.IP), &v); err == nil {
		t.Errorf("stale endpoint %s still in map", a.IP)
	}
	if err := d.objs.ShuntEndpoints.Lookup(endpointKey(b.IP), &v); err != nil || v.Ifindex != 7 {
		t.Errorf("endpoint %s: %+v, %v; want ifindex 7", b.IP, v, err)
	}
	if n := countEntries(t, d.objs.ShuntEndpoints); n != 1 {
		t.Errorf("%d entries, want 1", n)
	}
}

func countEntries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var n int
	var k podtcEndpointKey
	var v podtcEndpointInfo
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// packetsByReason sums the datapath's packet counters per reason.
func packetsByReason(t *testing.T, d *Datapath) map[string]uint64 {
	t.Helper()
	counters, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, c := range counters {
		got[c.Reason] += c.Packets
	}
	return got
}
