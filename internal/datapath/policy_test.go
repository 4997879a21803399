package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/shuntnet/shunt/internal/policy"
)

// packet builds Ethernet + IPv4 + an L4 payload with a valid IPv4 checksum.
func packet(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0xaa, 0, 0, 0, 0, 1, 0xaa, 0, 0, 0, 0, 2, 0x08, 0x00})
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	ip[8], ip[9] = 64, proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	b.Write(ip)
	b.Write(l4)
	return b.Bytes()
}

func tcpSegment(sport, dport uint16, flags byte) []byte {
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	tcp[12], tcp[13] = 5<<4, flags
	return tcp
}

func udpDatagram(sport, dport uint16) []byte {
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], 8)
	return udp
}

// icmpUnreachable quotes the packet (IPv4 header + 8 bytes) it reports.
func icmpUnreachable(quoted []byte) []byte {
	return append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, quoted[14:14+28]...)
}

// icmpFragNeeded is fragmentation needed (next-hop MTU mtu) quoting the
// first 28 bytes of the packet quoted (IPv4 and UDP headers).
func icmpFragNeeded(quoted []byte, mtu uint16) []byte {
	return append([]byte{3, 4, 0, 0, 0, 0, byte(mtu >> 8), byte(mtu)}, quoted[14:14+28]...)
}

const (
	tcpSYN    = 0x02
	tcpSYNACK = 0x12
	tcpACK    = 0x10
)

// TestPolicyVerdicts runs the pod programs on crafted packets against a
// small policy: egress and ingress isolation, identities, CIDR identities,
// port ranges, deny winning over allow, connection tracking for replies and
// ICMP errors, the node always reaching a pod, and the drop reasons.
func TestPolicyVerdicts(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	a, b, c := netip.MustParseAddr("10.99.0.10"), netip.MustParseAddr("10.99.0.11"), netip.MustParseAddr("10.99.0.12")
	node := netip.MustParseAddr("10.99.0.1")
	world, inCIDR := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("192.0.2.5")
	const idA, idB, idC, idCIDR = 300, 301, 302, policy.FirstCIDRIdentity
	endpoints := []Endpoint{ // test runs see packets on lo: every pod's "veth" is ifindex 1
		{IP: a, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idA, IngressIsolated: true, EgressIsolated: true},
		{IP: b, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idB, IngressIsolated: true},
		{IP: c, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idC, IngressRules: true}, // deny-only
	}
	key := func(ep netip.Addr, egress bool, id uint32, proto uint8, port uint16, bits uint8) policy.Key {
		return policy.Key{Endpoint: ep, Egress: egress, Identity: id, Proto: proto, Port: port, PortBits: bits}
	}
	state := policy.State{
		IPCache: []policy.PrefixIdentity{
			{Prefix: netip.PrefixFrom(a, 32), Identity: idA}, {Prefix: netip.PrefixFrom(b, 32), Identity: idB}, {Prefix: netip.PrefixFrom(c, 32), Identity: idC},
			{Prefix: netip.PrefixFrom(node, 32), Identity: policy.IdentityHost},
		},
		CIDRIdentities: []policy.PrefixIdentity{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Identity: idCIDR}},
		Entries: []policy.Entry{
			{Key: key(a, true, idB, 6, 80, 16), Verdict: policy.VerdictAllow, RuleID: 1},
			{Key: key(a, true, policy.IdentityAny, 17, 53, 16), Verdict: policy.VerdictAllow, RuleID: 2},
			{Key: key(a, true, idCIDR, 6, 0, 0), Verdict: policy.VerdictAllow, RuleID: 3},
			{Key: key(a, true, policy.IdentityAny, 6, 6000, 15), Verdict: policy.VerdictDeny, RuleID: 4}, // 6000-6001
			{Key: key(a, true, idB, 6, 0, 0), Verdict: policy.VerdictAllow, RuleID: 5},
			{Key: key(b, false, idA, 6, 80, 16), Verdict: policy.VerdictAllow, RuleID: 6},
			{Key: key(b, false, idA, 6, 6000, 16), Verdict: policy.VerdictAllow, RuleID: 6},
			{Key: key(b, false, idA, 6, 7000, 16), Verdict: policy.VerdictAllow, RuleID: 6},
			{Key: key(b, false, policy.IdentityHost, 0, 0, 0), Verdict: policy.VerdictAllow, RuleID: 7},
			{Key: key(c, false, policy.IdentityWorld, 6, 8443, 16), Verdict: policy.VerdictDeny, RuleID: 8},
		},
	}
	if err := d.SyncPolicy(state, endpoints); err != nil {
		t.Fatal(err)
	}

	fromPod, toPod := d.objs.ShuntFromPod, d.objs.ShuntToPod
	synAB := packet(a, b, 6, tcpSegment(40000, 80, tcpSYN))
	udpOut := packet(a, world, 17, udpDatagram(40001, 53))
	cases := []struct {
		name    string
		hook    string // from-pod or to-pod
		pkt     []byte
		verdict uint32
	}{
		{"a->b tcp/80: a's egress and b's ingress allow", "from-pod", synAB, tcActRedirect},
		{"b->a reply of that connection passes a's ingress isolation", "from-pod", packet(b, a, 6, tcpSegment(80, 40000, tcpSYNACK)), tcActRedirect},
		{"b->a new connection: a is isolated for ingress with no rule", "from-pod", packet(b, a, 6, tcpSegment(40002, 22, tcpSYN)), tcActShot},
		{"c->b tcp/80: b's ingress allows only a", "from-pod", packet(c, b, 6, tcpSegment(40003, 80, tcpSYN)), tcActShot},
		{"a->c: a's egress does not allow c", "from-pod", packet(a, c, 6, tcpSegment(40004, 80, tcpSYN)), tcActShot},
		{"a->192.0.2.5 tcp/443: allowed by the CIDR identity", "from-pod", packet(a, inCIDR, 6, tcpSegment(40005, 443, tcpSYN)), tcActOK},
		{"a->world udp/53: allowed to any peer", "from-pod", udpOut, tcActOK},
		{"a->world udp/54: not allowed", "from-pod", packet(a, world, 17, udpDatagram(40006, 54)), tcActShot},
		{"a->b tcp/6001: the deny for any peer wins over b's allow", "from-pod", packet(a, b, 6, tcpSegment(40007, 6001, tcpSYN)), tcActShot},
		{"a->b tcp/7000: b's any-port allow", "from-pod", packet(a, b, 6, tcpSegment(40008, 7000, tcpSYN)), tcActRedirect},
		{"c->a non-isolated sender, isolated receiver", "from-pod", packet(c, a, 17, udpDatagram(40009, 53)), tcActShot},
		{"c->world: c is not isolated", "from-pod", packet(c, world, 6, tcpSegment(40010, 80, tcpSYN)), tcActOK},
		{"node->b: the node always reaches a pod", "to-pod", packet(node, b, 6, tcpSegment(40011, 22, tcpSYN)), tcActOK},
		{"world->b: b's ingress does not allow it", "to-pod", packet(world, b, 6, tcpSegment(40012, 80, tcpSYN)), tcActShot},
		{"world->a: ICMP error about a's udp flow is related", "to-pod", packet(world, a, 1, icmpUnreachable(udpOut)), tcActOK},
		{"world->a: ICMP error about nothing a sent", "to-pod", packet(world, a, 1, icmpUnreachable(packet(a, world, 17, udpDatagram(1, 2)))), tcActShot},
		{"world->c: c is not isolated", "to-pod", packet(world, c, 6, tcpSegment(40013, 80, tcpSYN)), tcActOK},
		{"world->c:8443: c's deny-only rule applies without isolation", "to-pod", packet(world, c, 6, tcpSegment(40014, 8443, tcpSYN)), tcActShot},
	}
	for _, tc := range cases {
		prog := fromPod
		if tc.hook == "to-pod" {
			prog = toPod
		}
		ret, _, err := prog.Test(tc.pkt)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if ret != tc.verdict {
			t.Errorf("%s: verdict %d, want %d", tc.name, ret, tc.verdict)
		}
	}

	got := packetsByReason(t, d)
	if got["policy-denied"] != 2 || got["policy-not-allowed"] != 7 {
		t.Errorf("drop counters: denied %d (want 2), not allowed %d (want 7); all %v",
			got["policy-denied"], got["policy-not-allowed"], got)
	}
}

