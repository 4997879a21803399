package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// ctfloodManifest writes what `ctflood.py pods` or `ctflood.py policy`
// prints (the lab pods: a server without keepalive probes, a client, a
// flooder; the policy admitting only the flooder as new) to a file.
func ctfloodManifest(t *testing.T, script, what string) string {
	t.Helper()
	out, err := exec.Command("python3", script, what).Output()
	if err != nil {
		t.Fatalf("ctflood.py %s: %v", what, err)
	}
	p := filepath.Join(t.TempDir(), what+".yaml")
	writeFile(t, p, string(out))
	return p
}

const (
	heldConnections = 200
	// floodSYNs overflows shunt_ct_new (32 768) several times and is more
	// than the whole of conntrack holds (131 072 + 32 768 entries), each
	// SYN a new tuple (8 ports x 64 512 source ports).
	floodSYNs  = 180000
	floodPorts = "7000,7001,7002,7003,7004,7005,7006,7007" // 7000 open (SYN-ACK, then the flooder's RST), the others closed (RST)
)

// TestSYNFloodKeepsEstablished: a pod holds idle established connections
// to a server whose policy then stops admitting it as new (nor the server
// to the pod: refused both ways, a connection whose entry is lost ends); another pod
// SYN-floods the server (open and closed ports, from every CPU) with more
// SYNs than conntrack holds. Every held connection still exchanges data
// afterwards (the flood only churned shunt_ct_new), nothing was refused as
// ct-full, and the client still cannot open a new connection. With
// --conntrack-single-table (the single table of before) the same flood
// evicts them and they are cut, which shows the test tests something.
func TestSYNFloodKeepsEstablished(t *testing.T) {
	requireRoot(t)
	script, _ := filepath.Abs("testdata/ctflood.py")
	for _, single := range []bool{false, true} {
		name, flags := "two-tables", []string{"--mode", "redirect-peer"}
		if single {
			name, flags = "single-table", append(flags, "--conntrack-single-table")
		}
		t.Run(name, func(t *testing.T) {
			l := newLabWith(t, flags, ctfloodManifest(t, script, "pods"))
			server := l.podIP("server")
			l.probe("client", "connected", "--tcp", server+":7000")

			held := l.holdConnections(script, "client", server, heldConnections)
			l.apply(ctfloodManifest(t, script, "policy"))
			l.probe("client", "timeout", "--tcp", server+":7000")

			before := l.status()
			out := l.mustShunt("lab", "exec", "flooder", "--", "python3", script, "flood", server, floodPorts, fmt.Sprint(floodSYNs))
			var flood struct {
				Sent int
				Rate float64
			}
			if err := json.Unmarshal([]byte(out), &flood); err != nil || flood.Sent != floodSYNs {
				t.Fatalf("flood: %v\n%s", err, out)
			}
			after := l.status()
			t.Logf("flood: %d SYNs at %.0f/s; from-pod packets forwarded meanwhile: %d", flood.Sent, flood.Rate,
				after.counter("forwarded", "from-pod")-before.counter("forwarded", "from-pod"))

			ok := held.check()
			t.Logf("established connections answering after the flood: %d of %d", ok, heldConnections)
			switch {
			case !single && ok != heldConnections:
				t.Errorf("%d of %d established connections still answer after the flood, want all\n%s", ok, heldConnections,
					l.mustShunt("map", "list"))
			case single && ok > heldConnections/2:
				t.Errorf("single table: %d of %d established connections survived a flood larger than the table; "+
					"the flood did not press the table, and the test shows nothing", ok, heldConnections)
			}
			if n := after.counter("ct-full", "from-pod") + after.counter("ct-promote-failed", "from-pod"); n != 0 {
				t.Errorf("%d conntrack inserts failed (ct-full, ct-promote-failed): the LRU tables should make room", n)
			}
			l.probe("client", "timeout", "--tcp", server+":7000") // policy still holds for new connections
			held.close()
		})
	}
}

// heldConns is ctflood.py hold running in a pod: connections held open,
// checked on demand.
type heldConns struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// holdConnections opens n connections from pod to server:7000 and returns
// once each has exchanged a message.
func (l *lab) holdConnections(script, pod, server string, n int) *heldConns {
	l.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", pod, "--",
		"python3", script, "hold", server, "7000", fmt.Sprint(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		l.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		l.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	h := &heldConns{t: l.t, cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	l.t.Cleanup(h.close)
	var first struct{ Held int }
	h.read(&first)
	if first.Held != n {
		l.t.Fatalf("holding connections: %+v, want %d held", first, n)
	}
	return h
}

// check exchanges a message on every held connection; how many answered.
func (h *heldConns) check() int {
	h.t.Helper()
	if _, err := io.WriteString(h.stdin, "check\n"); err != nil {
		h.t.Fatalf("asking the held connections: %v", err)
	}
	var res struct{ OK, Failed int }
	h.read(&res)
	return res.OK
}

func (h *heldConns) read(v any) {
	h.t.Helper()
	done := make(chan bool, 1)
	go func() { done <- h.lines.Scan() }()
	select {
	case ok := <-done:
		if !ok {
			h.t.Fatalf("ctflood.py hold ended: %v", h.lines.Err())
		}
	case <-time.After(30 * time.Second):
		h.t.Fatal("ctflood.py hold did not answer within 30 s")
	}
	if err := json.Unmarshal(h.lines.Bytes(), v); err != nil {
		h.t.Fatalf("ctflood.py hold: %v: %s", err, h.lines.Bytes())
	}
}

// close ends the holder (end of its input) and waits for it.
func (h *heldConns) close() {
	if h.stdin != nil {
		h.stdin.Close()
		h.stdin = nil
		h.cmd.Wait()
	}
}
