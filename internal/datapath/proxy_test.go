package datapath

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

var testProxyMark = ProxyMark{Magic: 0x0a000000, Mask: 0xff000000}

// TestL7Redirect: a connect to a destination with an L7 redirect reaches the
// proxy, and the proxy's getsockopt(SOL_IP, SO_ORIGINAL_DST) on the accepted
// socket answers with what the client dialled, which getpeername keeps
// showing the client; a socket carrying the proxy mark is not redirected;
// destinations without a redirect are untouched; each step is counted.
func TestL7Redirect(t *testing.T) {
	d := openMarkedDatapath(t)
	clientCg, proxyCg := testCgroup(t), testCgroup(t)
	if err := d.AttachSocketLB(clientCg); err != nil {
		t.Fatal(err)
	}
	if err := d.AttachProxy("test", proxyCg); err != nil {
		t.Fatal(err)
	}
	read := flowReader(t, d)
	proxy := startSockClient(t, proxyCg, "")
	client := startSockClient(t, clientCg, "")
	proxyAddr := origDstServer(proxy, "127.0.0.4:0")
	backend := listenTCP(client, "127.0.0.5:0")
	vip := netip.MustParseAddrPort("10.96.213.90:80")
	if err := d.SyncL7Redirects([]L7Redirect{{Dest: vip, Proxy: proxyAddr}, {Dest: backend, Proxy: proxyAddr}}); err != nil {
		t.Fatal(err)
	}
	if got, err := d.L7Redirects(); err != nil || len(got) != 2 {
		t.Fatalf("L7Redirects() = %v, %v; want the 2 entries", got, err)
	}

	before := counts(t, d)
	if ans, want := client.do("tcpline %s 0", vip), fmt.Sprintf("ok orig=%s peer=%s", vip, vip); ans != want {
		t.Errorf("connect to a redirected service address: %q, want %q", ans, want)
	}
	if ans, want := client.do("tcpline %s 0", backend), fmt.Sprintf("ok orig=%s peer=%s", backend, backend); ans != want {
		t.Errorf("connect to a redirected pod address: %q, want %q", ans, want)
	}
	counterDelta(t, d, before, map[string]uint64{"sock-to-proxy/connect": 2, "proxy-origin-answered/getsockopt": 2})

	// The proxy's own upstream connection: marked, so it reaches the
	// backend itself instead of looping back to the proxy.
	mark, _ := strconv.ParseUint("0a000105", 16, 32)
	before = counts(t, d)
	if ans, want := client.do("tcpline %s %d", backend, mark), "ok eof peer="+backend.String(); ans != want {
		t.Errorf("marked connect to a redirected address: %q, want %q (the backend closes without a line)", ans, want)
	}
	counterDelta(t, d, before, map[string]uint64{"sock-to-proxy/connect": 0, "sock-passed/connect": 1})

	// Nothing changes for a destination without a redirect.
	if err := d.SyncL7Redirects([]L7Redirect{{Dest: vip, Proxy: proxyAddr}}); err != nil {
		t.Fatal(err)
	}
	if ans, want := client.do("tcpline %s 0", backend), "ok eof peer="+backend.String(); ans != want {
		t.Errorf("connect after the redirect was removed: %q, want %q", ans, want)
	}
	expectFlow(t, read(), "REDIRECTED", "sock-to-proxy")

	// A connection no hook redirected gets the kernel's own answer: an
	// error, or the proxy's own address when netfilter tracks it.
	ans := proxy.do("tcpline %s 0", proxyAddr)
	if !strings.HasPrefix(ans, "ok err=") && ans != fmt.Sprintf("ok orig=%s peer=%s", proxyAddr, proxyAddr) {
		t.Errorf("SO_ORIGINAL_DST on a connection nothing redirected: %q", ans)
	}
}

// podCase is a packet a pod's veth program gets (shunt_to_pod when toPod,
// else shunt_from_pod) with an skb mark, and the verdict it must get.
type podCase struct {
	name    string
	toPod   bool
	pkt     []byte
	mark    uint32
	verdict uint32
}

// runPodCases runs each case in order, checking its verdict.
func runPodCases(t *testing.T, d *Datapath, cases []podCase) {
	t.Helper()
	for _, c := range cases {
		prog := d.objs.ShuntFromPod
		if c.toPod {
			prog = d.objs.ShuntToPod
		}
		// __sk_buff up to mark (len and pkt_type must stay zero).
		got, err := prog.Run(&ebpf.RunOptions{Data: c.pkt, Context: [3]uint32{0, 0, c.mark}})
		if err != nil {
			t.Fatal(err)
		}
		if got != c.verdict {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.verdict)
		}
	}
}

