package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func (st status) counter(reason, direction string) uint64 {
	for _, c := range st.Counters {
		if c.Reason == reason && c.Direction == direction {
			return c.Packets
		}
	}
	return 0
}

// TestSocketAccelerationKeepsPolicy: with acceleration on, a held
// request/response connection between two pods is accelerated (both ends
// join the sockhash, its sends skip the stack) and answers every request
// correctly; a deny applied in the middle leaves it exactly as the tc path
// leaves an established connection (it goes on), while a new connection is
// refused and never accelerated; closed sockets leave the sockhash.
func TestSocketAccelerationKeepsPolicy(t *testing.T) {
	l := newLabWith(t, []string{"--mode", "redirect-peer", "--socket-acceleration"}, "testdata/two-pods.yaml")
	server := l.podIP("server")
	l.probe("client", "connected", "--tcp", server+":7000")
	script, _ := filepath.Abs("testdata/rr.py")
	before := l.status()

	cmd := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "lab", "exec", "client", "--",
		"python3", script, server, "7000", "40", "0.05")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	if got := l.mustShunt("accel"); !strings.Contains(got, ", 2 sockets accelerated") {
		t.Errorf("shunt accel during the connection: %q, want both ends accelerated", got)
	}
	deny := filepath.Join(t.TempDir(), "deny.yaml")
	writeFile(t, deny, denyServer)
	l.mustShunt("apply", "-f", deny)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("request/response client: %v\n%s", err, out.String())
	}
	var rr struct {
		Sent, OK int
		Error    string
	}
	if err := json.Unmarshal([]byte(out.String()), &rr); err != nil || rr.OK != 40 || rr.Error != "" {
		t.Errorf("held connection across the deny: %s (%v), want 40 answers as without acceleration", out.String(), err)
	}
	after := l.status()
	if added := after.counter("accel-added", "sockmsg") - before.counter("accel-added", "sockmsg"); added != 2 {
		t.Errorf("accel-added went up by %d, want 2 (both ends)", added)
	}
	if moved := after.counter("accel-redirected", "sockmsg") - before.counter("accel-redirected", "sockmsg"); moved < 80 {
		t.Errorf("accel-redirected went up by %d, want >= 80 (40 requests and 40 replies)", moved)
	}
	found := false
	for _, f := range l.observe("--last", "200") {
		found = found || (f.Reason == "accel-added" && f.Source.Pod == "default/client" && f.Destination.Pod == "default/server")
	}
	if !found {
		t.Error("no flow saying the connection was accelerated (reason accel-added)")
	}
	l.probe("client", "timeout", "--tcp", server+":7000")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(l.mustShunt("accel"), ", 0 sockets accelerated") {
		if time.Now().After(deadline) {
			t.Fatalf("sockets left in the sockhash after every connection closed: %s", l.mustShunt("map", "dump", "shunt_sockhash"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Each end reports what it sent through the redirect when it closes:
	// 40 requests one way, 40 replies the other.
	ends := map[string]uint64{}
	for _, f := range l.observe("--last", "400") {
		if f.Reason == "accel-ended" && f.Event == "end" {
			ends[f.Source.Pod+" -> "+f.Destination.Pod] = f.Messages
			if f.Bytes == 0 {
				t.Errorf("accelerated socket end with no bytes: %+v", f)
			}
		}
	}
	if ends["default/client -> default/server"] < 40 || ends["default/server -> default/client"] < 40 {
		t.Errorf("accelerated socket ends by direction (messages): %v, want >= 40 each way", ends)
	}
}

const denyServer = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-server}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
`
