package labtools

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// addrs maps "tcp", "udp", "http" to the server's loopback address.
func startServer(t *testing.T, name string) map[string]string {
	t.Helper()
	lo := []string{"127.0.0.1:0"}
	s, err := Start(ServeConfig{Name: name, TCP: lo, UDP: lo, HTTP: lo})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	m := map[string]string{}
	for _, a := range s.Addrs() {
		proto, addr, _ := strings.Cut(a, " ")
		m[proto] = addr
	}
	if len(m) != 3 {
		t.Fatalf("addrs %v", s.Addrs())
	}
	return m
}

var opts = ProbeOptions{Timeout: time.Second, Send: "hello"}

func TestProbesConnectAndNameThePeer(t *testing.T) {
	a := startServer(t, "pod-a")
	for _, udpConnected := range []bool{false, true} {
		o := opts
		o.UDPConnected = udpConnected
		for _, r := range []Result{Probe("tcp", a["tcp"], o), Probe("udp", a["udp"], o), Probe("http", "http://"+a["http"]+"/x", o)} {
			if r.Result != Connected || r.Peer != "pod-a" || r.Error != "" {
				t.Errorf("%s %s: %+v", r.Proto, r.Target, r)
			}
			if r.Proto != "http" && r.Reply != "pod-a hello" {
				t.Errorf("%s reply %q, want the name and the echo", r.Proto, r.Reply)
			}
			// The peer address the application sees: getpeername, or
			// for unconnected UDP where the reply came from.
			if want := strings.TrimPrefix(strings.TrimSuffix(r.Target, "/x"), "http://"); r.Remote != want {
				t.Errorf("%s remote %q, want %q", r.Proto, r.Remote, want)
			}
			if r.Local == "" {
				t.Errorf("%s: no local address", r.Proto)
			}
		}
	}
	if r := ProbeHTTP("http://"+a["http"]+"/", opts); r.Status != 200 || r.Reply != "pod-a" {
		t.Errorf("http: %+v", r)
	}
}

func TestServerProtocol(t *testing.T) {
	a := startServer(t, "pod-a")

	// TCP: no banner; every read is answered on the same connection.
	c, err := net.Dial("tcp", a["tcp"])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(buf); n != 0 || !isTimeout(err) {
		t.Errorf("read before sending: %d bytes, %v; want nothing", n, err)
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	for _, msg := range []string{"one", "two"} {
		c.Write([]byte(msg))
		n, err := c.Read(buf)
		if got := string(buf[:n]); err != nil || got != "pod-a "+msg {
			t.Errorf("reply %q, %v", got, err)
		}
	}

	// HTTP: the header on every path, /healthz says ok.
	resp, err := http.Get("http://" + a["http"] + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "ok" || resp.Header.Get("X-Shunt-Pod") != "pod-a" {
		t.Errorf("healthz: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestStartFailsOnBusyPortAndNamesIt(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, err = Start(ServeConfig{Name: "x", UDP: []string{"127.0.0.1:0"}, TCP: []string{busy.Addr().String()}})
	if err == nil || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Errorf("start on a busy port: %v", err)
	}
}

func TestProbeRefusedAndTimeout(t *testing.T) {
	// A port nobody listens on: take one and close it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	if r := ProbeTCP(closed, opts); r.Result != Refused {
		t.Errorf("tcp to closed port: %+v", r)
	}
	if r := ProbeHTTP("http://"+closed+"/", opts); r.Result != Refused {
		t.Errorf("http to closed port: %+v", r)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedUDP := pc.LocalAddr().String()
	pc.Close()
	if r := ProbeUDP(closedUDP, ProbeOptions{Timeout: time.Second, Send: "x", UDPConnected: true}); r.Result != Refused {
		t.Errorf("connected udp to closed port: %+v", r)
	}

	// Blackholes: a UDP socket that never answers, a TCP server that
	// accepts but never replies, an HTTP server that never responds.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	short := ProbeOptions{Timeout: 200 * time.Millisecond, Send: "x"}
	for _, c := range []struct {
		proto, target, errText string
	}{
		{"udp", silent.LocalAddr().String(), ""},
		{"tcp", mute.Addr().String(), "connected but no reply"},
		{"http", "http://" + mute.Addr().String() + "/", ""},
	} {
		start := time.Now()
		r := Probe(c.proto, c.target, short)
		if d := time.Since(start); d > short.Timeout+500*time.Millisecond {
			t.Errorf("%s blackhole: took %s for a %s timeout", c.proto, d, short.Timeout)
		}
		if r.Result != Timeout || !strings.Contains(r.Error, c.errText) {
			t.Errorf("%s blackhole: %+v", c.proto, r)
		}
	}
}

func TestHoldKeepsTheConnection(t *testing.T) {
	a := startServer(t, "pod-a")
	o := opts
	o.Hold = 50 * time.Millisecond
	if r := ProbeTCP(a["tcp"], o); r.Result != Connected {
		t.Errorf("hold: %+v", r)
	}
}

func TestCountSpreadSummary(t *testing.T) {
	a, b := startServer(t, "backend-a"), startServer(t, "backend-b")
	var rs []Result
	for i := range 5 {
		target := a["tcp"]
		if i%2 == 1 {
			target = b["tcp"]
		}
		r := ProbeTCP(target, opts)
		r.Target = "svc:80" // as if one service address spread the load
		rs = append(rs, r)
	}
	rs = append(rs, Result{Proto: "tcp", Target: "svc:80", Result: Timeout})
	if got, want := Summary(rs), "tcp svc:80: 5 connected, 1 timeout (backend-a 3, backend-b 2)"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}

func TestParsePortsAndTargets(t *testing.T) {
	got, err := ParsePorts([]string{"80,81", "8080"})
	if err != nil || len(got) != 3 || got[0] != 80 || got[1] != 81 || got[2] != 8080 {
		t.Errorf("ParsePorts: %v %v", got, err)
	}
	for _, bad := range []string{"0", "65536", "http", "80,-1"} {
		if _, err := ParsePorts([]string{bad}); err == nil {
			t.Errorf("ParsePorts(%q) accepted", bad)
		}
	}
	for _, c := range []struct {
		proto, target string
		ok            bool
	}{
		{"tcp", "10.0.0.5:80", true}, {"udp", "[fd00::1]:53", true}, {"http", "http://10.0.0.5:8080/", true},
		{"tcp", "10.0.0.5", false}, {"udp", "10.0.0.5:", false}, {"http", "10.0.0.5:8080", false},
	} {
		if err := CheckTarget(c.proto, c.target); (err == nil) != c.ok {
			t.Errorf("CheckTarget(%s, %s): %v", c.proto, c.target, err)
		}
	}
}

func TestShowAddrHidesTheWildcard(t *testing.T) {
	for in, want := range map[string]string{"0.0.0.0:80": ":80", "[::]:53": ":53", "127.0.0.1:80": "127.0.0.1:80", "[fd00::1]:80": "[fd00::1]:80"} {
		a, _ := net.ResolveTCPAddr("tcp", in)
		if got := showAddr(a); got != want {
			t.Errorf("showAddr(%s) = %s, want %s", in, got, want)
		}
	}
}
