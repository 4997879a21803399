package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/netnsrun"
)

// TestNodePortDSRLab: a lab of two nodes with native routing and
// --nodeport-mode hybrid, the backends on node-2, the clients on the
// external host entering through node-1 (nodePortDSRLab).
func TestNodePortDSRLab(t *testing.T) {
	nodePortDSRLab(t, "native")
}

// TestNodePortDSRLabOverlay: nodePortDSRLab with the VXLAN overlay: the
// IPIP goes between the nodes' underlay addresses outside the overlay,
// the pods' smaller MTU (the tunnel device's) still lets a 2 MB upload
// and a 4 MB download through.
func TestNodePortDSRLabOverlay(t *testing.T) {
	nodePortDSRLab(t, "tunnel")
}

// nodePortDSRLab: a lab of two nodes with routing (native or tunnel) and
// --nodeport-mode hybrid, the backends on node-2, the clients on the
// external host entering through node-1. TCP goes by DSR: the backend
// sees the client's address, and the replies leave node-2 straight to the
// client: node-1 counts no NodePort reply and holds no reply entry, and
// its uplink sends far fewer bytes than a 4 MB download through it
// carries, while node-2's sends them all. UDP falls back to SNAT (the
// reply entry on node-1). An ICMP fragmentation needed the external host
// sends about a reply (to the NodePort, the reply's source) reaches the
// backend pod on node-2, whose route to the client then has that MTU. A
// TCP connection to a load balancer address keeps working when the
// external host's route to it moves from node-1 to node-2 in its middle.
// Flows name dsr-encap and dsr-decap; the status's services line names
// the mode. DSR's IPIP from the external host, which is no node, is
// dropped (dsrFromStranger).
func nodePortDSRLab(t *testing.T, routing string) {
	l := newLabNodes(t, 2, []string{"--routing", routing, "--nodeport-mode", "hybrid", "--lb-pool", "192.168.124.0/28"}, "testdata/dsr.yaml")
	ext := labExternal(t, l)
	node1, node2 := "192.168.123.1", "192.168.123.2"
	ns1, ns2 := l.instance+"-node1", l.instance+"-node2"
	if out := l.mustShunt("status", "--node", "node-1"); !strings.Contains(out, "NodePorts from outside: hybrid (DSR for TCP, SNAT for UDP)") {
		t.Errorf("status of node-1 does not name its NodePort mode (hybrid):\n%s", out)
	}

	eventually(t, "NodePort on node-1 by DSR: the backend on node-2 sees the client", ext.addr, func() (string, string) {
		status, body := httpFromOutside(l, fmt.Sprintf("http://%s:30080/remote", node1))
		if status != "200" {
			return status, body
		}
		host, _, _ := strings.Cut(body, ":")
		return host, body
	})
	if out, code := l.shunt("lab", "exec", "--external", "--", filepath.Join(binDir, "shunt"), "lab", "probe", "--timeout", "2s",
		"--expect", "connected", "--tcp", node1+":30070"); code != 0 {
		t.Errorf("TCP echo through node-1's NodePort: %s", out)
	}

	// A 4 MB download through node-1 (iperf3 -R: the server on node-2
	// sends): node-1's uplink carries the client's ACKs only.
	tx1, tx2 := uplinkBytes(t, ns1, node1).TX.Bytes, uplinkBytes(t, ns2, node2).TX.Bytes
	const download = 4 << 20
	var out string
	var code int
	for i := 0; i < 20; i++ { // iperf3 needs a moment to listen
		out, code = l.shunt("lab", "exec", "--external", "--", "iperf3", "-c", node1, "-p", "30201", "-R", "-n", fmt.Sprint(download))
		if code == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if code != 0 {
		t.Fatalf("iperf3 -R through node-1's NodePort: %s", out)
	}
	d1, d2 := uplinkBytes(t, ns1, node1).TX.Bytes-tx1, uplinkBytes(t, ns2, node2).TX.Bytes-tx2
	t.Logf("a %d-byte download through node-1: node-1's uplink sent %d bytes, node-2's %d", download, d1, d2)
	if d1 > download/4 || d2 < download {
		t.Errorf("node-1's uplink sent %d bytes and node-2's %d during a %d-byte download entering through node-1: "+
			"want the download to leave from node-2 (DSR), node-1 sending little more than ACKs", d1, d2, download)
	}
	// And the other way (the client sends 2 MB): the client's full-sized
	// packets no longer fit once encapsulated, and still arrive
	// (fragmentation needed, or GSO packets cut smaller).
	t.Logf("the download: %s", iperfSummary(out))
	// 16 MB, more than the client's socket buffer holds (tcp_wmem's 4 MB
	// at most): were the large packets lost (a PMTU black hole), the
	// client's writes would stall and node-2 (which every byte reaches,
	// by IPIP from node-1) receive no more than what fit before. When the
	// client's last write returns, all but its send buffer has been
	// acknowledged, so had crossed node-2's uplink; the rest may be cut
	// off when iperf3 closes. Counted at node-2's uplink, not by iperf3:
	// its server's count stops at the client's end message, which
	// overtakes whatever its receive buffer (tcp_rmem: up to 32 MB) still
	// holds; a CI run under load counted 10 of 16 MB.
	const upload, sendBuffer = 16 << 20, 4 << 20
	rx2 := uplinkBytes(t, ns2, node2).RX.Bytes
	if out, code := l.shunt("lab", "exec", "--external", "--", "iperf3", "-J", "-c", node1, "-p", "30201", "-n", fmt.Sprint(upload)); code != 0 {
		t.Errorf("iperf3 upload through node-1's NodePort: %s", out)
	} else {
		t.Logf("the upload: iperf3's server counted %d bytes", iperfReceived(t, out))
		var got uint64
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if got = uplinkBytes(t, ns2, node2).RX.Bytes - rx2; got >= upload-sendBuffer || time.Now().After(deadline) {
				break
			}
		}
		t.Logf("the upload: node-2's uplink received %d bytes", got)
		if got < upload-sendBuffer {
			t.Errorf("iperf3 upload through node-1's NodePort: node-2's uplink received %d bytes of a %d-byte upload, want at least %d",
				got, upload, upload-sendBuffer)
		}
	}

	// The ingress node: no NodePort reply counted, no reply entry for a
	// TCP flow (the reply leaves from the backend's node).
	if n := l.metric("shunt_datapath_packets_total", `reason="nodeport-reply"`); n != 0 {
		t.Errorf("node-1 counted %v NodePort replies, want none (DSR)", n)
	}
	if n := l.metric("shunt_datapath_packets_total", `reason="dsr-encap"`); n == 0 {
		t.Error("node-1 counted no dsr-encap")
	}
	if n := l.node(2).metric("shunt_datapath_packets_total", `reason="nodeport-reply"`); n == 0 {
		t.Error("node-2 counted no NodePort reply, want the backend's replies sent from there")
	}
	if n := l.node(2).metric("shunt_datapath_packets_total", `reason="dsr-decap"`); n == 0 {
		t.Error("node-2 counted no dsr-decap")
	}
	rows := nodePortNAT(t, l)
	for _, r := range rows {
		if r["direction"] == "reply" && r["protocol"] == "TCP" {
			t.Errorf("node-1 holds a TCP reply entry %v: want none with DSR", r)
		}
	}

	// UDP in hybrid mode: SNAT, its reply back through node-1.
	if out, code := l.shunt("lab", "exec", "--external", "--", filepath.Join(binDir, "shunt"), "lab", "probe", "--timeout", "2s",
		"--expect", "connected", "--udp", node1+":30053"); code != 0 {
		t.Errorf("UDP through node-1's NodePort: %s", out)
	}
	var udpReply bool
	for _, r := range nodePortNAT(t, l) {
		udpReply = udpReply || (r["direction"] == "reply" && r["protocol"] == "UDP")
	}
	if !udpReply {
		t.Errorf("node-1 holds no UDP reply entry after a UDP exchange: want SNAT for UDP in hybrid mode\n%v", rows)
	}
	if n := l.metric("shunt_datapath_packets_total", `reason="nodeport-reply"`); n == 0 {
		t.Error("node-1 counted no NodePort reply for the UDP flow (SNAT)")
	}

	dsrFragNeededFromOutside(t, l, ext, node1)
	dsrFromStranger(t, l, ext, node1, node2)

	// The route to the load balancer address moves from node-1 to node-2
	// in the middle of a connection: node-2 recorded the flow when it took
	// the first DSR packet, and translates the client's packets arriving
	// straight.
	lbIP := loadBalancerAddress(t, l, "lb")
	if lbIP == "" {
		t.Fatal("Service lb has no load balancer address")
	}
	var wg sync.WaitGroup
	var holdOut string
	var holdCode int
	wg.Add(1)
	go func() {
		defer wg.Done()
		holdOut, holdCode = l.shunt("lab", "exec", "--external", "--", filepath.Join(binDir, "shunt"), "lab", "probe", "--timeout", "2s",
			"--expect", "connected", "--hold", "4s", "--tcp", lbIP+":7000")
	}()
	// Moved once node-1 has the connection (its DSR entry), well within
	// the hold.
	waitFor(t, 3*time.Second, "node-1's DSR entry of the held connection", func() bool {
		for _, r := range nodePortNAT(t, l) {
			if r["direction"] == "to-backend-dsr" && r["to"] == lbIP+":7000" {
				return true
			}
		}
		return false
	})
	l.mustShunt("lab", "exec", "--external", "--", "ip", "route", "replace", lbIP, "via", node2)
	xlateBefore := l.node(2).metric("shunt_datapath_packets_total", `reason="nodeport-xlate"`)
	wg.Wait()
	if holdCode != 0 {
		t.Errorf("a TCP connection to %s held across the route's move from node-1 to node-2: %s", lbIP, holdOut)
	}
	if n := l.node(2).metric("shunt_datapath_packets_total", `reason="nodeport-xlate"`); n <= xlateBefore {
		t.Error("node-2 translated no client packet after the move")
	}

	flows := l.mustShunt("observe", "--last", "5000", "-o", "json")
	if !strings.Contains(flows, `"dsr-encap"`) {
		t.Errorf("node-1's flows name no dsr-encap (%d lines)", strings.Count(flows, "\n"))
	}
	if text := l.mustShunt("observe", "--last", "5000"); !strings.Contains(text, "DSR: IPIP to the backend's node") {
		t.Errorf("shunt observe on node-1 names no DSR flow (%d lines)", strings.Count(text, "\n"))
	}
}

