package datapath

import (
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"

	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/podnet"
)

// The tests below run a client process (this test binary, re-executed) in a
// cgroup of their own that has the socket hooks attached, so only its
// sockets are translated. The parent plays the agent: it changes services
// and calls DestroyUDPSockets; the client reports what its sockets see.

var testDNSVIP = netip.MustParseAddrPort("10.96.213.53:53")

// TestDestroyUDPSocketsOfGoneBackend: sockets steered to a removed backend
// are destroyed (IPv4, and IPv6 through a v4-mapped address), and nothing
// else is: not a socket connected to the same backend address directly,
// not one steered to the backend that stays, not an unconnected socket that
// sent to the service. Both ways to destroy them: bpf_sock_destroy in the
// socket iterator, and the sock-diag fallback.
func TestDestroyUDPSocketsOfGoneBackend(t *testing.T) {
	forEachSockDestroyMode(t, testDestroyUDPSocketsOfGoneBackend)
}

func testDestroyUDPSocketsOfGoneBackend(t *testing.T, fallbacks dpinfo.Fallbacks) {
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, Fallbacks: fallbacks}, nil)
	cg := testCgroup(t)
	if err := d.AttachSocketLB(cg); err != nil {
		t.Fatal(err)
	}
	c := startSockClient(t, cg, "")
	a := c.listen("a", "127.0.0.2:0")
	b := c.listen("b", "127.0.0.3:0")

	syncDNS(t, d, a)
	c.expect(a, "dial s4 4 %s", testDNSVIP)
	c.expect(a, "dial s6 6 %s", testDNSVIP)
	c.expect(a, "sendto u %s", testDNSVIP)

	syncDNS(t, d, b) // a's pod is deleted
	c.expect(b, "dial kept 4 %s", testDNSVIP)
	c.expect(a, "dial direct 4 %s", a)
	// Without the fix, the connected sockets keep talking to a forever.
	c.expect(a, "check s4")

	// More gone backends than the map holds, a last: they go in batches.
	var gone []netip.AddrPort
	for i := range 1500 {
		gone = append(gone, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 254, byte(i >> 8), byte(i)}), 53))
	}
	gone = append(gone, a)
	start := time.Now()
	n, err := d.DestroyUDPSockets([]string{""}, gone)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("destroyed %d sockets in the host namespace in %v (%d gone backends)", n, time.Since(start), len(gone))
	if n != 2 {
		t.Errorf("destroyed %d sockets, want 2 (s4, s6)", n)
	}
	c.expectErrno(unix.ECONNABORTED, "check s4")
	c.expectErrno(unix.ECONNABORTED, "check s6")
	// The socket is disconnected too: a send without an address fails.
	c.expectErrno(unix.EDESTADDRREQ, "send s4")
	c.expect(b, "check kept")
	c.expect(a, "check direct")
	c.expect(b, "check u") // unconnected: the service's live backend
	c.expect(b, "dial s4again 4 %s", testDNSVIP)

	if !fallbacks.Has(dpinfo.FallbackSockDiag) {
		if n := countGoneBackends(t, d); n != 0 {
			t.Errorf("shunt_gone_backends holds %d entries after the run, want 0", n)
		}
	}
	// Nothing left to destroy: the destroyed sockets are not seen twice.
	if n, err := d.DestroyUDPSockets([]string{""}, []netip.AddrPort{a}); err != nil || n != 0 {
		t.Errorf("second run: destroyed %d, %v; want 0, nil", n, err)
	}
}

// TestDestroyUDPSocketsHonoursNetns: the iterator walks only the namespaces
// it is given; a namespace path that is gone is skipped. Both ways.
func TestDestroyUDPSocketsHonoursNetns(t *testing.T) {
	forEachSockDestroyMode(t, testDestroyUDPSocketsHonoursNetns)
}

