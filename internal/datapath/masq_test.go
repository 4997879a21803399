package datapath

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/tcfilter"
	"github.com/shuntnet/shunt/internal/teardown"
)

// The masquerade test builds, out of network namespaces, a node whose
// uplink leads to a host outside the cluster, which knows the node's
// address and nothing of the pod network (no route to it):
//
//	pod ── node ══ uplink 10.77.0.0/24 ══ outside host
//	10.244.1.10   10.77.0.1               10.77.0.9
var (
	mxNodeAddr = netip.MustParseAddr("10.77.0.1")
	mxOutside  = netip.MustParseAddr("10.77.0.9")
	mxPodIP    = netip.MustParseAddr("10.244.1.10")
)

const (
	mxTCPPort    = 8080
	mxUDPPort    = 5353
	mxClosedPort = 5999 // nothing listens: the outside host answers port unreachable
)

// TestMasqueradeNamespaces: a pod's TCP, UDP and ping reach a host outside
// the cluster, which sees them from the node's address, and the replies
// come back to the pod; an ICMP port unreachable from that host reaches the
// pod's UDP socket as ECONNREFUSED; the NAT table holds the flows and the
// counters and flows name the translations. It runs again with the tc
// fallback: the programs on the pod's veth and the uplink as cls_bpf
// filters.
func TestMasqueradeNamespaces(t *testing.T) {
	requireBPF(t)
	for _, mode := range []Mode{ModeRedirectPeer, ModeRedirect} {
		t.Run(string(mode), func(t *testing.T) { testMasqueradeNamespaces(t, mode, nil) })
	}
	t.Run("redirect-peer-tc-fallback", func(t *testing.T) { testMasqueradeNamespaces(t, ModeRedirectPeer, tcFallback) })
}

