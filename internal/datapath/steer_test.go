package datapath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/steerroute"
)

// TestProxySteering: a SYN from another node's pod (native routing, the
// uplink program) to a local pod's port the node proxy takes, with no
// proxy listening, is dropped, counted and reported proxy-steer-failed,
// never handed to the pod; a later packet of a connection the proxy does
// not hold, and a port without HTTP rules, go to the pod as before. (The
// assignment itself needs a packet at tc ingress, which BPF_PROG_TEST_RUN
// is not: bpf_sk_assign refuses it there. test/e2e's TestProxySteering
// covers it.)
func TestProxySteering(t *testing.T) {
	steer := &ProxySteer{Listen: netip.MustParseAddrPort("127.0.0.1:15006"), Routing: steerroute.Routing{Mark: 0x5f000000, Table: 0x5f, Priority: 95}}
	d, ns, uplink := nativeNode(t, "st", steer)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	if err := d.SyncPolicy(policy.State{IPCache: []policy.PrefixIdentity{
		{Prefix: netip.PrefixFrom(npLocalPod, 32), Identity: 300},
		{Prefix: netip.PrefixFrom(npRemotePod, 32), Identity: 301, Tunnel: npOtherNode},
	}}, []Endpoint{{IP: npLocalPod, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300}}); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncL7Redirects([]L7Redirect{{Dest: netip.AddrPortFrom(npLocalPod, 8080), Proxy: netip.AddrPortFrom(npSNAT, 15001)}}); err != nil {
		t.Fatal(err)
	}
	flows := flowReader(t, d)
	run := func(pkt []byte) uint32 {
		t.Helper()
		ret, _ := runFromUplink(t, d, ns, uplink, withChecksum(pkt))
		return ret
	}

	before := counts(t, d)
	if ret := run(packet(npRemotePod, npLocalPod, 6, tcpSegment(40000, 8080, tcpSYN))); ret != tcActShot {
		t.Errorf("SYN to the HTTP port without the proxy's listener: verdict %d, want dropped (%d)", ret, tcActShot)
	}
	if ret := run(packet(npRemotePod, npLocalPod, 6, tcpSegment(40000, 8081, tcpSYN))); ret != tcActRedirect {
		t.Errorf("SYN to a port without HTTP rules: verdict %d, want to the pod (%d)", ret, tcActRedirect)
	}
	if ret := run(packet(npRemotePod, npLocalPod, 6, tcpSegment(40001, 8080, tcpACK))); ret != tcActRedirect {
		t.Errorf("ACK of a connection the proxy does not hold: verdict %d, want to the pod (%d)", ret, tcActRedirect)
	}
	counterDelta(t, d, before, map[string]uint64{"proxy-steer-failed/from-uplink": 1, "forwarded/from-uplink": 2})
	var failed bool
	for _, e := range flows() {
		failed = failed || (e.Reason == "proxy-steer-failed" && e.Verdict == "DROPPED" && e.Dst == npLocalPod && e.DstPort == 8080)
	}
	if !failed {
		t.Error("no flow event names the drop proxy-steer-failed")
	}
}

// nativeNode opens a datapath with native routing in a namespace of its
// own, whose uplink (NAME-ul, at npNode) faces another (NAME-out, at
// npOtherNode), with steer as its steering configuration (nil: none).
func nativeNode(t *testing.T, name string, steer *ProxySteer) (d *Datapath, ns string, uplink int) {
	t.Helper()
	requireBPF(t)
	ns, peer := testNetns(t), testNetns(t)
	veth(t, ns, name+"-ul", netip.PrefixFrom(npNode, 24), peer, name+"-out", netip.PrefixFrom(npOtherNode, 24))
	if err := netnsrun.Do(ns, func() error {
		var err error
		_, uplink, err = UplinkOf(npNode)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d = openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, NativeIfindex: uplink, ProxySteer: steer,
		ProxyMark: ProxyMark{Magic: 0x5e000000, Mask: 0xff000000}}, nil)
	return d, ns, uplink
}

