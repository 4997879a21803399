package datapath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/shuntnet/shunt/internal/policy"
)

// TestFromPodToTunnel runs shunt_from_pod on packets for pods of another
// node (ipcache entries with a tunnel endpoint): encapsulated after the
// sender's egress policy, one hop, counted to-tunnel; left to the stack
// when the node has no overlay. Test runs never perform the redirect, so
// any non-zero tunnel ifindex will do; the real device is exercised by
// TestOverlayTwoNodes.
func TestFromPodToTunnel(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	a, b := netip.MustParseAddr("10.99.0.10"), netip.MustParseAddr("10.99.0.11")
	noID := netip.MustParseAddr("10.99.0.12")                                              // a local pod without an identity yet
	remote, denied := netip.MustParseAddr("10.98.0.20"), netip.MustParseAddr("10.98.0.21") // pods of another node
	node2 := netip.MustParseAddr("172.31.0.2")                                             // its underlay address
	const idA, idB, idRemote, idDenied = 300, 301, 400, 401
	endpoints := []Endpoint{ // test runs see packets on lo: every pod's "veth" is ifindex 1
		{IP: a, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idA},
		{IP: b, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idB, EgressRules: true},
		{IP: noID, Ifindex: 1, PodMAC: mac, NodeMAC: mac},
	}
	state := policy.State{
		IPCache: []policy.PrefixIdentity{
			{Prefix: netip.PrefixFrom(a, 32), Identity: idA}, {Prefix: netip.PrefixFrom(b, 32), Identity: idB},
			{Prefix: netip.PrefixFrom(remote, 32), Identity: idRemote, Tunnel: node2},
			{Prefix: netip.PrefixFrom(denied, 32), Identity: idDenied, Tunnel: node2},
		},
		Entries: []policy.Entry{{Key: policy.Key{Endpoint: b, Egress: true, Identity: idDenied}, Verdict: policy.VerdictDeny, RuleID: 9}},
	}

	t.Run("overlay", func(t *testing.T) {
		d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, TunnelIfindex: 1, NodeIP: testNodeIP}, nil)
		if err := d.SyncPolicy(state, endpoints); err != nil {
			t.Fatal(err)
		}
		before := counts(t, d)
		cases := []struct {
			name    string
			pkt     []byte
			verdict uint32
		}{
			{"to a pod of another node: encapsulated", packet(a, remote, 6, tcpSegment(40000, 80, tcpSYN)), tcActRedirect},
			{"the sender's egress denies the remote pod's identity", packet(b, denied, 6, tcpSegment(40001, 80, tcpSYN)), tcActShot},
			{"the same sender to another remote pod", packet(b, remote, 6, tcpSegment(40002, 80, tcpSYN)), tcActRedirect},
			{"ttl 1 goes to the stack for ICMP", ipv4Packet(a, remote, 1), tcActOK},
			{"a sender without an identity has no VNI", packet(noID, remote, 6, tcpSegment(40003, 80, tcpSYN)), tcActShot},
			{"a local pod is still forwarded locally", packet(a, b, 6, tcpSegment(40004, 80, tcpSYN)), tcActRedirect},
			{"an address without a tunnel goes to the stack", ipv4Packet(a, netip.MustParseAddr("192.0.2.9"), 64), tcActOK},
		}
		for _, c := range cases {
			ret, out, err := d.objs.ShuntFromPod.Test(c.pkt)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if ret != c.verdict {
				t.Errorf("%s: verdict %d, want %d", c.name, ret, c.verdict)
			}
			if ret == tcActRedirect {
				if ip := out[14:34]; ip[8] != 63 || ipChecksum(ip) != 0 {
					t.Errorf("%s: TTL %d (want 63) or IPv4 checksum invalid after the hop", c.name, ip[8])
				}
			}
		}
		counterDelta(t, d, before, map[string]uint64{
			"to-tunnel/from-pod": 2, "policy-denied/from-pod": 1, "ttl-exceeded/from-pod": 1,
			"tunnel-key-failed/from-pod": 1, "forwarded/from-pod": 1, "to-stack/from-pod": 1,
		})
	})

	t.Run("no overlay", func(t *testing.T) {
		d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer}, nil)
		if err := d.SyncPolicy(state, endpoints); err != nil {
			t.Fatal(err)
		}
		before := counts(t, d)
		ret, _, err := d.objs.ShuntFromPod.Test(packet(a, remote, 6, tcpSegment(40000, 80, tcpSYN)))
		if err != nil {
			t.Fatal(err)
		}
		if ret != tcActOK {
			t.Errorf("tunnel ifindex 0: verdict %d, want %d (the host stack)", ret, tcActOK)
		}
		counterDelta(t, d, before, map[string]uint64{"to-stack/from-pod": 1, "to-tunnel/from-pod": 0})
	})
}

// TestFromOverlayNeedsTunnelKey: a packet that did not come out of a
// collect-metadata device (no tunnel key: here a test run) carries no
// sender identity and is dropped. The anti-spoofing rules themselves need
// real tunnel metadata, which test runs cannot give: TestOverlayTwoNodes
// checks them.
func TestFromOverlayNeedsTunnelKey(t *testing.T) {
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, TunnelIfindex: 1, NodeIP: testNodeIP}, nil)
	before := counts(t, d)
	pkt := packet(netip.MustParseAddr("10.98.0.20"), netip.MustParseAddr("10.99.0.10"), 6, tcpSegment(40000, 80, tcpSYN))
	ret, _, err := d.overlay.ShuntFromOverlay.Test(pkt)
	if err != nil {
		t.Fatal(err)
	}
	if ret != tcActShot {
		t.Errorf("verdict %d, want %d", ret, tcActShot)
	}
	arp := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xaa, 0, 0, 0, 0, 2, 0x08, 0x06}, make([]byte, 28)...)
	if ret, _, err := d.overlay.ShuntFromOverlay.Test(arp); err != nil || ret != tcActOK {
		t.Errorf("ARP: verdict %d, %v; want %d", ret, err, tcActOK)
	}
	counterDelta(t, d, before, map[string]uint64{"tunnel-key-failed/from-overlay": 1, "not-ipv4/from-overlay": 1})
}

// TestIPCacheTunnel: the tunnel endpoint is written into the ipcache
// value, shown by the map dump, and refused when it is no IPv4 address.
func TestIPCacheTunnel(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	remote := netip.MustParsePrefix("10.98.0.20/32")
	state := policy.State{IPCache: []policy.PrefixIdentity{
		{Prefix: remote, Identity: 400, Tunnel: netip.MustParseAddr("172.31.0.2")},
		{Prefix: netip.MustParsePrefix("10.99.0.1/32"), Identity: policy.IdentityHost},
	}}
	if err := d.SyncPolicy(state, nil); err != nil {
		t.Fatal(err)
	}
	rows, err := d.DumpMap("shunt_ipcache", false)
	if err != nil {
		t.Fatal(err)
	}
	tunnels := map[string]any{}
	for _, r := range rows {
		tunnels[r["prefix"].(string)] = r["tunnel"]
	}
	if tunnels["10.98.0.20/32"] != "172.31.0.2" || tunnels["10.99.0.1/32"] != nil {
		t.Errorf("dump: tunnels %v, want 172.31.0.2 for 10.98.0.20/32 and none for the node address", tunnels)
	}
	for _, bad := range []string{"fd00::2", "0.0.0.0"} {
		state.IPCache[0].Tunnel = netip.MustParseAddr(bad)
		if err := d.SyncPolicy(state, nil); err == nil {
			t.Errorf("tunnel endpoint %s accepted", bad)
		}
	}
}