func testMasqueradeNamespaces(t *testing.T, mode Mode, fallbacks dpinfo.Fallbacks) {
	nsNode, nsOut := testNetns(t), testNetns(t)
	veth(t, nsNode, "ul-n", netip.PrefixFrom(mxNodeAddr, 24), nsOut, "ul-o", netip.PrefixFrom(mxOutside, 24))
	node := podnet.Node{PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), NodeIP: netip.MustParseAddr("10.244.1.1"),
		HostIf: "shunt_host", DefaultRoute: true}
	pod := podnet.Pod{Netns: testName("shunt-test-mqpod"), HostIf: "pod-mq", PodIP: mxPodIP}
	t.Cleanup(func() {
		if err := podnet.DeleteNetns(pod.Netns); err != nil {
			t.Error(err)
		}
	})
	pinDir := filepath.Join("/sys/fs/bpf", testName("shunt-test-masq"))
	var d *Datapath
	t.Cleanup(func() {
		if d != nil {
			d.Close()
		}
		if err := teardown.Pins(pinDir); err != nil {
			t.Error(err)
		}
	})
	var ep Endpoint
	err := netnsrun.Do(nsNode, func() error {
		if err := podnet.SetupNode(node); err != nil {
			return err
		}
		links, err := podnet.SetupPod(node, pod)
		if err != nil {
			return err
		}
		ep = Endpoint{IP: mxPodIP, Ifindex: links.HostIfindex, PodMAC: links.PodMAC, NodeMAC: links.HostMAC, Identity: 300}
		if d, err = Open(thisKernel(t, Config{PinDir: pinDir, Mode: mode, Masquerade: &Masquerade{Addr: mxNodeAddr, Ports: dpinfo.DefaultMasqPorts},
			Fallbacks: fallbacks})); err != nil {
			return err
		}
		if err := d.AttachPod(pod.HostIf, links.HostIfindex); err != nil {
			return err
		}
		name, ifindex, err := UplinkOf(mxNodeAddr)
		if err != nil {
			return err
		}
		if err := d.AttachUplink(name, ifindex); err != nil {
			return err
		}
		if fallbacks.Has(dpinfo.FallbackTC) {
			return checkUplinkFilters(d, ifindex)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if hooks, err := d.Hooks(); err != nil || hooks["to-uplink"] != 1 || hooks["from-uplink"] != 1 {
		t.Fatalf("hooks %v, %v; want to-uplink and from-uplink once", hooks, err)
	}
	if err := d.SyncPolicy(policy.State{IPCache: []policy.PrefixIdentity{{Prefix: netip.PrefixFrom(mxPodIP, 32), Identity: 300}}},
		[]Endpoint{ep}); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncMasqExclude([]netip.Prefix{node.PodCIDR}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetFlowMode(FlowModeDefault); err != nil {
		t.Fatal(err)
	}
	fr, err := d.Flows()
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()

	// The outside host's servers report who they see.
	tcpPeers := make(chan netip.Addr, 4)
	var l net.Listener
	var udp *net.UDPConn
	if err := netnsrun.Do(nsOut, func() (err error) {
		if l, err = net.Listen("tcp4", netip.AddrPortFrom(mxOutside, mxTCPPort).String()); err != nil {
			return err
		}
		udp, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(mxOutside, mxUDPPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); udp.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tcpPeers <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	udpPeers := make(chan netip.Addr, 4)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := udp.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			udpPeers <- from.Addr().Unmap()
			udp.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	seen := func(what string, peers chan netip.Addr) {
		t.Helper()
		select {
		case a := <-peers:
			if a != mxNodeAddr {
				t.Errorf("%s: the outside host saw %s, want the node's address %s", what, a, mxNodeAddr)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("%s: the outside host saw nothing", what)
		}
	}

	before := counts(t, d)
	t.Run("TCP", func(t *testing.T) {
		if err := tcpEcho(pod, netip.AddrPortFrom(mxOutside, mxTCPPort), 256<<10); err != nil {
			t.Fatalf("TCP from the pod to the outside host: %v", err)
		}
		seen("TCP", tcpPeers)
	})
	t.Run("UDP", func(t *testing.T) {
		if err := udpEcho(pod, netip.AddrPortFrom(mxOutside, mxUDPPort)); err != nil {
			t.Fatalf("UDP from the pod to the outside host: %v", err)
		}
		seen("UDP", udpPeers)
	})
	t.Run("ping", func(t *testing.T) {
		if err := ping(pod, mxOutside); err != nil {
			t.Fatalf("ping from the pod to the outside host: %v", err)
		}
	})
	t.Run("port unreachable is ECONNREFUSED", func(t *testing.T) {
		err := udpEcho(pod, netip.AddrPortFrom(mxOutside, mxClosedPort))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP to a closed port of the outside host: %v, want ECONNREFUSED (the ICMP error translated back)", err)
		}
	})
	counterDelta(t, d, before, nil, "masqueraded/to-uplink", "unmasqueraded/from-uplink", "forwarded/from-uplink")
	ev := findFlow(t, fr, func(e FlowEvent) bool { return e.Point == "to-uplink" && e.Event == "new" && e.Proto == 6 })
	if ev.Reason != "masqueraded" || ev.Src != mxPodIP || ev.Dst != mxOutside || ev.DstPort != mxTCPPort || ev.SrcIdentity != 300 {
		t.Errorf("new masqueraded connection: %+v; want from the pod (identity 300) to %s:%d, reason masqueraded", ev, mxOutside, mxTCPPort)
	}
	// The port unreachable given back to the pod is a flow of its own, at
	// the uplink (after the connection above: the reader goes forward).
	ev = findFlow(t, fr, func(e FlowEvent) bool { return e.Point == "from-uplink" && e.Event == "icmp-error" })
	if ev.ICMPError != "port-unreachable" || ev.Src != mxOutside || ev.Dst != mxPodIP {
		t.Errorf("the unmasqueraded port unreachable: %+v; want icmp-error port-unreachable from %s to the pod", ev, mxOutside)
	}
	rows, err := d.DumpMap("shunt_masq_nat", false)
	if err != nil {
		t.Fatal(err)
	}
	var tcpRows int
	for _, r := range rows {
		if r["protocol"] == "TCP" && r["outside"] == netip.AddrPortFrom(mxOutside, mxTCPPort).String() {
			tcpRows++
		}
	}
	if tcpRows != 2 {
		t.Errorf("shunt_masq_nat holds %d entries of the TCP flow, want 2 (both directions): %v", tcpRows, rows)
	}
}

// checkUplinkFilters checks that shunt's filters on the uplink run the
// uplink programs, in the uplink's namespace.
func checkUplinkFilters(d *Datapath, ifindex int) error {
	for _, h := range []struct {
		dir  tcfilter.Direction
		prog *ebpf.Program
	}{{tcfilter.Egress, d.uplink.ShuntToUplink}, {tcfilter.Ingress, d.uplink.ShuntFromUplink}} {
		id, found, err := tcfilter.Find(ifindex, h.dir, d.tcOwner())
		if err != nil {
			return err
		}
		info, err := h.prog.Info()
		if err != nil {
			return err
		}
		if want, _ := info.ID(); !found || ebpf.ProgramID(id) != want {
			return fmt.Errorf("uplink %s: shunt's filter found %v, running program %d; want program %d", h.dir, found, id, want)
		}
	}
	return nil
}

// udpEcho sends a datagram from the pod on a connected socket and waits
// for it to come back; a refused port shows as ECONNREFUSED.
func udpEcho(pod podnet.Pod, to netip.AddrPort) error {
	var c *net.UDPConn
	if err := netnsrun.Do(podnet.NetnsPath(pod.Netns), func() (err error) {
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("masquerade")); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "masquerade" {
		return errors.New("the echo differs from what was sent")
	}
	return nil
}