// TestPolicyChangeAndCapacity: a changed policy applies to new connections,
// established ones keep flowing, and a policy that does not fit is refused
// with the map named while the previous one stays in force.
func TestPolicyChangeAndCapacity(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	a, b := netip.MustParseAddr("10.99.0.10"), netip.MustParseAddr("10.99.0.11")
	eps := []Endpoint{
		{IP: a, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300},
		{IP: b, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 301, IngressIsolated: true},
	}
	allow := policy.State{Entries: []policy.Entry{
		{Key: policy.Key{Endpoint: b, Identity: 300, Proto: 6, Port: 80, PortBits: 16}, Verdict: policy.VerdictAllow, RuleID: 1},
	}}
	if err := d.SyncPolicy(allow, eps); err != nil {
		t.Fatal(err)
	}
	run := func(pkt []byte) uint32 {
		t.Helper()
		ret, _, err := d.objs.ShuntFromPod.Test(pkt)
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	if v := run(packet(a, b, 6, tcpSegment(41000, 80, tcpSYN))); v != tcActRedirect {
		t.Fatalf("allowed connection: verdict %d", v)
	}
	if err := d.SyncPolicy(policy.State{}, eps); err != nil { // b isolated, nothing allowed
		t.Fatal(err)
	}
	if v := run(packet(a, b, 6, tcpSegment(41000, 80, tcpACK))); v != tcActRedirect {
		t.Errorf("established connection after the policy change: verdict %d, want it to keep flowing", v)
	}
	if v := run(packet(a, b, 6, tcpSegment(41001, 80, tcpSYN))); v != tcActShot {
		t.Errorf("new connection after the allow was removed: verdict %d, want drop", v)
	}

	if err := d.SyncPolicy(allow, eps); err != nil {
		t.Fatal(err)
	}
	huge := policy.State{}
	for i := 0; i <= int(d.objs.ShuntPolicy.MaxEntries()); i++ {
		huge.Entries = append(huge.Entries, policy.Entry{
			Key: policy.Key{Endpoint: b, Identity: uint32(1000 + i), Proto: 6, Port: 80, PortBits: 16}, Verdict: policy.VerdictAllow, RuleID: 2})
	}
	err := d.SyncPolicy(huge, eps)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("shunt_policy is full")) {
		t.Fatalf("oversized policy: err %v, want shunt_policy is full", err)
	}
	if v := run(packet(a, b, 6, tcpSegment(41002, 80, tcpSYN))); v != tcActRedirect {
		t.Errorf("after the refused sync the previous policy must stay: verdict %d", v)
	}
	if v := run(packet(a, b, 6, tcpSegment(41003, 81, tcpSYN))); v != tcActShot {
		t.Errorf("after the refused sync nothing new may be open: verdict %d", v)
	}
	entries, err := d.PolicyEntries()
	if err != nil || len(entries) != 1 || entries[0].RuleID != 1 {
		t.Errorf("kernel policy after refused sync: %+v, %v", entries, err)
	}
}
