package delayline

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/netnsrun"
)

// wire is two hosts (network namespaces) whose only link runs through a
// delay line in a third: host A's a0 - a1 [line] b1 - host B's b0.
type wire struct {
	a, b, line string // namespace names
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

func newWire(t *testing.T) wire {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	id := fmt.Sprintf("dl%d", os.Getpid()%100000)
	w := wire{a: id + "-a", b: id + "-b", line: id + "-l"}
	for _, ns := range []string{w.a, w.b, w.line} {
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipCmd(t, "-n", w.a, "link", "add", "a0", "type", "veth", "peer", "name", "a1", "netns", w.line)
	ipCmd(t, "-n", w.b, "link", "add", "b0", "type", "veth", "peer", "name", "b1", "netns", w.line)
	ipCmd(t, "-n", w.a, "addr", "add", "10.250.0.1/24", "dev", "a0")
	ipCmd(t, "-n", w.b, "addr", "add", "10.250.0.2/24", "dev", "b0")
	for _, l := range [][2]string{{w.a, "a0"}, {w.b, "b0"}, {w.line, "a1"}, {w.line, "b1"}} {
		ipCmd(t, "-n", l[0], "link", "set", l[1], "up")
	}
	return w
}

// inNetns returns what open makes (a socket) inside namespace ns, where
// the socket stays; a failure ends the test.
func inNetns[T any](t *testing.T, ns string, open func() (T, error)) T {
	t.Helper()
	var v T
	err := netnsrun.Do("/run/netns/"+ns, func() (err error) {
		v, err = open()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// listen opens a TCP listener in namespace ns.
func listen(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	ln := inNetns(t, ns, func() (net.Listener, error) { return net.Listen("tcp4", addr) })
	t.Cleanup(func() { ln.Close() })
	return ln
}

func dial(t *testing.T, ns, addr string) net.Conn {
	t.Helper()
	c := inNetns(t, ns, func() (net.Conn, error) { return net.DialTimeout("tcp4", addr, 10*time.Second) })
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLineDelaysEveryCrossing: a round trip through the line takes at
// least twice its delay (and, loosely, not much more: frames are not held
// beyond their time), both ways, ARP included.
func TestLineDelaysEveryCrossing(t *testing.T) {
	w := newWire(t)
	const delay = 3 * time.Millisecond
	l, err := Start("/run/netns/"+w.line, "a1", "b1", delay)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	ln := listen(t, w.b, "10.250.0.2:7000")
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	c := dial(t, w.a, "10.250.0.2:7000")
	var rtts []time.Duration
	buf := make([]byte, 8)
	for range 30 {
		start := time.Now()
		if _, err := c.Write([]byte("ping1234")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	t.Logf("round trips through a %v line: min %v, median %v, max %v", delay, rtts[0], rtts[len(rtts)/2], rtts[len(rtts)-1])
	if rtts[0] < 2*delay {
		t.Errorf("fastest round trip %v: below twice the line's delay (%v): a frame crossed early", rtts[0], 2*delay)
	}
	// Generous: a loaded CI machine may hold a thread; a line that queued
	// frames behind its timer's millisecond (or lost them) would not pass.
	if med := rtts[len(rtts)/2]; med > 2*delay+20*time.Millisecond {
		t.Errorf("median round trip %v: far above twice the delay", med)
	}
	passed, dropped := l.Stats()
	if passed[0] == 0 || passed[1] == 0 || dropped != [2]uint64{} {
		t.Errorf("frames passed %v, dropped %v: want both directions used, none dropped", passed, dropped)
	}
}

// TestLineCarriesBulkIntact: a TCP stream with the veths' segmentation
// offload on (64 KiB GSO frames) crosses whole: every byte arrives, in
// order, and the line took fewer frames than 1500-byte packets.
func TestLineCarriesBulkIntact(t *testing.T) {
	w := newWire(t)
	l, err := Start("/run/netns/"+w.line, "a1", "b1", 200*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	data := make([]byte, 32<<20)
	rand.Read(data)
	want := sha256.Sum256(data)
	ln := listen(t, w.b, "10.250.0.2:7001")
	got := make(chan [32]byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- [32]byte{}
			return
		}
		defer c.Close()
		h := sha256.New()
		io.Copy(h, c)
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		got <- sum
	}()
	c := dial(t, w.a, "10.250.0.2:7001")
	if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	select {
	case sum := <-got:
		if sum != want {
			t.Fatal("the stream arrived changed or short")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the stream did not arrive in 60 s")
	}
	passed, dropped := l.Stats()
	t.Logf("32 MiB: %d frames a to b, %d b to a, dropped %v", passed[0], passed[1], dropped)
	if passed[0] >= uint64(len(data)/1448) {
		t.Errorf("%d frames for %d bytes: GSO frames were split (or never formed) on the way", passed[0], len(data))
	}
}

func TestStartRefusesBadInput(t *testing.T) {
	if _, err := Start("", "lo", "lo", 0); err == nil {
		t.Error("a zero delay was accepted")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for packet sockets")
	}
	if _, err := Start("", "lo", "no-such-ifc0", time.Millisecond); err == nil {
		t.Error("a missing interface was accepted")
	}
}

// TestLineKeepsABurstsSpacing: frames that arrive while the line holds
// an earlier one keep their own arrival time (the kernel's timestamp),
// so a burst leaves one delay late as a whole, not one delay per frame.
func TestLineKeepsABurstsSpacing(t *testing.T) {
	w := newWire(t)
	const delay, burst = 5 * time.Millisecond, 20
	l, err := Start("/run/netns/"+w.line, "a1", "b1", delay)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	rx := inNetns(t, w.b, func() (net.PacketConn, error) { return net.ListenPacket("udp4", "10.250.0.2:7002") })
	defer rx.Close()
	tx := inNetns(t, w.a, func() (net.PacketConn, error) { return net.ListenPacket("udp4", "10.250.0.1:0") })
	defer tx.Close()
	to := &net.UDPAddr{IP: net.IPv4(10, 250, 0, 2), Port: 7002}
	// The first datagram resolves the neighbour (ARP crosses the line
	// too); the burst follows once it is through.
	tx.WriteTo([]byte("hello"), to)
	buf := make([]byte, 64)
	rx.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := rx.ReadFrom(buf); err != nil {
		t.Fatalf("the first datagram did not cross: %v", err)
	}
	start := time.Now()
	for range burst {
		if _, err := tx.WriteTo([]byte("burst"), to); err != nil {
			t.Fatal(err)
		}
	}
	for i := range burst {
		if _, _, err := rx.ReadFrom(buf); err != nil {
			t.Fatalf("datagram %d of the burst: %v", i, err)
		}
	}
	took := time.Since(start)
	t.Logf("a burst of %d through a %v line took %v", burst, delay, took)
	if took < delay {
		t.Errorf("the burst crossed in %v, under the delay", took)
	}
	// One delay per frame would be 100 ms.
	if took > burst*delay/2 {
		t.Errorf("the burst took %v: frames were delayed one after another, not each from its arrival", took)
	}
}
