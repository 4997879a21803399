package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// racePods: a server, a client allowed by label (role=trusted) once the
// policy below is applied, and a second pod for loopback connections.
const racePods = `
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: server}}
spec:
  containers: [{name: serve, command: ["shunt", "lab", "serve", "--tcp", "7000"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client, role: trusted}}
spec:
  containers: [{name: serve, command: ["shunt", "lab", "serve", "--tcp", "7000"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: other, labels: {app: other}}
spec:
  containers: [{name: serve, command: ["shunt", "lab", "serve", "--tcp", "7000"]}]
`

// onlyTrusted isolates the server and admits only role=trusted pods.
const onlyTrusted = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-trusted}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: trusted}}}]
`

func clientPod(role string) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client, role: %s}}
spec:
  containers: [{name: serve, command: ["shunt", "lab", "serve", "--tcp", "7000"]}]
`, role)
}

type raceLab struct {
	*lab
	script, server string
}

// run runs accel_race.py in a pod and decodes its JSON output into v.
func (r *raceLab) run(t *testing.T, pod string, v any, args ...string) {
	t.Helper()
	out := r.mustShunt(append([]string{"lab", "exec", pod, "--", "python3", r.script}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("accel_race.py %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (r *raceLab) apply(t *testing.T, yaml string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "obj.yaml")
	writeFile(t, f, yaml)
	r.mustShunt("apply", "-f", f)
}

// waitEmpty waits until no socket is left in the sockhash.
func (r *raceLab) waitEmpty(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.status().Accel.Sockets != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sockets left in the sockhash: %s", r.mustShunt("map", "dump", "shunt_sockhash"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSocketAccelRaces: no ordering of events lets an accelerated
// connection reach what policy forbids. Each case is checked against what
// the tc path gives the same connection: a connection whose handshake
// policy admitted keeps going (conntrack), any connection started after a
// deny is in force is refused, accelerated or not.
func TestSocketAccelRaces(t *testing.T) {
	requireRoot(t)
	script, _ := filepath.Abs("testdata/accel_race.py")
	manifest := filepath.Join(t.TempDir(), "pods.yaml")
	writeFile(t, manifest, racePods)
	l := newLabWith(t, []string{"--mode", "redirect-peer", "--socket-acceleration"}, manifest)
	r := &raceLab{lab: l, script: script, server: l.podIP("server")}
	l.probe("client", "connected", "--tcp", r.server+":7000")

	t.Run("connect racing a deny", func(t *testing.T) {
		// New connections back to back while the deny is applied: every
		// one that started after `shunt apply` returned (the datapath
		// holds the deny) must fail, whether its socket would be
		// accelerated or not.
		var attempts []struct {
			Start float64
			OK    bool
			Error string
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.run(t, "client", &attempts, "churn", r.server, "7000", "4")
		}()
		time.Sleep(1500 * time.Millisecond)
		r.apply(t, denyServer)
		applied := float64(time.Now().UnixNano()) / 1e9
		wg.Wait()
		defer r.mustShunt("delete", "networkpolicy", "deny-server")
		var before, after, leaked int
		for _, a := range attempts {
			switch {
			case a.Start < applied && a.OK:
				before++
			case a.Start >= applied && a.OK:
				leaked++
			case a.Start >= applied:
				after++
			}
		}
		t.Logf("%d connections before the deny succeeded, %d after it were refused, %d after it got through", before, after, leaked)
		if leaked > 0 {
			t.Errorf("%d connections started after the deny was in force reached the server", leaked)
		}
		if before == 0 || after == 0 {
			t.Errorf("the race did not happen: %d successes before the deny, %d refusals after", before, after)
		}
		r.waitEmpty(t)
	})

	t.Run("pod relabelled mid-connection", func(t *testing.T) {
		// The server admits role=trusted only; the client loses the label
		// during a held request/response connection. Accelerated or not,
		// the established connection keeps its verdict (conntrack), and a
		// new connection after the relabel is refused.
		r.apply(t, onlyTrusted)
		defer r.mustShunt("delete", "networkpolicy", "only-trusted")
		for _, accel := range []string{"on", "off"} {
			r.mustShunt("accel", accel)
			r.apply(t, clientPod("trusted"))
			l.probe("client", "connected", "--tcp", r.server+":7000")
			rr := r.heldRR(t, func() { r.apply(t, clientPod("untrusted")) })
			if rr.OK != 40 || rr.Error != "" {
				t.Errorf("acceleration %s: held connection across the relabel: %+v, want 40 answers (established connections keep their verdict)", accel, rr)
			}
			l.probe("client", "timeout", "--tcp", r.server+":7000")
		}
		r.mustShunt("accel", "on")
		r.apply(t, clientPod("trusted"))
		r.waitEmpty(t)
	})

	t.Run("socket reused after close", func(t *testing.T) {
		// The same 4-tuple twice: first allowed (and accelerated), closed
		// with RST; then, with a deny in force, a new connection from the
		// same source port must be refused, not matched to the old
		// connection's conntrack entry or sockhash entry.
		var res struct {
			OK    bool
			Error string
		}
		added := l.status().counter("accel-added", "sockmsg")
		r.run(t, "client", &res, "reuse", r.server, "7000", "45123")
		if !res.OK {
			t.Fatalf("first connection from port 45123: %s", res.Error)
		}
		if got := l.status().counter("accel-added", "sockmsg") - added; got != 2 {
			t.Errorf("first connection: accel-added went up by %d, want 2", got)
		}
		r.apply(t, denyServer)
		defer r.mustShunt("delete", "networkpolicy", "deny-server")
		r.run(t, "client", &res, "reuse", r.server, "7000", "45123")
		if res.OK {
			t.Error("a connection reusing the tuple of an accelerated, closed one reached the server through a deny")
		}
		r.waitEmpty(t)
	})

	t.Run("loopback in two pods with the same tuple", func(t *testing.T) {
		// Two pods, the same loopback 4-tuple in each: keyed by namespace,
		// each connection is spliced to its own peer.
		type result struct {
			OK    int
			Error string
		}
		var res [2]result
		var wg sync.WaitGroup
		for i, pod := range []string{"client", "other"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.run(t, pod, &res[i], "loopback", "46000", "7300", pod, "40")
			}()
		}
		time.Sleep(1 * time.Second)
		dump := l.mustShunt("map", "dump", "shunt_sockhash", "-o", "json")
		wg.Wait()
		for i, pod := range []string{"client", "other"} {
			if res[i].OK != 40 || res[i].Error != "" {
				t.Errorf("pod %s: %+v, want 40 replies of its own", pod, res[i])
			}
		}
		var rows []map[string]any
		if err := json.Unmarshal([]byte(dump), &rows); err != nil {
			t.Fatalf("map dump: %v\n%s", err, dump)
		}
		netns := map[string]int{}
		for _, row := range rows {
			if row["local"] == "127.0.0.1:46000" || row["remote"] == "127.0.0.1:46000" {
				pod, _ := row["netnsPod"].(string)
				netns[pod]++
			}
		}
		if netns["default/client"] != 2 || netns["default/other"] != 2 {
			t.Errorf("loopback sockets in the sockhash by pod: %v, want 2 in each pod\n%s", netns, dump)
		}
		r.waitEmpty(t)
	})

	t.Run("node processes only when asked", func(t *testing.T) {
		// A process of the node talking to a pod: left alone by default,
		// accelerated (both ends) with --node-processes.
		for _, c := range []struct {
			flags []string
			want  uint64
		}{{nil, 0}, {[]string{"--node-processes"}, 2}} {
			r.mustShunt(append([]string{"accel", "on"}, c.flags...)...)
			added := l.status().counter("accel-added", "sockmsg")
			conn, err := net.DialTimeout("tcp", r.server+":7000", 2*time.Second)
			if err != nil {
				t.Fatalf("node -> server: %v", err)
			}
			if _, err := conn.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			if n, err := conn.Read(buf); err != nil || !strings.HasSuffix(string(buf[:n]), " ping") {
				t.Fatalf("node -> server reply %q: %v", buf[:n], err)
			}
			if got := l.status().counter("accel-added", "sockmsg") - added; got != c.want {
				t.Errorf("accel on %v: a node process's connection added %d sockets, want %d", c.flags, got, c.want)
			}
			conn.Close()
		}
		r.mustShunt("accel", "on")
		r.waitEmpty(t)
	})
}

// heldRR runs rr.py (40 requests, 50 ms apart) from the client and calls
// during after the first requests.
func (r *raceLab) heldRR(t *testing.T, during func()) (rr struct {
	Sent, OK int
	Error    string
}) {
	t.Helper()
	rrScript, _ := filepath.Abs("testdata/rr.py")
	cmd := exec.Command(filepath.Join(binDir, "shunt"), "--instance", r.instance, "lab", "exec", "client", "--",
		"python3", rrScript, r.server, "7000", "40", "0.05")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	during()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("request/response client: %v\n%s", err, out.String())
	}
	if err := json.Unmarshal([]byte(out.String()), &rr); err != nil {
		t.Fatalf("rr.py output %q: %v", out.String(), err)
	}
	return rr
}
