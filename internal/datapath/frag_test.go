package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podnet"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// testNodeIP is a node's address on the pod network (pods' gateway) for
// tests that need one and look at no answer from it.
var testNodeIP = netip.MustParseAddr("10.99.0.1")

const (
	ipDF          = 0x4000
	fragTunnelMTU = 1450 // a 1500-byte underlay less VXLANOverhead
)

// sizedPacket is packet() grown to an IPv4 total length of l3len (the L4
// header, then zeros), DF set or not, the IPv4 checksum valid.
func sizedPacket(src, dst netip.Addr, proto uint8, l4 []byte, l3len int, df bool) []byte {
	pkt := packet(src, dst, proto, append(l4, make([]byte, l3len-20-len(l4))...))
	if df {
		binary.BigEndian.PutUint16(pkt[14+6:], ipDF)
	}
	binary.BigEndian.PutUint16(pkt[14+10:], 0)
	binary.BigEndian.PutUint16(pkt[14+10:], ipChecksum(pkt[14:34]))
	return pkt
}

// withIPOptions gives the packet's IPv4 header 4 bytes of options (NOPs),
// its total length and checksum adjusted.
func withIPOptions(pkt []byte) []byte {
	out := append(append(append([]byte{}, pkt[:34]...), 1, 1, 1, 1), pkt[34:]...)
	out[14] = 0x46
	binary.BigEndian.PutUint16(out[14+2:], uint16(len(out)-14))
	binary.BigEndian.PutUint16(out[14+10:], 0)
	binary.BigEndian.PutUint16(out[14+10:], ipChecksum(out[14:38]))
	return out
}

// fragNeededTunnel makes, in a network namespace of the test's own, what
// bpf_check_mtu needs to judge packets for the tunnel: a real VXLAN device
// made by EnsureVXLAN over an underlay veth of MTU 1500, so the device's
// MTU is 1450. Test runs must run in that namespace (the helper finds the
// device in the namespace of the packet's device, the runner's loopback).
func fragNeededTunnel(t *testing.T) (ns string, ifindex int) {
	t.Helper()
	ns = testNetns(t)
	ul := netip.MustParsePrefix("10.77.0.1/24")
	err := netnsrun.Do(ns, func() error {
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU = "ul0", 1500
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "ul1"}); err != nil {
			return fmt.Errorf("creating the underlay veth: %w", err)
		}
		l, err := netlink.LinkByName("ul0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(ul)}); err != nil {
			return err
		}
		if ifindex, err = EnsureVXLAN(ovVXLAN, ul.Addr(), ovPort); err != nil {
			return err
		}
		vx, err := netlink.LinkByIndex(ifindex)
		if err != nil {
			return err
		}
		if vx.Attrs().MTU != fragTunnelMTU {
			return fmt.Errorf("VXLAN device MTU %d over a 1500-byte underlay, want %d", vx.Attrs().MTU, fragTunnelMTU)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ns, ifindex
}

// testRunIn runs prog on pkt inside the namespace ns.
func testRunIn(ns string, prog *ebpf.Program, pkt []byte) (ret uint32, out []byte, err error) {
	err = netnsrun.Do(ns, func() error {
		ret, out, err = prog.Test(pkt)
		return err
	})
	return ret, out, err
}

// checkFragNeeded checks that out is the ICMP fragmentation needed that
// answers in, an Ethernet frame as its sender sent it: back to the
// sender's MAC from the one it sent to, from the node's address to the
// sender, next-hop MTU 1450, both checksums valid, quoting in's IPv4 header
// (options too) and the 8 bytes after it, byte for byte.
func checkFragNeeded(t *testing.T, name string, in, out []byte, from netip.Addr) {
	t.Helper()
	ipLen := int(in[14]&0x0f) * 4
	wantLen := 14 + 20 + 8 + ipLen + 8
	if len(out) != wantLen {
		t.Errorf("%s: answer of %d bytes, want %d (Ethernet, IPv4, ICMP, the quote)", name, len(out), wantLen)
		return
	}
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) || binary.BigEndian.Uint16(out[12:]) != 0x0800 {
		t.Errorf("%s: Ethernet header % x, want the sender's MAC % x as destination, % x as source, IPv4", name, out[:14], in[6:12], in[0:6])
	}
	ip := out[14:34]
	src, _ := netip.AddrFromSlice(ip[12:16])
	dst, _ := netip.AddrFromSlice(ip[16:20])
	sender, _ := netip.AddrFromSlice(in[14+12 : 14+16])
	if ip[0] != 0x45 || int(binary.BigEndian.Uint16(ip[2:])) != wantLen-14 || ip[8] != 64 || ip[9] != 1 ||
		binary.BigEndian.Uint16(ip[6:]) != ipDF || src != from || dst != sender || ipChecksum(ip) != 0 {
		t.Errorf("%s: IPv4 header % x: want version 4, length %d, TTL 64, ICMP, DF, %s -> %s, a valid checksum", name, ip, wantLen-14, from, sender)
	}
	icmp := out[34:]
	if icmp[0] != 3 || icmp[1] != 4 || binary.BigEndian.Uint16(icmp[4:]) != 0 || binary.BigEndian.Uint16(icmp[6:]) != fragTunnelMTU ||
		ipChecksum(icmp) != 0 {
		t.Errorf("%s: ICMP header % x: want type 3 code 4, next-hop MTU %d, a valid checksum over the quote", name, icmp[:8], fragTunnelMTU)
	}
	if quote := icmp[8:]; !bytes.Equal(quote, in[14:14+ipLen+8]) {
		t.Errorf("%s: quote\n% x\nwant the packet as sent (TTL not decremented, no translation)\n% x", name, quote, in[14:14+ipLen+8])
	}
}

