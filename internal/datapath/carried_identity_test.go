package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/steerroute"
)

// identityOption is the TCP option in which another node's proxy carries
// its client's identity (bpf/lib/carried_identity.h), with exid as its
// experiment id.
func identityOption(identity uint32, exid uint16) []byte {
	o := []byte{byte(podtcShuntTcpOptionSHUNT_TCPOPT_IDENTITY_KIND), byte(podtcShuntTcpOptionSHUNT_TCPOPT_IDENTITY_LEN), 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(o[2:], exid)
	binary.BigEndian.PutUint32(o[4:], identity)
	return o
}

// tcpSegmentWithOptions is tcpSegment with TCP options, padded with
// end-of-options to a multiple of 4 bytes; doffCut shortens the header's
// data offset by that many 4-byte words (a header that says it ends
// before its options do).
func tcpSegmentWithOptions(sport, dport uint16, flags byte, doffCut int, opts ...[]byte) []byte {
	tcp := tcpSegment(sport, dport, flags)
	for _, o := range opts {
		tcp = append(tcp, o...)
	}
	for len(tcp)%4 != 0 {
		tcp = append(tcp, 0)
	}
	tcp[12] = byte(len(tcp)/4-doffCut) << 4
	return tcp
}

// TestCarriedIdentity: with native routing, a SYN from another node's
// address (remote-node) that carries a pod's identity in shunt's TCP
// option (another node's proxy connecting for its client) is judged as
// that identity, counted identity-carried and reported with it, and goes
// to the pod, not to this node's proxy: the client's node decided its
// requests. The option is found among the options Linux writes, and
// ignored when malformed, of another experiment, cut off by the header's
// length, not a pod's identity, on a packet other than a SYN, or from a
// pod's address (whose identity the ipcache gives).
func TestCarriedIdentity(t *testing.T) {
	steer := &ProxySteer{Listen: netip.MustParseAddrPort("127.0.0.1:15006"), Routing: steerroute.Routing{Mark: 0x5f000000, Table: 0x5f, Priority: 95}}
	d, ns, uplink := nativeNode(t, "ci", steer)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	const idServer, idClient, idOther, exid = 300, 301, 302, uint16(podtcShuntTcpOptionSHUNT_TCPOPT_IDENTITY_EXID)
	if err := d.SyncPolicy(policy.State{
		IPCache: []policy.PrefixIdentity{
			{Prefix: netip.PrefixFrom(npLocalPod, 32), Identity: idServer},
			{Prefix: netip.PrefixFrom(npRemotePod, 32), Identity: idClient, Tunnel: npOtherNode},
			{Prefix: netip.PrefixFrom(npOtherNode, 32), Identity: policy.IdentityRemoteNode, Tunnel: npOtherNode},
		},
		Entries: []policy.Entry{{Key: policy.Key{Endpoint: npLocalPod, Identity: idClient, Proto: 6, Port: 8080, PortBits: 16},
			Verdict: policy.VerdictAllow, RuleID: 9}},
	}, []Endpoint{{IP: npLocalPod, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idServer, IngressIsolated: true}}); err != nil {
		t.Fatal(err)
	}
	// Port 8080 has HTTP rules: steered to the proxy, which does not
	// listen here, so a steered SYN is dropped proxy-steer-failed.
	if err := d.SyncL7Redirects([]L7Redirect{{Dest: netip.AddrPortFrom(npLocalPod, 8080), Proxy: netip.AddrPortFrom(npSNAT, 15001)}}); err != nil {
		t.Fatal(err)
	}
	flows := flowReader(t, d)
	// The options of a Linux SYN (MSS, SACK permitted with a timestamp,
	// NOP, window scale), then the identity: where the kernel puts the
	// option a sockops program writes.
	linuxSYN := [][]byte{{2, 4, 0x05, 0xb4}, {4, 2, 8, 10, 1, 2, 3, 4, 0, 0, 0, 0}, {1}, {3, 3, 7}}
	withLinux := func(o []byte) [][]byte { return append(append([][]byte{}, linuxSYN...), o) }
	type verdictWant struct {
		ret      uint32
		identity uint32 // of the flow event, 0: not checked
		reason   string
	}
	allowed := verdictWant{tcActRedirect, idClient, "forwarded"}
	notAllowed := func(identity uint32) verdictWant { return verdictWant{tcActShot, identity, "policy-not-allowed"} }
	for i, c := range []struct {
		name string
		src  netip.Addr
		tcp  []byte
		want verdictWant
	}{
		{"no option: remote-node, not admitted", npOtherNode, tcpSegment(41000, 8080, tcpSYN), notAllowed(policy.IdentityRemoteNode)},
		{"the option alone: the client's identity, to the pod (not steered)", npOtherNode,
			tcpSegmentWithOptions(41001, 8080, tcpSYN, 0, identityOption(idClient, exid)), allowed},
		{"after the options Linux writes", npOtherNode, tcpSegmentWithOptions(41002, 8080, tcpSYN, 0, withLinux(identityOption(idClient, exid))...), allowed},
		{"another pod's identity: judged as that pod", npOtherNode,
			tcpSegmentWithOptions(41003, 8080, tcpSYN, 0, identityOption(idOther, exid)), notAllowed(idOther)},
		{"the host identity: not a pod's, remote-node", npOtherNode,
			tcpSegmentWithOptions(41004, 8080, tcpSYN, 0, identityOption(policy.IdentityHost, exid)), notAllowed(policy.IdentityRemoteNode)},
		{"a CIDR identity: not a pod's", npOtherNode,
			tcpSegmentWithOptions(41005, 8080, tcpSYN, 0, identityOption(policy.FirstCIDRIdentity+1, exid)), notAllowed(policy.IdentityRemoteNode)},
		{"another experiment's option", npOtherNode,
			tcpSegmentWithOptions(41006, 8080, tcpSYN, 0, identityOption(idClient, exid+1)), notAllowed(policy.IdentityRemoteNode)},
		{"after a malformed option (length 1)", npOtherNode,
			tcpSegmentWithOptions(41007, 8080, tcpSYN, 0, []byte{30, 1}, identityOption(idClient, exid)), notAllowed(policy.IdentityRemoteNode)},
		{"after end-of-options", npOtherNode,
			tcpSegmentWithOptions(41008, 8080, tcpSYN, 0, []byte{0, 0, 0, 0}, identityOption(idClient, exid)), notAllowed(policy.IdentityRemoteNode)},
		{"past the header's length", npOtherNode,
			tcpSegmentWithOptions(41009, 8080, tcpSYN, 1, []byte{1, 1, 1, 1}, identityOption(idClient, exid)), notAllowed(policy.IdentityRemoteNode)},
		{"the kind with another length", npOtherNode,
			tcpSegmentWithOptions(41010, 8080, tcpSYN, 0, append([]byte{253, 10}, identityOption(idClient, exid)[2:]...), []byte{0, 0}),
			notAllowed(policy.IdentityRemoteNode)},
		// Policy judges connections at their opening: a later packet
		// without a record goes on to the pod, whose stack answers it
		// (with a reset): nothing carried.
		{"not a SYN", npOtherNode, tcpSegmentWithOptions(41011, 8080, tcpACK, 0, identityOption(idClient, exid)), verdictWant{ret: tcActRedirect}},
		{"from a pod of the other node: its own identity, steered to this node's proxy", npRemotePod,
			tcpSegmentWithOptions(41012, 8080, tcpSYN, 0, identityOption(idOther, exid)), verdictWant{tcActShot, idClient, "proxy-steer-failed"}},
	} {
		before := counts(t, d)
		if ret, _ := runFromUplink(t, d, ns, uplink, withChecksum(packet(c.src, npLocalPod, 6, c.tcp))); ret != c.want.ret {
			t.Errorf("case %d, %s: verdict %d, want %d", i, c.name, ret, c.want.ret)
			continue
		}
		carried := uint64(0)
		if c.want == allowed {
			carried = 1
		}
		if c.want.identity == idOther && c.src == npOtherNode {
			carried = 1
		}
		counterDelta(t, d, before, map[string]uint64{"identity-carried/from-uplink": carried})
		if c.want.identity == 0 {
			continue
		}
		sport := binary.BigEndian.Uint16(c.tcp)
		var found bool
		for _, e := range flows() {
			if e.Src != c.src || e.SrcPort != sport {
				continue
			}
			found = true
			if e.SrcIdentity != c.want.identity || e.Reason != c.want.reason {
				t.Errorf("case %d, %s: flow %+v; want source identity %d, reason %s", i, c.name, e, c.want.identity, c.want.reason)
			}
		}
		if !found {
			t.Errorf("case %d, %s: no flow event", i, c.name)
		}
	}
}