func testDestroyUDPSocketsHonoursNetns(t *testing.T, fallbacks dpinfo.Fallbacks) {
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, Fallbacks: fallbacks}, nil)
	cg := testCgroup(t)
	if err := d.AttachSocketLB(cg); err != nil {
		t.Fatal(err)
	}
	ns := testNetns(t)
	c := startSockClient(t, cg, ns)
	a := c.listen("a", "127.0.0.2:0")
	b := c.listen("b", "127.0.0.3:0")
	syncDNS(t, d, a)
	c.expect(a, "dial s4 4 %s", testDNSVIP)
	syncDNS(t, d, b)

	missing := filepath.Join("/run/netns", "shunt-test-missing-"+filepath.Base(t.TempDir()))
	n, err := d.DestroyUDPSockets([]string{"", missing}, []netip.AddrPort{a})
	if err != nil || n != 0 {
		t.Fatalf("host namespace and a missing one: destroyed %d, %v; want 0, nil", n, err)
	}
	c.expect(a, "check s4") // in another namespace: untouched

	n, err = d.DestroyUDPSockets([]string{missing, ns}, []netip.AddrPort{a})
	if err != nil || n != 1 {
		t.Fatalf("client namespace: destroyed %d, %v; want 1, nil", n, err)
	}
	c.expectErrno(unix.ECONNABORTED, "check s4")
	c.expect(b, "dial s4again 4 %s", testDNSVIP)
}

// forEachSockDestroyMode runs a test of DestroyUDPSockets with the socket
// iterator (bpf_sock_destroy) and with the sock-diag fallback.
func forEachSockDestroyMode(t *testing.T, test func(*testing.T, dpinfo.Fallbacks)) {
	for _, m := range []struct {
		name      string
		fallbacks dpinfo.Fallbacks
	}{
		{"bpf_sock_destroy", nil},
		{"sock-diag", dpinfo.Fallbacks{dpinfo.FallbackSockDiag: true}},
	} {
		t.Run(m.name, func(t *testing.T) {
			if m.fallbacks == nil {
				requireKernelFeature(t, dpinfo.FallbackSockDiag)
			}
			test(t, m.fallbacks)
		})
	}
}

func TestGoneBackendKeys(t *testing.T) {
	a := netip.MustParseAddrPort("10.0.0.1:53")
	keys := goneBackendKeys([]netip.AddrPort{
		a, a, // duplicates once
		netip.MustParseAddrPort("[::ffff:10.0.0.1]:53"), // the same, v4-mapped
		netip.MustParseAddrPort("[fd00::1]:53"),         // no IPv4 service translates to it
		netip.MustParseAddrPort("10.0.0.1:54"),          // another port
	})
	want := []sockdestroyGoneBackend{
		{Ip: be32(a.Addr()), Port: be16(53), Proto: protoUDP},
		{Ip: be32(a.Addr()), Port: be16(54), Proto: protoUDP},
	}
	if len(keys) != len(want) || keys[0] != want[0] || keys[1] != want[1] {
		t.Errorf("keys %+v, want %+v", keys, want)
	}
}

func syncDNS(t *testing.T, d *Datapath, backends ...netip.AddrPort) {
	t.Helper()
	s := services.Port{Frontend: services.Frontend{VIP: testDNSVIP.Addr(), Port: testDNSVIP.Port(), Proto: protoUDP}, Name: "kube-system/dns:53"}
	for _, b := range backends {
		s.Backends = append(s.Backends, services.Backend{IP: b.Addr(), Port: b.Port()})
	}
	if _, err := d.SyncServices([]services.Port{s}); err != nil {
		t.Fatal(err)
	}
}

func countGoneBackends(t *testing.T, d *Datapath) int {
	t.Helper()
	var k sockdestroyGoneBackend
	var v uint8
	n := 0
	it := d.destroyer.objs.ShuntGoneBackends.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

var testSeq atomic.Int64

func testName(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), testSeq.Add(1))
}