func openMarkedDatapath(t *testing.T) *Datapath {
	t.Helper()
	return openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, ProxyMark: testProxyMark}, nil)
}

func TestProxyMarkLayout(t *testing.T) {
	for _, bad := range []ProxyMark{{Magic: 0x1ff, Mask: 0xff}, {Magic: 0, Mask: 0xff000000}} {
		if err := bad.check(); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
	if err := testProxyMark.check(); err != nil {
		t.Error(err)
	}
}

func origDstServer(c *sockClient, addr string) netip.AddrPort {
	c.t.Helper()
	ans := c.do("origdst %s", addr)
	ap, err := netip.ParseAddrPort(strings.TrimPrefix(ans, "ok "))
	if err != nil {
		c.t.Fatalf("origdst %s: %s", addr, ans)
	}
	return ap
}

// serveOriginalDst (in the client process) accepts connections and writes
// each one line: "orig=ADDR" from getsockopt(SOL_IP, SO_ORIGINAL_DST), or
// "err=ERRNO".
func serveOriginalDst(addr string) string {
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		return errAnswer(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, originalDst(c.(*net.TCPConn)))
			c.Close()
		}
	}()
	return "ok " + l.Addr().String()
}

func originalDst(c *net.TCPConn) string {
	raw, err := c.SyscallConn()
	if err != nil {
		return "err=" + err.Error()
	}
	var mreq *unix.IPv6Mreq // 16 bytes, the size of a sockaddr_in, as iptables users ask
	var gerr error
	raw.Control(func(fd uintptr) { mreq, gerr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST) })
	if gerr != nil {
		return "err=" + unix.ErrnoName(gerr.(syscall.Errno))
	}
	b := mreq.Multiaddr
	port := uint16(b[2])<<8 | uint16(b[3])
	return "orig=" + netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port).String()
}

