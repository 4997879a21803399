package labtools

import (
	"net"
	"strings"
	"testing"
	"time"
)

func startServer(t *testing.T) (tcp, udp, http string) {
	t.Helper()
	s, err := Start(ServeConfig{Name: "pod-a", TCP: []string{"127.0.0.1:0"}, UDP: []string{"127.0.0.1:0"}, HTTP: []string{"127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	a := s.Addrs() // tcp, http, udp
	return strings.TrimPrefix(a[0], "tcp "), strings.TrimPrefix(a[2], "udp "), "http://" + strings.TrimPrefix(a[1], "tcp ") + "/"
}

var opts = ProbeOptions{Timeout: time.Second, Send: "hello"}

func TestProbesConnectAndNameThePeer(t *testing.T) {
	tcp, udp, http := startServer(t)
	for _, r := range []Result{ProbeTCP(tcp, opts), ProbeUDP(udp, opts), ProbeHTTP(http, opts)} {
		if r.Result != Connected || r.Peer != "pod-a" {
			t.Errorf("%s %s: %+v", r.Proto, r.Target, r)
		}
	}
	if r := ProbeTCP(tcp, opts); r.Reply != "pod-a hello" {
		t.Errorf("tcp reply %q, want the name and the echo", r.Reply)
	}
	if r := ProbeUDP(udp, opts); r.Remote != udp {
		t.Errorf("udp reply came from %s, want %s", r.Remote, udp)
	}
}

func TestProbeRefusedAndTimeout(t *testing.T) {
	// A port nobody listens on: take one and close it.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l.Addr().String()
	l.Close()
	if r := ProbeTCP(closed, opts); r.Result != Refused {
		t.Errorf("tcp to closed port: %+v", r)
	}
	pc, _ := net.ListenPacket("udp", "127.0.0.1:0")
	closedUDP := pc.LocalAddr().String()
	pc.Close()
	if r := ProbeUDP(closedUDP, ProbeOptions{Timeout: time.Second, Send: "x", UDPConnected: true}); r.Result != Refused {
		t.Errorf("connected udp to closed port: %+v", r)
	}

	// A UDP socket that never answers, and a TCP server that never replies.
	silent, _ := net.ListenPacket("udp", "127.0.0.1:0")
	defer silent.Close()
	short := ProbeOptions{Timeout: 200 * time.Millisecond, Send: "x"}
	start := time.Now()
	if r := ProbeUDP(silent.LocalAddr().String(), short); r.Result != Timeout {
		t.Errorf("silent udp: %+v", r)
	}
	mute, _ := net.Listen("tcp", "127.0.0.1:0")
	defer mute.Close()
	if r := ProbeTCP(mute.Addr().String(), short); r.Result != Timeout || !strings.Contains(r.Error, "connected but no reply") {
		t.Errorf("mute tcp: %+v", r)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("timeouts took %s", d)
	}
}

func TestSummaryCountsOutcomesAndPeers(t *testing.T) {
	rs := []Result{
		{Proto: "tcp", Target: "t", Result: Connected, Peer: "a"},
		{Proto: "tcp", Target: "t", Result: Connected, Peer: "b"},
		{Proto: "tcp", Target: "t", Result: Connected, Peer: "a"},
		{Proto: "tcp", Target: "t", Result: Timeout},
	}
	if got, want := Summary(rs), "tcp t: 3 connected, 1 timeout (a 2, b 1)"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}