// testCgroup creates a cgroup v2 directory for the test's client and
// removes it (killing what is left in it) when the test ends.
func testCgroup(t *testing.T) string {
	t.Helper()
	root, err := cgroup.Root()
	if err != nil {
		t.Skip(err)
	}
	path := filepath.Join(root, testName("shunt-test-sockdestroy"))
	if err := cgroup.Create(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cgroup.Remove(path); err != nil {
			t.Error(err)
		}
	})
	return path
}

// testNetns creates a named network namespace with lo up and deletes it
// when the test ends; it returns its path. podnet creates it, as the lab's
// pods': /run/netns made a shared mount of itself first, as iproute2 does,
// so that an `ip netns` run meanwhile cannot hide it (and make it
// undeletable, EBUSY).
func testNetns(t testing.TB) string {
	t.Helper()
	name := testName("shunt-test-sd")
	if err := podnet.CreateNetns(name, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := podnet.DeleteNetns(name); err != nil {
			t.Error(err)
		}
	})
	ns, err := netns.GetFromPath(podnet.NetnsPath(name))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("setting lo up in network namespace %s: %v", name, err)
	}
	return podnet.NetnsPath(name)
}

// sockClient drives the client process over its stdin and stdout: one
// command a line, one answer a line ("ok ..." or "err ERRNO").
type sockClient struct {
	t      *testing.T
	stdin  io.WriteCloser
	lines  chan string
	stderr *bytes.Buffer
}

const sockClientEnv = "SHUNT_TEST_SOCK_CLIENT"

// startSockClient runs the client in cgroup cg and network namespace
// netnsPath ("" for this process's own) and stops it when the test ends.
func startSockClient(t *testing.T, cg, netnsPath string) *sockClient {
	t.Helper()
	cgfd, err := unix.Open(cg, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(cgfd)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSockClientProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), sockClientEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgfd}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &sockClient{t: t, lines: make(chan string), stderr: &bytes.Buffer{}}
	cmd.Stderr = c.stderr
	// The child starts in the namespace of the thread that forks it.
	if err := netnsrun.Do(netnsPath, cmd.Start); err != nil {
		t.Fatalf("starting the client: %v", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		stdin.Close() // the client exits at EOF
		done := make(chan error, 1)
		go func() { wg.Wait(); done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill() // the process this test started, by its PID
			<-done
		}
		if t.Failed() && c.stderr.Len() > 0 {
			t.Logf("client stderr:\n%s", c.stderr)
		}
	})
	c.stdin = stdin
	return c
}

func (c *sockClient) do(format string, args ...any) string {
	c.t.Helper()
	cmd := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(c.stdin, cmd); err != nil {
		c.t.Fatalf("%s: %v (stderr: %s)", cmd, err, c.stderr)
	}
	select {
	case line, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("%s: the client exited (stderr: %s)", cmd, c.stderr)
		}
		return line
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s: no answer from the client", cmd)
	}
	return ""
}

func (c *sockClient) listen(name, addr string) netip.AddrPort {
	c.t.Helper()
	ans := c.do("listen %s %s", name, addr)
	ap, err := netip.ParseAddrPort(strings.TrimPrefix(ans, "ok "))
	if err != nil {
		c.t.Fatalf("listen %s: %s", addr, ans)
	}
	return ap
}

// expect runs a command that exchanges a datagram and checks which backend
// answered.
func (c *sockClient) expect(backend netip.AddrPort, format string, args ...any) {
	c.t.Helper()
	if ans, want := c.do(format, args...), "ok "+backend.String(); ans != want {
		c.t.Errorf("%s: %q, want %q", fmt.Sprintf(format, args...), ans, want)
	}
}

func (c *sockClient) expectErrno(errno unix.Errno, format string, args ...any) {
	c.t.Helper()
	if ans, want := c.do(format, args...), "err "+unix.ErrnoName(errno); ans != want {
		c.t.Errorf("%s: %q, want %q", fmt.Sprintf(format, args...), ans, want)
	}
}