// iperfSummary is iperf3's receiver line (the rate the data arrived at).
func iperfSummary(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(strings.TrimSpace(line), "receiver") {
			return strings.Join(strings.Fields(line), " ")
		}
	}
	return "(no receiver line)"
}

// iperfReceived is the bytes the server received, from iperf3 -J's output.
func iperfReceived(t *testing.T, out string) uint64 {
	t.Helper()
	var r struct {
		End struct {
			SumReceived struct {
				Bytes uint64 `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if i := strings.Index(out, "{"); i < 0 || json.Unmarshal([]byte(out[i:]), &r) != nil {
		t.Fatalf("iperf3 -J output is not JSON: %.300s", out)
	}
	return r.End.SumReceived.Bytes
}

// linkBytes are an interface's byte counters.
type linkBytes struct {
	RX struct{ Bytes uint64 } `json:"rx"`
	TX struct{ Bytes uint64 } `json:"tx"`
}

// uplinkBytes is what the interface holding addr in netns ns received and
// sent.
func uplinkBytes(t *testing.T, ns, addr string) linkBytes {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns, "-o", "-4", "addr", "show", "to", addr+"/32").CombinedOutput()
	f := strings.Fields(string(out))
	if err != nil || len(f) < 2 {
		t.Fatalf("ip -n %s addr show to %s: %v: %s", ns, addr, err, out)
	}
	dev := f[1]
	out, err = exec.Command("ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev).Output()
	var links []struct {
		Stats64 linkBytes `json:"stats64"`
	}
	if err != nil || json.Unmarshal(out, &links) != nil || len(links) != 1 {
		t.Fatalf("ip -n %s -s -j link show dev %s: %v: %s", ns, dev, err, out)
	}
	return links[0].Stats64
}

// nodePortNAT is node-1's shunt_nodeport_nat rows.
func nodePortNAT(t *testing.T, l *lab) []map[string]any {
	t.Helper()
	out := l.mustShunt("map", "dump", "shunt_nodeport_nat", "-o", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("map dump shunt_nodeport_nat -o json: %v\n%s", err, out)
	}
	return rows
}

// dsrFragNeededFromOutside: the external host opens a TCP connection to
// node-1's NodePort 30070 (by DSR to the echo server on node-2), then
// sends, from a raw socket, the ICMP fragmentation needed (MTU 1200) a
// router between node-2 and it would send about the server's next
// segment: from the NodePort to the client, the sequence number the
// server sends next (the client's receive queue's, read with TCP_REPAIR),
// as the kernel checks it. It is addressed to the NodePort, so it reaches
// node-1, which sends it on to node-2; translated there for the pod, it
// lowers the pod's route to the client to 1200 (its route cache).
func dsrFragNeededFromOutside(t *testing.T, l *lab, ext externalHost, node1 string) {
	t.Helper()
	const mtu, port = 1200, 30070
	routeToClient := func() string {
		out, _ := l.shunt("lab", "exec", "--node-privileges", "web", "--", "ip", "-4", "route", "get", ext.addr)
		return out
	}
	if out := routeToClient(); strings.Contains(out, fmt.Sprintf("mtu %d", mtu)) {
		t.Fatalf("the pod's route to the client already has MTU %d before the error:\n%s", mtu, out)
	}
	var conn *net.TCPConn
	err := netnsrun.Do("/run/netns/"+ext.netns, func() error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", node1, port), 3*time.Second)
		if err != nil {
			return err
		}
		conn = c.(*net.TCPConn)
		// One exchange: the connection is established on the server's
		// side and what it sent is here.
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 256)
		if _, err := conn.Write([]byte("x")); err != nil {
			return err
		}
		if _, err := conn.Read(buf); err != nil {
			return fmt.Errorf("the echo's answer: %w", err)
		}
		seq, err := receiveNext(conn)
		if err != nil {
			return err
		}
		quote := fragNeededQuote(netip.MustParseAddr(node1), netip.MustParseAddr(ext.addr), port,
			uint16(conn.LocalAddr().(*net.TCPAddr).Port), seq)
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		if err != nil {
			return fmt.Errorf("raw ICMP socket: %w", err)
		}
		defer unix.Close(fd)
		msg := append([]byte{3, 4, 0, 0, 0, 0, byte(mtu >> 8), byte(mtu & 0xff)}, quote...)
		binary.BigEndian.PutUint16(msg[2:], inetChecksum(msg))
		return unix.Sendto(fd, msg, 0, &unix.SockaddrInet4{Addr: netip.MustParseAddr(node1).As4()})
	})
	if conn != nil {
		defer conn.Close()
	}
	if err != nil {
		t.Fatalf("the external host's connection to %s:%d and its fragmentation needed: %v", node1, port, err)
	}
	waitFor(t, 3*time.Second, fmt.Sprintf("the backend pod's route to the client with MTU %d", mtu), func() bool {
		return strings.Contains(routeToClient(), fmt.Sprintf("mtu %d", mtu))
	})
	t.Logf("the backend pod's route to the client after the error: %s", strings.TrimSpace(routeToClient()))
}

// dsrFromStranger: node-2 takes DSR's IPIP from node-1 only (its
// shunt_dsr_nodes holds node-1's underlay address, not its own nor the
// external host's); the same IPIP from the external host, a host of the
// underlay that is no node (to node-2's underlay address, the option
// naming node-1's NodePort 30080, inside a SYN from an address of the
// cluster's pod range, 10.244.0.0/16, to port 8080), is dropped there as
// dsr-unknown-node, counted and seen in node-2's flows.
func dsrFromStranger(t *testing.T, l *lab, ext externalHost, node1, node2 string) {
	t.Helper()
	n2 := l.node(2)
	var rows []map[string]any
	out := n2.mustShunt("map", "dump", "shunt_dsr_nodes", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 || rows[0]["node"] != node1 {
		t.Errorf("node-2's shunt_dsr_nodes: %v, want node-1's %s only (%v)\n%s", rows, node1, err, out)
	}
	before := n2.metric("shunt_datapath_packets_total", `reason="dsr-unknown-node"`)
	pkt := dsrFrame(netip.MustParseAddr(ext.addr), netip.MustParseAddr(node2), netip.MustParseAddr(node1), 30080,
		netip.MustParseAddr("10.244.0.10"), netip.MustParseAddr(node2), 40999, 8080)
	err := netnsrun.Do("/run/netns/"+ext.netns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw IP socket: %w", err)
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: netip.MustParseAddr(node2).As4()})
	})
	if err != nil {
		t.Fatalf("the external host's IPIP to %s: %v", node2, err)
	}
	waitFor(t, 3*time.Second, "node-2 counting the external host's IPIP as dsr-unknown-node", func() bool {
		return n2.metric("shunt_datapath_packets_total", `reason="dsr-unknown-node"`) > before
	})
	if flows := n2.mustShunt("observe", "--last", "5000", "-o", "json"); !strings.Contains(flows, `"dsr-unknown-node"`) {
		t.Errorf("node-2's flows name no dsr-unknown-node (%d lines)", strings.Count(flows, "\n"))
	}
}

// dsrFrame is an IPv4 packet in DSR's wire format (bpf/lib/dsr.h): an
// outer header from outerSrc to outerDst, protocol IPIP, with the option
// naming svc:svcPort (type 0x9a, length 8), around a TCP SYN from
// src:sport to dst:dport.
func dsrFrame(outerSrc, outerDst, svc netip.Addr, svcPort uint16, src, dst netip.Addr, sport, dport uint16) []byte {
	inner := make([]byte, 40)
	inner[0] = 0x45
	binary.BigEndian.PutUint16(inner[2:], 40)
	inner[8], inner[9] = 64, 6
	s, d := src.As4(), dst.As4()
	copy(inner[12:], s[:])
	copy(inner[16:], d[:])
	binary.BigEndian.PutUint16(inner[10:], inetChecksum(inner[:20]))
	binary.BigEndian.PutUint16(inner[20:], sport)
	binary.BigEndian.PutUint16(inner[22:], dport)
	inner[32], inner[33] = 5<<4, 0x02 // data offset 5, SYN
	binary.BigEndian.PutUint16(inner[34:], 64240)
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 6, 0, 20)
	binary.BigEndian.PutUint16(inner[36:], inetChecksum(append(pseudo, inner[20:]...)))
	outer := make([]byte, 28)
	outer[0] = 0x47
	binary.BigEndian.PutUint16(outer[2:], uint16(28+len(inner)))
	binary.BigEndian.PutUint16(outer[6:], 0x4000)
	outer[8], outer[9] = 64, 4
	os, od, sv := outerSrc.As4(), outerDst.As4(), svc.As4()
	copy(outer[12:], os[:])
	copy(outer[16:], od[:])
	outer[20], outer[21] = 0x9a, 8
	binary.BigEndian.PutUint16(outer[22:], svcPort)
	copy(outer[24:], sv[:])
	binary.BigEndian.PutUint16(outer[10:], inetChecksum(outer))
	return append(outer, inner...)
}

// tcpRecvQueue is TCP_RECV_QUEUE (linux/tcp.h), which x/sys/unix lacks:
// the queue TCP_QUEUE_SEQ reads in repair mode.
const tcpRecvQueue = 1

// receiveNext is the next sequence number conn expects (its receive
// queue's, TCP_REPAIR): the one its peer sends next.
func receiveNext(conn *net.TCPConn) (uint32, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var seq int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 1); serr != nil {
			serr = fmt.Errorf("TCP_REPAIR (needs CAP_NET_ADMIN): %w", serr)
			return
		}
		defer unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 0)
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, tcpRecvQueue); serr != nil {
			return
		}
		seq, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	}); err != nil {
		return 0, err
	}
	return uint32(seq), serr
}

// fragNeededQuote is what an ICMP error quotes of a TCP segment from src
// to dst: its IPv4 header (DF, 1400 bytes long) and the first 8 bytes of
// its TCP header (ports and sequence number), as routers quote.
func fragNeededQuote(src, dst netip.Addr, sport, dport uint16, seq uint32) []byte {
	q := make([]byte, 28)
	q[0] = 0x45
	binary.BigEndian.PutUint16(q[2:], 1400)
	binary.BigEndian.PutUint16(q[6:], 0x4000)
	q[8], q[9] = 64, 6
	s, d := src.As4(), dst.As4()
	copy(q[12:], s[:])
	copy(q[16:], d[:])
	binary.BigEndian.PutUint16(q[10:], inetChecksum(q[:20]))
	binary.BigEndian.PutUint16(q[20:], sport)
	binary.BigEndian.PutUint16(q[22:], dport)
	binary.BigEndian.PutUint32(q[24:], seq)
	return q
}

// inetChecksum is the Internet checksum of b (RFC 1071).
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