// TestFromPodFragNeeded runs shunt_from_pod on packets for a pod of
// another node against a real tunnel device of MTU 1450: one that does
// not fit with DF set is answered with ICMP fragmentation needed (every
// field checked, the answer sent back into the pod), counted and reported
// as frag-needed with its own length; one that fits, or has no DF, or is
// an ICMP error, or whose TTL runs out, goes on as before. A packet the tc
// path translated to a backend on the other node is quoted with the
// service address it was sent to.
func TestFromPodFragNeeded(t *testing.T) {
	requireBPF(t)
	ns, vx := fragNeededTunnel(t)
	a, remote := netip.MustParseAddr("10.99.0.10"), netip.MustParseAddr("10.98.0.20")
	mac := []byte{0xaa, 0, 0, 0, 0, 2} // the source MAC packet() writes
	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), 80)
	state := policy.State{IPCache: []policy.PrefixIdentity{
		{Prefix: netip.PrefixFrom(a, 32), Identity: 300},
		{Prefix: netip.PrefixFrom(remote, 32), Identity: 400, Tunnel: netip.MustParseAddr("172.31.0.2")},
	}}
	// Test runs see packets on the namespace's lo: the pod's "veth" is ifindex 1.
	endpoints := []Endpoint{{IP: a, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: 300}}
	icmpEcho := append([]byte{8, 0, 0, 0, 0x12, 0x34, 0, 1}, make([]byte, 8)...)
	icmpError := icmpUnreachable(packet(remote, a, 17, udpDatagram(53, 40000)))

	for _, mode := range []Mode{ModeRedirectPeer, ModeRedirect} {
		t.Run(string(mode), func(t *testing.T) {
			d := openConfiguredDatapath(t, Config{Mode: mode, TunnelIfindex: vx, NodeIP: testNodeIP}, nil)
			if err := d.SyncPolicy(state, endpoints); err != nil {
				t.Fatal(err)
			}
			if _, err := d.SyncServices([]services.Port{{Frontend: services.Frontend{VIP: vip.Addr(), Port: vip.Port(), Proto: 6},
				Name: "test/web:80", Backends: []services.Backend{{IP: remote, Port: 8080}}}}); err != nil {
				t.Fatal(err)
			}
			flows := flowReader(t, d)
			before := counts(t, d)
			cases := []struct {
				name     string
				pkt      []byte
				verdict  uint32
				answered bool
			}{
				{"UDP, 1500 bytes, DF", sizedPacket(a, remote, 17, udpDatagram(40000, 53), 1500, true), tcActRedirect, true},
				{"UDP, 1451 bytes, DF: one byte over", sizedPacket(a, remote, 17, udpDatagram(40001, 53), 1451, true), tcActRedirect, true},
				{"TCP, 1500 bytes, DF", sizedPacket(a, remote, 6, tcpSegment(40002, 8080, tcpACK), 1500, true), tcActRedirect, true},
				{"ICMP echo, 1500 bytes, DF", sizedPacket(a, remote, 1, icmpEcho, 1500, true), tcActRedirect, true},
				{"IPv4 options, 1500 bytes, DF", withIPOptions(sizedPacket(a, remote, 17, udpDatagram(40003, 53), 1496, true)), tcActRedirect, true},
				{"UDP, 1450 bytes, DF: fits", sizedPacket(a, remote, 17, udpDatagram(40004, 53), 1450, true), tcActRedirect, false},
				{"UDP, 1500 bytes, no DF: fragmented outside", sizedPacket(a, remote, 17, udpDatagram(40005, 53), 1500, false), tcActRedirect, false},
				{"an ICMP error, 1500 bytes, DF: no error about an error", sizedPacket(a, remote, 1, icmpError, 1500, true), tcActRedirect, false},
			}
			for _, c := range cases {
				ret, out, err := testRunIn(ns, d.objs.ShuntFromPod, c.pkt)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if ret != c.verdict {
					t.Errorf("%s: verdict %d, want %d", c.name, ret, c.verdict)
					continue
				}
				if c.answered {
					checkFragNeeded(t, c.name, c.pkt, out, testNodeIP)
				} else if len(out) != len(c.pkt) || out[14+8] != 63 || ipChecksum(out[14:14+20]) != 0 {
					t.Errorf("%s: %d bytes out, TTL %d: want the packet as it came (%d bytes) after one hop, to the tunnel",
						c.name, len(out), out[14+8], len(c.pkt))
				}
			}

			// TTL 1: time exceeded comes first, from the stack, as
			// ip_forward answers it.
			ttl1 := sizedPacket(a, remote, 17, udpDatagram(40006, 53), 1500, true)
			ttl1[14+8] = 1
			binary.BigEndian.PutUint16(ttl1[14+10:], 0)
			binary.BigEndian.PutUint16(ttl1[14+10:], ipChecksum(ttl1[14:34]))
			if ret, _, err := testRunIn(ns, d.objs.ShuntFromPod, ttl1); err != nil || ret != tcActOK {
				t.Errorf("TTL 1, 1500 bytes, DF: verdict %d, %v; want %d (the stack answers time exceeded)", ret, err, tcActOK)
			}

			// The tc path translates the VIP to the backend on the other
			// node: the answer quotes what the pod sent, the VIP.
			svc := sizedPacket(a, vip.Addr(), 6, tcpSegment(40007, vip.Port(), tcpSYN), 1500, true)
			ret, out, err := testRunIn(ns, d.objs.ShuntFromPod, svc)
			if err != nil || ret != tcActRedirect {
				t.Fatalf("a SYN to the VIP, 1500 bytes, DF: verdict %d, %v; want %d", ret, err, tcActRedirect)
			}
			checkFragNeeded(t, "a SYN to the VIP", svc, out, testNodeIP)

			counterDelta(t, d, before, map[string]uint64{
				"frag-needed/from-pod": 6, "to-tunnel/from-pod": 3, "ttl-exceeded/from-pod": 1,
			})
			var answered []FlowEvent
			for _, e := range flows() {
				if e.Reason == "frag-needed" {
					answered = append(answered, e)
				}
			}
			if len(answered) != 6 {
				t.Fatalf("%d frag-needed flow events, want 6: %+v", len(answered), answered)
			}
			if e := answered[0]; e.Verdict != "DROPPED" || e.Src != a || e.Dst != remote || e.Length != 1514 || e.Point != "from-pod" ||
				e.SrcIdentity != 300 || e.DstIdentity != 400 {
				t.Errorf("flow event %+v: want DROPPED at from-pod, %s -> %s, identities 300 -> 400, the packet's own length 1514", e, a, remote)
			}
		})
	}
}