// TestSockClientProcess is no test: it is the client process that
// startSockClient runs.
func TestSockClientProcess(t *testing.T) {
	if os.Getenv(sockClientEnv) != "1" {
		t.Skip("the client process of the DestroyUDPSockets tests")
	}
	if err := runSockClient(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// clientSock is one of the client's sockets: connected (to is invalid) or
// unconnected, sending to to.
type clientSock struct {
	conn *net.UDPConn
	to   netip.AddrPort
}

// runSockClient serves the commands:
//
//	listen NAME ADDR        an echo server answering with its own address
//	dial NAME 4|6 ADDR      a connected AF_INET or AF_INET6 (v4-mapped) socket; exchange
//	sendto NAME ADDR        an unconnected socket sending to ADDR; exchange
//	check NAME              report a pending socket error, else exchange again
//	send NAME               send a datagram, nothing else ("ok" or the error)
//	listentcp ADDR          a TCP server that accepts and closes connections
//	tcp ADDR                a TCP connect; answers with what getpeername says
//	tcpfrom SRC ADDR        tcp from a socket bound to the address SRC
//	origdst ADDR            a TCP server writing each connection what SO_ORIGINAL_DST says
//	tcpline ADDR MARK       a TCP connect with SO_MARK MARK (0: none); answers with the line read
//	                        and what getpeername says
//
// An exchange sends a datagram and answers with the reply ("ok BACKEND").
func runSockClient(in *os.File, out *os.File) error {
	socks := map[string]clientSock{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var ans string
		switch {
		case len(f) == 3 && f[0] == "listen":
			l, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(f[2])))
			if err != nil {
				ans = errAnswer(err)
				break
			}
			go echo(l)
			ans = "ok " + l.LocalAddr().String()
		case len(f) == 4 && f[0] == "dial":
			conn, err := dialUDP(f[2], netip.MustParseAddrPort(f[3]))
			if err != nil {
				ans = errAnswer(err)
				break
			}
			socks[f[1]] = clientSock{conn: conn}
			ans = exchange(socks[f[1]])
		case len(f) == 3 && f[0] == "sendto":
			conn, err := net.ListenUDP("udp4", nil)
			if err != nil {
				ans = errAnswer(err)
				break
			}
			socks[f[1]] = clientSock{conn: conn, to: netip.MustParseAddrPort(f[2])}
			ans = exchange(socks[f[1]])
		case len(f) == 2 && f[0] == "check":
			s, ok := socks[f[1]]
			if !ok {
				return fmt.Errorf("no socket %s", f[1])
			}
			// A destroyed socket has its error pending: the next read
			// returns it at once. A live one has nothing to read.
			s.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if _, _, err := s.conn.ReadFromUDPAddrPort(make([]byte, 64)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				ans = errAnswer(err)
				break
			}
			ans = exchange(s)
		case len(f) == 2 && f[0] == "send":
			s, ok := socks[f[1]]
			if !ok {
				return fmt.Errorf("no socket %s", f[1])
			}
			ans = "ok"
			if _, err := s.conn.Write([]byte("ping")); err != nil {
				ans = errAnswer(err)
			}
		case len(f) == 2 && f[0] == "listentcp":
			l, err := net.Listen("tcp4", f[1])
			if err != nil {
				ans = errAnswer(err)
				break
			}
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			ans = "ok " + l.Addr().String()
		case len(f) == 2 && f[0] == "tcp":
			ans = tcpPeer(f[1])
		case len(f) == 3 && f[0] == "tcpfrom":
			ans = tcpPeerFrom(f[1], f[2])
		case len(f) == 2 && f[0] == "origdst":
			ans = serveOriginalDst(f[1])
		case len(f) == 3 && f[0] == "tcpline":
			ans = tcpLine(f[1], f[2])
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
		if _, err := fmt.Fprintln(out, ans); err != nil {
			return err
		}
	}
	return sc.Err()
}

// dialUDP connects a UDP socket of the given family; "6" is a dual-stack
// AF_INET6 socket connected to the v4-mapped address, as resolvers bound
// to :: use.
func dialUDP(family string, to netip.AddrPort) (*net.UDPConn, error) {
	if family == "4" {
		return net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
	}
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "udp6")
	defer f.Close()
	if err := unix.Connect(fd, &unix.SockaddrInet6{Addr: to.Addr().As16(), Port: int(to.Port())}); err != nil {
		return nil, err
	}
	c, err := net.FileConn(f) // a duplicate of fd: the same socket
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

// tcpPeer connects to addr and answers with the peer getpeername reports:
// the service address when the connect was translated.
func tcpPeer(addr string) string { return tcpPeerFrom("", addr) }

// tcpPeerFrom is tcpPeer from a socket bound to src ("": unbound).
func tcpPeerFrom(src, addr string) string {
	dialer := net.Dialer{Timeout: 2 * time.Second}
	if src != "" {
		dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	conn, err := dialer.Dial("tcp4", addr)
	if err != nil {
		return errAnswer(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		return errAnswer(err)
	}
	var sa unix.Sockaddr
	if cerr := raw.Control(func(fd uintptr) { sa, err = unix.Getpeername(int(fd)) }); cerr != nil {
		return errAnswer(cerr)
	}
	if err != nil {
		return errAnswer(err)
	}
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return fmt.Sprintf("err peer_%T", sa)
	}
	return "ok " + netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)).String()
}

