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

	"golang.org/x/sys/unix"
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

func openMarkedDatapath(t *testing.T) *Datapath {
	t.Helper()
	requireBPF(t)
	pinDir := "/sys/fs/bpf/" + testName("shunt-test-l7")
	d, err := open(Config{PinDir: pinDir, Mode: ModeRedirectPeer, ProxyMark: testProxyMark}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		if err := Uninstall(pinDir); err != nil {
			t.Error(err)
		}
	})
	return d
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
