package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// waitLogs returns a pod's logs once they contain want, or after 10 s
// (the caller checks what is there).
func (l *lab) waitLogs(pod, want string) string {
	l.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := l.shunt("lab", "logs", pod)
		if strings.Contains(out, want) || time.Now().After(deadline) {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestContainerPrivileges: a container runs with the capabilities a
// container runtime grants by default, so a pod cannot change its own
// addresses, MAC or routes, take its interface down, or load BPF programs (no
// NET_ADMIN, SYS_ADMIN, BPF, in its bounding set either, so nothing it
// execs gets them back); securityContext.capabilities.add and runAsUser
// are honoured, as a runtime does.
func TestContainerPrivileges(t *testing.T) {
	requireRoot(t)
	manifest := filepath.Join(t.TempDir(), "pods.yaml")
	writeFile(t, manifest, `
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec:
  containers:
  - name: c
    command: [sh, -c, 'ip addr add 192.0.2.99/32 dev lo; echo addr=$?; ip link set eth0 down; echo link=$?;
      ip route add 192.0.2.0/24 dev eth0; echo route=$?; ip link set eth0 address 02:00:00:00:00:99; echo mac=$?; grep -E "^Cap(Eff|Bnd)" /proc/self/status; echo uid=$(id -u); sleep infinity']
---
apiVersion: v1
kind: Pod
metadata: {name: netadmin}
spec:
  containers:
  - name: c
    securityContext: {capabilities: {add: [NET_ADMIN]}}
    command: [sh, -c, 'ip addr add 192.0.2.99/32 dev lo; echo addr=$?; sleep infinity']
---
apiVersion: v1
kind: Pod
metadata: {name: user}
spec:
  securityContext: {runAsUser: 1000, runAsGroup: 1000}
  containers:
  - name: c
    command: [sh, -c, 'echo uid=$(id -u) gid=$(id -g); grep "^CapEff" /proc/self/status; sleep infinity']
`)
	l := newLab(t, "redirect-peer", manifest)
	logs := l.waitLogs
	// Docker's and containerd's default set: CapEff 00000000a80425fb.
	out := logs("plain", "uid=")
	for _, want := range []string{"addr=2", "link=2", "route=2", "mac=2", "CapEff:\t00000000a80425fb", "CapBnd:\t00000000a80425fb", "uid=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("pod with the default capabilities: want %q in its output:\n%s", want, out)
		}
	}
	if out := logs("netadmin", "addr="); !strings.Contains(out, "addr=0") {
		t.Errorf("pod with capabilities.add NET_ADMIN could not add an address:\n%s", out)
	}
	if out := logs("user", "CapEff"); !strings.Contains(out, "uid=1000 gid=1000") || !strings.Contains(out, "CapEff:\t0000000000000000") {
		t.Errorf("pod with runAsUser 1000: want uid=1000 gid=1000 and no capabilities:\n%s", out)
	}
	checkExecEntersContainer(t, l)
	// A capability that is none is refused by the API server, naming it.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  containers:\n  - {name: c, command: [\"true\"], securityContext: {capabilities: {add: [NET_ADMINN]}}}\n")
	if out, code := l.shunt("apply", "-f", bad); code == 0 || !strings.Contains(out, "spec.containers[0].securityContext.capabilities.add[0]") {
		t.Errorf("apply of an unknown capability: exit %d:\n%s", code, out)
	}
}

// checkExecEntersContainer: `lab exec` runs a command as the container
// runs, with the capabilities its own process has (the lines it logged),
// its user, and its mount namespace, where the node's /run/shunt (every
// instance's agent socket) is empty; only --node-privileges runs with the
// node's.
func checkExecEntersContainer(t *testing.T, l *lab) {
	t.Helper()
	capLines := func(out string) []string {
		var lines []string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "CapEff:") || strings.HasPrefix(line, "CapBnd:") {
				lines = append(lines, line)
			}
		}
		return lines
	}
	grepCaps := []string{"grep", "-E", "^Cap(Eff|Bnd)", "/proc/self/status"}
	own := capLines(l.waitLogs("plain", "uid="))
	execd := capLines(l.mustShunt(append([]string{"lab", "exec", "plain", "--"}, grepCaps...)...))
	if len(own) != 2 || strings.Join(own, ",") != strings.Join(execd, ",") {
		t.Errorf("lab exec's capabilities %q differ from the container process's %q", execd, own)
	}
	if out, code := l.shunt("lab", "exec", "plain", "--", "ip", "addr", "add", "192.0.2.98/32", "dev", "lo"); code == 0 {
		t.Errorf("lab exec in a pod without NET_ADMIN added an address:\n%s", out)
	}
	sock := "/run/shunt/" + l.instance + "/shuntd.sock"
	if out, code := l.shunt("lab", "exec", "plain", "--", "sh", "-c", "ls -A /run/shunt; test -e "+sock); code == 0 || strings.TrimSpace(out) != "" {
		t.Errorf("lab exec sees the node's /run/shunt (exit %d):\n%s", code, out)
	}
	if out := l.mustShunt("lab", "exec", "netadmin", "--", "grep", "^CapEff", "/proc/self/status"); !strings.Contains(out, "CapEff:\t00000000a80435fb") {
		t.Errorf("lab exec in a pod with capabilities.add NET_ADMIN: want the default set and NET_ADMIN (a80435fb):\n%s", out)
	}
	if out := l.mustShunt("lab", "exec", "user", "--", "sh", "-c", "echo uid=$(id -u) gid=$(id -g); grep ^CapEff /proc/self/status"); !strings.Contains(out, "uid=1000 gid=1000") || !strings.Contains(out, "CapEff:\t0000000000000000") {
		t.Errorf("lab exec in a pod with runAsUser 1000: want uid=1000 gid=1000 and no capabilities:\n%s", out)
	}
	// The node admin's way in keeps the node's privileges and mounts.
	if out := l.mustShunt("lab", "exec", "--node-privileges", "plain", "--", "sh", "-c", "test -S "+sock+" && echo socket; ip -4 -o addr show eth0"); !strings.Contains(out, "socket") || !strings.Contains(out, l.podIP("plain")+"/32") {
		t.Errorf("lab exec --node-privileges does not see the node's socket from the pod's network namespace:\n%s", out)
	}
}