func exchange(s clientSock) string {
	var err error
	if s.to.IsValid() {
		_, err = s.conn.WriteToUDPAddrPort([]byte("ping"), s.to)
	} else {
		_, err = s.conn.Write([]byte("ping"))
	}
	if err != nil {
		return errAnswer(err)
	}
	buf := make([]byte, 64)
	s.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, from, err := s.conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		return errAnswer(err)
	}
	if s.to.IsValid() && from != s.to {
		// The reply must come from the address the socket sent to:
		// resolvers drop anything else.
		return fmt.Sprintf("err reply from %s, not %s", from, s.to)
	}
	return "ok " + string(buf[:n])
}

func echo(l *net.UDPConn) {
	buf := make([]byte, 64)
	me := []byte(l.LocalAddr().String())
	for {
		_, from, err := l.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		l.WriteToUDPAddrPort(me, from)
	}
}

func errAnswer(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return "err " + unix.ErrnoName(errno)
	}
	return "err " + strings.ReplaceAll(err.Error(), " ", "_")
}

// TestSocketHooksLeaveForeignNamespacesAlone: the hooks sit on the cgroup
// root, so they see every process of the machine; once the agent has said
// which namespace is the node's, a socket of a namespace that is neither
// the node's nor a pod's keeps the address it dialled (another shunt
// node's pods, a test's namespace, kube-proxy's), and the same namespace
// registered as a pod's gets services.
func TestSocketHooksLeaveForeignNamespacesAlone(t *testing.T) {
	d := openTestDatapath(t, ModeRedirectPeer)
	cg := testCgroup(t)
	if err := d.AttachSocketLB(cg); err != nil {
		t.Fatal(err)
	}
	if err := d.SetAccel(AccelConfig{}); err != nil { // writes the node's namespace
		t.Fatal(err)
	}
	ns := testNetns(t)
	c := startSockClient(t, cg, ns)
	a := c.listen("a", "127.0.0.2:0")
	syncDNS(t, d, a)
	before := counts(t, d)
	c.expectErrno(unix.ENETUNREACH, "dial foreign 4 %s", testDNSVIP)
	counterDelta(t, d, before, map[string]uint64{"sock-foreign-netns/connect": 1})

	if err := d.SyncPolicy(policy.State{}, []Endpoint{{IP: netip.MustParseAddr("10.99.0.5"), Ifindex: 1, Netns: ns}}); err != nil {
		t.Fatal(err)
	}
	c.expect(a, "dial pod 4 %s", testDNSVIP)
}