// TestOverlayPathMTU: two nodes of the overlay over a 1500-byte underlay,
// whose pods get 1450 bytes; both pods raise their own MTU to 1500, as a
// pod with NET_ADMIN may. A ping without DF too big for the tunnel still
// gets its reply (the outer packet is fragmented: the tunnel key sets no
// DF on it); one with DF gets "fragmentation needed" with MTU 1450 from
// the node's pod-network address, the pod's kernel records the path MTU,
// and a ping that fits it gets its reply. A 20 MB TCP transfer (each way,
// GSO packets judged by their segments) completes and leaves no outer
// fragment behind: its path MTU converged.
func TestOverlayPathMTU(t *testing.T) {
	requireBPF(t)
	for _, mode := range []Mode{ModeRedirectPeer, ModeRedirect} {
		t.Run(string(mode), func(t *testing.T) { testOverlayPathMTU(t, mode) })
	}
}

func testOverlayPathMTU(t *testing.T, mode Mode) {
	a, b := newOvNodes(t, mode, false, fragTunnelMTU)
	// A second pod on B, for the TCP transfer: one whose path no ping
	// taught either end (a cached path MTU lowers the MSS a SYN offers).
	b2, b2ep := b.addPod(t, "b2", netip.MustParseAddr("10.244.2.20"), ovIdentityB)
	ipcache := ovIPCache
	a.sync(t, policy.State{IPCache: ipcache(a, b)})
	b.sync(t, policy.State{IPCache: ipcache(b, a)})
	// Both ends of each pod's veth, as a CNI configuration with "mtu":
	// 1500 makes them. (A pod that raises only its own end gets only its
	// GSO packets past the host end, which refuses the others, ENOBUFS in
	// the pod: its TCP still needs the answer, its pings never reach it.)
	setMTU := func(ns, ifname string) error {
		return netnsrun.Do(ns, func() error {
			l, err := netlink.LinkByName(ifname)
			if err != nil {
				return err
			}
			return netlink.LinkSetMTU(l, 1500)
		})
	}
	for _, p := range []struct {
		node *ovNode
		pod  podnet.Pod
	}{{a, a.pod}, {b, b.pod}, {b, b2}} {
		if err := errors.Join(setMTU(podnet.NetnsPath(p.pod.Netns), podnet.PodIfName), setMTU(p.node.netns, p.pod.HostIf)); err != nil {
			t.Fatalf("raising pod %s's MTU: %v", p.pod.PodIP, err)
		}
	}
	frA := a.flows(t)
	echoServer(t, b2, netip.AddrPortFrom(b2ep.IP, ovEchoPort))
	toB := b.pod.PodIP.String()

	t.Run("no DF: fragmented outside the tunnel, delivered", func(t *testing.T) {
		before, fragsBefore := counts(t, a.d), ipStat(t, a.netns, "FragCreates")
		if out, err := inPod(a.pod, "ping", "-M", "dont", "-s", "1472", "-c", "1", "-W", "3", toB); err != nil {
			t.Fatalf("ping -M dont -s 1472 %s from pod A: %v\n%s", toB, err, out)
		}
		counterDelta(t, a.d, before, map[string]uint64{"frag-needed/from-pod": 0}, "to-tunnel/from-pod")
		if n := ipStat(t, a.netns, "FragCreates") - fragsBefore; n < 2 {
			t.Errorf("node A created %d IP fragments, want the outer packet's (2 or more)", n)
		}
	})

	t.Run("DF: fragmentation needed, the path MTU recorded", func(t *testing.T) {
		before := counts(t, a.d)
		out, err := inPod(a.pod, "ping", "-M", "do", "-s", "1472", "-c", "1", "-W", "3", toB)
		want := fmt.Sprintf("From %s icmp_seq=1 Frag needed and DF set (mtu = %d)", a.node.NodeIP, fragTunnelMTU)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("ping -M do -s 1472 %s from pod A: %v\n%s\nwant it to fail with %q", toB, err, out, want)
		}
		counterDelta(t, a.d, before, map[string]uint64{"frag-needed/from-pod": 1, "to-tunnel/from-pod": 0})
		ev := findFlow(t, frA, func(e FlowEvent) bool { return e.Reason == "frag-needed" })
		if ev.Verdict != "DROPPED" || ev.Src != a.pod.PodIP || ev.Dst != b.pod.PodIP || ev.Proto != 1 || ev.Length != 14+1500 {
			t.Errorf("flow %+v: want the 1514-byte echo request from pod A to pod B DROPPED as frag-needed", ev)
		}
		if out, err := inPod(a.pod, "ip", "route", "get", toB); err != nil || !strings.Contains(out, fmt.Sprintf("mtu %d", fragTunnelMTU)) {
			t.Errorf("ip route get %s in pod A: %v\n%s\nwant the path MTU %d cached", toB, err, out, fragTunnelMTU)
		}
		if out, err := inPod(a.pod, "ping", "-M", "do", "-s", "1422", "-c", "1", "-W", "3", toB); err != nil {
			t.Errorf("ping -M do -s 1422 %s (1450 bytes) from pod A: %v\n%s", toB, err, out)
		}
	})

	t.Run("TCP bulk transfer converges", func(t *testing.T) {
		// Both kernels know nothing of the path yet: their segments of
		// MSS 1460 (GSO) are answered on their node until they lower it.
		beforeA, beforeB := counts(t, a.d), counts(t, b.d)
		fragsA, fragsB := ipStat(t, a.netns, "FragCreates"), ipStat(t, b.netns, "FragCreates")
		if err := tcpEcho(a.pod, netip.AddrPortFrom(b2ep.IP, ovEchoPort), 20<<20); err != nil {
			t.Fatalf("20 MB each way between pod A and pod B2: %v (A: %v, B: %v)", err, counts(t, a.d), counts(t, b.d))
		}
		counterDelta(t, a.d, beforeA, nil, "frag-needed/from-pod", "to-tunnel/from-pod")
		counterDelta(t, b.d, beforeB, nil, "frag-needed/from-pod", "to-tunnel/from-pod")
		for _, c := range []struct {
			pod podnet.Pod
			to  netip.Addr
		}{{a.pod, b2ep.IP}, {b2, a.pod.PodIP}} {
			if out, err := inPod(c.pod, "ip", "route", "get", c.to.String()); err != nil || !strings.Contains(out, fmt.Sprintf("mtu %d", fragTunnelMTU)) {
				t.Errorf("ip route get %s in pod %s: %v\n%s\nwant the path MTU %d cached", c.to, c.pod.PodIP, err, out, fragTunnelMTU)
			}
		}
		if nA, nB := ipStat(t, a.netns, "FragCreates")-fragsA, ipStat(t, b.netns, "FragCreates")-fragsB; nA != 0 || nB != 0 {
			t.Errorf("the nodes created IP fragments during the transfer (A %d, B %d), want none: every packet fit the tunnel", nA, nB)
		}
	})
}

// inPod runs a command inside the pod's network namespace and returns its
// output.
func inPod(pod podnet.Pod, name string, args ...string) (string, error) {
	var out []byte
	err := netnsrun.Do(podnet.NetnsPath(pod.Netns), func() (err error) {
		out, err = exec.Command(name, args...).CombinedOutput()
		return err
	})
	return string(out), err
}

// ipStat reads an IPv4 counter of the namespace (/proc/net/snmp's "Ip:"
// lines, e.g. FragCreates: fragments the namespace's stack created).
func ipStat(t *testing.T, ns, field string) uint64 {
	t.Helper()
	var snmp []byte
	// thread-self: the namespace of this thread, where /proc/self/net
	// would show the process's.
	if err := netnsrun.Do(ns, func() (err error) {
		snmp, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(snmp), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Ip:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == field && i < len(f) {
				v, err := strconv.ParseUint(f[i], 10, 64)
				if err != nil {
					t.Fatalf("/proc/net/snmp Ip %s: %v", field, err)
				}
				return v
			}
		}
	}
	t.Fatalf("no Ip %s in /proc/net/snmp:\n%s", field, snmp)
	return 0
}
