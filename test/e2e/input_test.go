package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadInputIsRejectedWhole: a bad manifest names file, object and field,
// and nothing of the apply takes effect.
func TestBadInputIsRejectedWhole(t *testing.T) {
	l := newLab(t, "redirect-peer", twoPods)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := "apiVersion: v1\nkind: Pod\nmetadata: {name: fresh}\nspec: {containers: [{name: c, command: [sleep, infinity]}]}\n"
	cases := []struct {
		name, body, want string
	}{
		{"unparsable.yaml", "kind: [", "unparsable.yaml#1: not valid YAML"},
		{"unknown-kind.yaml", good + "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n", `unknown-kind.yaml#2: Deployment d: kind: unknown kind "Deployment"`},
		{"duplicate.yaml", good + "---\n" + good, "duplicate.yaml#2: Pod default/fresh: metadata.name: duplicate"},
		{"bad-field.yaml", good + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: other}\nspec: {containers: [{name: c, command: [x], ports: [{containerPort: 99999}]}]}\n",
			"bad-field.yaml#2: Pod default/other: spec.containers[0].ports[0].containerPort: 99999 is out of range"},
		{"no-namespace.yaml", good + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: lost, namespace: nowhere}\nspec: {containers: [{name: c, command: [x]}]}\n",
			`no-namespace.yaml#2: Pod nowhere/lost: metadata.namespace: namespace "nowhere" not found`},
	}
	for _, c := range cases {
		out, code := l.shunt("apply", "-f", write(c.name, c.body))
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d, output:\n%s\nwant it to contain %q", c.name, code, out, c.want)
		}
	}
	if out := l.mustShunt("get", "pods", "-o", "name"); strings.Contains(out, "fresh") {
		t.Errorf("a rejected apply created a pod:\n%s", out)
	}

	// More pods than the pod CIDR holds: refused before anything is built.
	var many strings.Builder
	for i := 0; i < 300; i++ {
		many.WriteString(strings.Replace(good, "fresh", "p"+string(rune('a'+i%26))+strings.Repeat("x", i/26), 1) + "---\n")
	}
	out, code := l.shunt("apply", "-f", write("many.yaml", many.String()))
	if code == 0 || !strings.Contains(out, "do not fit in pod CIDR") {
		t.Errorf("300 pods in a /24: exit %d:\n%s", code, out)
	}
	if out := l.mustShunt("get", "pods", "-o", "name"); strings.Count(out, "pod/") != 2 {
		t.Errorf("pods after refused apply:\n%s", out)
	}

	// The running lab keeps its mode.
	if out, code := l.shunt("lab", "up", "--mode", "bridge"); code == 0 || !strings.Contains(out, "lab down` first") {
		t.Errorf("mode change on a live lab: exit %d:\n%s", code, out)
	}
}

// TestLabStaysOnThisMachine: pods route only the pod network, so a packet to
// any other address fails at once in the pod instead of leaving the machine.
func TestLabStaysOnThisMachine(t *testing.T) {
	l := newLab(t, "redirect-peer", twoPods)
	out, code := l.shunt("lab", "exec", "client", "--", "ip", "route", "get", "192.0.2.200")
	if code == 0 || !strings.Contains(out, "unreachable") {
		t.Errorf("route to an address outside the lab: exit %d:\n%s", code, out)
	}
}

// TestExecPassesExitCode: lab exec returns the command's own exit code.
func TestExecPassesExitCode(t *testing.T) {
	l := newLab(t, "redirect-peer", twoPods)
	if _, code := l.shunt("lab", "exec", "client", "--", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exit code %d, want 7", code)
	}
	if out, code := l.shunt("lab", "exec", "nope", "--", "true"); code == 0 || !strings.Contains(out, "pod default/nope not found") {
		t.Errorf("exec in a missing pod: exit %d:\n%s", code, out)
	}
	out := l.mustShunt("lab", "exec", "client", "--", "sh", "-c", "cat /proc/self/cgroup; ip -4 -o addr show eth0")
	if !strings.Contains(out, "/"+l.instance+"/pods/default_client") || !strings.Contains(out, l.podIP("client")+"/32") {
		t.Errorf("exec does not run in the pod's cgroup and netns:\n%s", out)
	}
}