// tcpLine (in the client process) connects with an optional SO_MARK, reads
// one line and reports it with the peer getpeername gives.
func tcpLine(addr, markText string) string {
	mark, err := strconv.ParseUint(markText, 10, 32)
	if err != nil {
		return errAnswer(err)
	}
	dialer := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if mark != 0 {
			rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark)) })
		}
		return serr
	}}
	conn, err := dialer.Dial("tcp4", addr)
	if err != nil {
		return errAnswer(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil && line == "" {
		line = "eof"
	}
	peer := conn.RemoteAddr().String()
	return "ok " + strings.TrimSpace(line) + " peer=" + peer
}

// TestProxyLegsJudgedAsTheClient: the client's leg to the node proxy is
// admitted (and tracked) only when a socket hook sent it there, whatever
// the client's egress policy says of the node; the proxy's upstream leg,
// marked with the client's identity, gets the client's egress and the
// server's ingress policy as if the client had connected itself.
func TestProxyLegsJudgedAsTheClient(t *testing.T) {
	d := openMarkedDatapath(t)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	client, server, intruder := netip.MustParseAddr("10.98.0.10"), netip.MustParseAddr("10.98.0.11"), netip.MustParseAddr("10.98.0.12")
	node := netip.MustParseAddr("10.98.0.1")
	const idClient, idServer, idIntruder = 300, 301, 302
	eps := []Endpoint{
		{IP: client, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idClient, EgressIsolated: true},
		{IP: server, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idServer, IngressIsolated: true},
		{IP: intruder, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idIntruder},
	}
	allow := func(ep netip.Addr, egress bool, id uint32, port uint16) policy.Entry {
		return policy.Entry{Key: policy.Key{Endpoint: ep, Egress: egress, Identity: id, Proto: 6, Port: port, PortBits: 16},
			Verdict: policy.VerdictAllow, RuleID: 9}
	}
	state := policy.State{
		IPCache: []policy.PrefixIdentity{
			{Prefix: netip.PrefixFrom(client, 32), Identity: idClient}, {Prefix: netip.PrefixFrom(server, 32), Identity: idServer},
			{Prefix: netip.PrefixFrom(intruder, 32), Identity: idIntruder}, {Prefix: netip.PrefixFrom(node, 32), Identity: policy.IdentityHost},
		},
		Entries: []policy.Entry{
			allow(client, true, idServer, 80),                                      // the client may reach the server on 80 only
			allow(server, false, idClient, 80), allow(server, false, idClient, 82), // the server takes the client on 80 and 82
		},
	}
	if err := d.SyncPolicy(state, eps); err != nil {
		t.Fatal(err)
	}
	proxy := netip.AddrPortFrom(node, 15001)
	origin := sockopsProxyOriginKey{ClientIp: be32(client), ClientPort: be16(40000), ProxyIp: be32(node), ProxyPort: be16(proxy.Port())}
	if err := d.sockOps.ShuntProxyOrigins.Put(origin, sockopsProxyOrigin{Ip: be32(server), Port: be16(80)}); err != nil {
		t.Fatal(err)
	}
	// The same client dialled the server's port 82 (its egress does not
	// allow it) and a service address (judged on the upstream leg).
	origin.ClientPort = be16(40002)
	if err := d.sockOps.ShuntProxyOrigins.Put(origin, sockopsProxyOrigin{Ip: be32(server), Port: be16(82)}); err != nil {
		t.Fatal(err)
	}
	origin.ClientPort = be16(40003)
	if err := d.sockOps.ShuntProxyOrigins.Put(origin, sockopsProxyOrigin{Ip: be32(netip.MustParseAddr("10.96.0.10")), Port: be16(82)}); err != nil {
		t.Fatal(err)
	}
	// A pod's own proxy on 15006 receives what was dialled at 80 (allowed)
	// and at 81 (not allowed): policy judges the port dialled.
	for port, origPort := range map[uint16]uint16{40010: 80, 40011: 81} {
		k := sockopsProxyOriginKey{ClientIp: be32(client), ClientPort: be16(port), ProxyIp: be32(server), ProxyPort: be16(15006)}
		if err := d.sockOps.ShuntProxyOrigins.Put(k, sockopsProxyOrigin{Ip: be32(server), Port: be16(origPort)}); err != nil {
			t.Fatal(err)
		}
	}
	marked := func(id uint32) uint32 {
		m, _ := proxyapi.Mark{Magic: testProxyMark.Magic, Mask: testProxyMark.Mask}.For(id)
		return m
	}
	before := counts(t, d)
	runPodCases(t, d, []podCase{
		{"client -> proxy for server:80, redirected by the hook: admitted", false, packet(client, node, 6, tcpSegment(40000, 15001, tcpSYN)), 0, tcActOK},
		{"client -> proxy for server:82: dropped as the direct connection would be", false, packet(client, node, 6, tcpSegment(40002, 15001, tcpSYN)), 0, tcActShot},
		{"client -> proxy for a service: admitted, the upstream leg is judged", false, packet(client, node, 6, tcpSegment(40003, 15001, tcpSYN)), 0, tcActOK},
		{"client -> proxy port dialled by hand: the client's egress applies", false, packet(client, node, 6, tcpSegment(40001, 15001, tcpSYN)), 0, tcActShot},
		{"proxy -> server:80 for the client: allowed both ways", true, packet(node, server, 6, tcpSegment(50000, 80, tcpSYN)), marked(idClient), tcActOK},
		{"proxy -> server:82 for the client: the client's egress does not allow it", true, packet(node, server, 6, tcpSegment(50001, 82, tcpSYN)), marked(idClient), tcActShot},
		{"proxy -> server:80 for the intruder: the server's ingress does not allow it", true, packet(node, server, 6, tcpSegment(50002, 80, tcpSYN)), marked(idIntruder), tcActShot},
		{"node -> server:80 unmarked: the host, not allowed", true, packet(node, server, 6, tcpSegment(50003, 80, tcpSYN)), 0, tcActShot},
		{"client -> server's own proxy, dialled at 80: judged at 80", false, packet(client, server, 6, tcpSegment(40010, 15006, tcpSYN)), 0, tcActRedirect},
		{"client -> server's own proxy, dialled at 81: judged at 81", false, packet(client, server, 6, tcpSegment(40011, 15006, tcpSYN)), 0, tcActShot},
	})
	counterDelta(t, d, before, map[string]uint64{"proxy-admitted/from-pod": 2, "forwarded/to-pod": 1})
}

// TestProxyOriginalSource: the node proxy's upstream connection for a
// client tc steered to it leaves from the client's own address (original
// source, internal/proxy/upstream.go). At the pod's veth it is judged by
// that address, so an ipBlock (a CIDR identity, which no mark can carry)
// admits it as it admits the client without the proxy, where the same
// connection from the node's address is refused; its tracking entry says
// it is the proxy's (proxy-upstream), so the pod's answers, addressed to
// the client, go to the proxy's socket and never where the client's
// address routes: with no such socket (and BPF_PROG_TEST_RUN, where
// bpf_sk_assign refuses to assign) they are dropped as proxy-steer-failed.
// The pod's answers on an ordinary connection from the same address pass
// as before.
func TestProxyOriginalSource(t *testing.T) {
	d := openMarkedDatapath(t)
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	server, node := netip.MustParseAddr("10.98.1.11"), netip.MustParseAddr("10.98.1.1")
	outside, other := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("198.51.100.7")
	const idServer, idBlock = 301, policy.FirstCIDRIdentity + 4
	state := policy.State{
		IPCache: []policy.PrefixIdentity{
			{Prefix: netip.PrefixFrom(server, 32), Identity: idServer}, {Prefix: netip.PrefixFrom(node, 32), Identity: policy.IdentityHost},
		},
		CIDRIdentities: []policy.PrefixIdentity{{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Identity: idBlock}},
		Entries: []policy.Entry{{Key: policy.Key{Endpoint: server, Identity: idBlock, Proto: 6, Port: 8080, PortBits: 16},
			Verdict: policy.VerdictAllow, RuleID: 9}},
	}
	if err := d.SyncPolicy(state, []Endpoint{{IP: server, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: idServer, IngressIsolated: true}}); err != nil {
		t.Fatal(err)
	}
	world, _ := proxyapi.Mark{Magic: testProxyMark.Magic, Mask: testProxyMark.Mask}.For(policy.IdentityWorld)
	read := flowReader(t, d)
	before := counts(t, d)
	runPodCases(t, d, []podCase{
		{"proxy -> server:8080 from the node's address for an outside client: no address to match the ipBlock", true,
			packet(node, server, 6, tcpSegment(50000, 8080, tcpSYN)), world, tcActShot},
		{"proxy -> server:8080 from the outside client's address: the ipBlock admits it", true,
			packet(outside, server, 6, tcpSegment(50001, 8080, tcpSYN)), world, tcActOK},
		{"proxy -> server:8080 from an address outside the block: refused", true,
			packet(other, server, 6, tcpSegment(50002, 8080, tcpSYN)), world, tcActShot},
		{"server's SYN-ACK to the client's address: to the proxy's socket, none here: dropped", false,
			packet(server, outside, 6, tcpSegment(8080, 50001, tcpSYN|tcpACK)), 0, tcActShot},
		{"the client itself (unmarked) -> server:8080: admitted by the ipBlock", true,
			packet(outside, server, 6, tcpSegment(50003, 8080, tcpSYN)), 0, tcActOK},
		{"server's SYN-ACK on the client's own connection: to the stack as before", false,
			packet(server, outside, 6, tcpSegment(8080, 50003, tcpSYN|tcpACK)), 0, tcActOK},
	})
	counterDelta(t, d, before, map[string]uint64{"forwarded/to-pod": 2, "policy-not-allowed/to-pod": 2,
		"proxy-steer-failed/from-pod": 1, "to-stack/from-pod": 1})
	ctFlags := func(src netip.Addr, sport uint16) uint32 {
		var v podtcCtValue
		if err := d.objs.ShuntCtNew.Lookup(ctKeyOf(src, sport, server, 8080, 6), &v); err != nil {
			t.Fatalf("conntrack entry of %s:%d -> %s:8080: %v", src, sport, server, err)
		}
		return v.Flags
	}
	if f := ctFlags(outside, 50001); f&uint32(podtcCtFlagsCT_F_PROXY_UPSTREAM) == 0 {
		t.Errorf("the proxy's connection from the client's address: conntrack flags %s, want proxy-upstream", flagsText(f, ctFlagNames))
	}
	if f := ctFlags(outside, 50003); f&uint32(podtcCtFlagsCT_F_PROXY_UPSTREAM) != 0 {
		t.Errorf("the client's own connection: conntrack flags %s, want no proxy-upstream", flagsText(f, ctFlagNames))
	}
	expectFlow(t, read(), "DROPPED", "proxy-steer-failed")
}
