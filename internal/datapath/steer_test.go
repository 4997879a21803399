package datapath

import (
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/policy"
)

// TestProxySteering: a SYN from another node's pod (native routing, the
// uplink program) to a local pod's port the node proxy takes, with no
// proxy listening, is dropped, counted and reported proxy-steer-failed,
// never handed to the pod; a later packet of a connection the proxy does
// not hold, and a port without HTTP rules, go to the pod as before; the
// routing rule that delivers steered packets locally is installed. (The
// assignment itself needs a packet at tc ingress, which BPF_PROG_TEST_RUN
// is not: bpf_sk_assign refuses it there. test/e2e's TestProxySteering
// covers it.)
func TestProxySteering(t *testing.T) {
	requireBPF(t)
	ns, peer := testNetns(t), testNetns(t)
	veth(t, ns, "st-ul", netip.PrefixFrom(npNode, 24), peer, "st-out", netip.PrefixFrom(npOtherNode, 24))
	var uplink int
	if err := netnsrun.Do(ns, func() error {
		var err error
		_, uplink, err = UplinkOf(npNode)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	steer := &ProxySteer{Listen: netip.MustParseAddrPort("127.0.0.1:15006"), Mark: 0x5f000000, Table: 0x5f, Priority: 95}
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, NativeIfindex: uplink, ProxySteer: steer,
		ProxyMark: ProxyMark{Magic: 0x5e000000, Mask: 0xff000000}}, nil)
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
	if err := netnsrun.Do(ns, d.EnsureProxySteerRouting); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "-n", nsName(ns), "rule", "show").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fwmark 0x5f000000 lookup 95") {
		t.Errorf("node's rules: %s %v; want fwmark 0x5f000000 lookup 95", out, err)
	}
	flows := flowReader(t, d)
	run := func(pkt []byte) uint32 {
		t.Helper()
		var ret uint32
		if err := netnsrun.Do(ns, func() error {
			var err error
			ret, err = d.uplink.ShuntFromUplink.Run(&ebpf.RunOptions{Data: withChecksum(pkt), Context: skbContext(uplink)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
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

func nsName(path string) string { return path[strings.LastIndex(path, "/")+1:] }