// TestPodOwnProxyRemoteClients: a pod with its own inbound proxy
// (shunt.io/inbound-redirect 8080 -> 15010) gets the connections of
// clients from off the node (here another node's pod, native routing, the
// uplink program) at its proxy's port, as the connect hook sends the
// node's clients there: the SYN's destination port becomes 15010 and the
// original destination is filed for SO_ORIGINAL_DST, marked as tc's; a
// later packet follows it; the pod's answers from 15010 leave with 8080,
// the port the client dialled; a connection begun before the redirect (no
// record) is left as it is.
func TestPodOwnProxyRemoteClients(t *testing.T) {
	d, ns, uplink := nativeNode(t, "pp", nil)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	if err := d.SyncPolicy(policy.State{IPCache: []policy.PrefixIdentity{
		{Prefix: netip.PrefixFrom(npLocalPod, 32), Identity: 300},
		{Prefix: netip.PrefixFrom(npRemotePod, 32), Identity: 301, Tunnel: npOtherNode},
	}}, []Endpoint{{IP: npLocalPod, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300, OwnProxy: true}}); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncL7Redirects([]L7Redirect{{Dest: netip.AddrPortFrom(npLocalPod, 8080), Proxy: netip.AddrPortFrom(npLocalPod, 15010)}}); err != nil {
		t.Fatal(err)
	}
	run := func(prog *ebpf.Program, pkt []byte, ctx any) (uint32, tuple) {
		t.Helper()
		opts := &ebpf.RunOptions{Data: withChecksum(pkt), DataOut: make([]byte, len(pkt)+64), Context: ctx}
		var ret uint32
		if err := netnsrun.Do(ns, func() (err error) { ret, err = prog.Run(opts); return err }); err != nil {
			t.Fatal(err)
		}
		return ret, checkedTuple(t, opts.DataOut)
	}
	fromUplink := func(pkt []byte) (uint32, tuple) { return run(d.uplink.ShuntFromUplink, pkt, skbContext(uplink)) }

	ret, out := fromUplink(packet(npRemotePod, npLocalPod, 6, tcpSegment(40000, 8080, tcpSYN)))
	if ret != tcActRedirect || out.dport != 15010 {
		t.Errorf("SYN to 8080: verdict %d, port %d; want to the pod (%d) at its proxy's 15010", ret, out.dport, tcActRedirect)
	}
	var o sockopsProxyOrigin
	k := sockopsProxyOriginKey{ClientIp: be32(npRemotePod), ClientPort: be16(40000), ProxyIp: be32(npLocalPod), ProxyPort: be16(15010)}
	if err := d.sockOps.ShuntProxyOrigins.Lookup(k, &o); err != nil || fromBe32(o.Ip) != npLocalPod || fromBe16(o.Port) != 8080 || o.Flags&proxyOriginByTC == 0 {
		t.Errorf("original destination filed: %+v, %v; want %s:8080 by tc", o, err, npLocalPod)
	}
	if _, out = fromUplink(packet(npRemotePod, npLocalPod, 6, tcpSegment(40000, 8080, tcpACK))); out.dport != 15010 {
		t.Errorf("the client's ACK went to port %d, want 15010", out.dport)
	}
	ret, out = run(d.objs.ShuntFromPod, packet(npLocalPod, npRemotePod, 6, tcpSegment(15010, 40000, tcpSYN|tcpACK)), nil)
	if out.sport != 8080 || ret == tcActShot {
		t.Errorf("the pod's SYN-ACK from 15010: verdict %d, source port %d; want it sent on from 8080", ret, out.sport)
	}
	// Begun before the redirect: no record, unchanged.
	if _, out = fromUplink(packet(npRemotePod, npLocalPod, 6, tcpSegment(40001, 8080, tcpACK))); out.dport != 8080 {
		t.Errorf("an older connection's ACK went to port %d, want 8080", out.dport)
	}
}
