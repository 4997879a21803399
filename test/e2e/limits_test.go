package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/labtools"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/podnet"
)

// TestNamesAtLengthLimits: objects whose names and labels are as long as
// Kubernetes allows (63 bytes for a namespace, a Service, a label name and
// value; 253 for a pod, a policy and a label prefix), two pods whose
// 253-byte names differ only in the last byte, and pods a-b/c and a/b-c
// (which once shared a network namespace) each get their own namespace,
// cgroup, interface (15 bytes at most) and address, and policy and
// services select them by their long labels.
func TestNamesAtLengthLimits(t *testing.T) {
	ns := strings.Repeat("n", 63)
	long := strings.Join([]string{strings.Repeat("p", 63), strings.Repeat("q", 63), strings.Repeat("r", 63), strings.Repeat("s", 61)}, ".")
	sibling := long[:252] + "t"
	labelKey := strings.Join([]string{strings.Repeat("k", 63), strings.Repeat("l", 63), strings.Repeat("m", 63), strings.Repeat("o", 61)}, ".") + "/" + strings.Repeat("x", 63)
	labelValue := strings.Repeat("v", 63)
	svc := strings.Repeat("w", 63)
	pod := func(ns, name string, labelled bool) string {
		labels := "{}"
		if labelled {
			labels = fmt.Sprintf("{%s: %s}", labelKey, labelValue)
		}
		return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: %s, labels: %s}\nspec:\n  containers:\n  - {name: c, command: [shunt, lab, serve, --tcp, \"7000\"]}\n",
			name, ns, labels)
	}
	docs := []string{
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: " + ns + "}\n",
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: a-b}\n",
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n",
		pod(ns, long, true), pod(ns, sibling, true), pod(ns, "other", false), pod("a-b", "c", false), pod("a", "b-c", false),
		fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: %s}\nspec:\n  selector: {%s: %s}\n  ports: [{port: 80, targetPort: 7000}]\n",
			svc, ns, labelKey, labelValue),
		fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: %s, namespace: %s}\nspec:\n  podSelector: {matchLabels: {%s: %s}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {%s: %s}}}]\n",
			long, ns, labelKey, labelValue, labelKey, labelValue),
	}
	manifest := filepath.Join(t.TempDir(), "long.yaml")
	writeFile(t, manifest, strings.Join(docs, "---\n"))
	l := newLab(t, "redirect-peer", manifest)

	pods := [][2]string{{ns, long}, {ns, sibling}, {ns, "other"}, {"a-b", "c"}, {"a", "b-c"}}
	ips := map[string]string{}
	for _, p := range pods {
		ip := l.podIPIn(p[0], p[1])
		if ip == "" {
			t.Fatalf("pod %s/%.20s... has no address", p[0], p[1])
		}
		if other, dup := ips[ip]; dup {
			t.Fatalf("pods %s and %s/%s share address %s", other, p[0], p[1], ip)
		}
		ips[ip] = p[0] + "/" + p[1]
		// Its own network namespace holds its address.
		out := l.mustShunt("lab", "exec", "-n", p[0], p[1], "--", "ip", "-4", "-o", "addr", "show", "eth0")
		if !strings.Contains(out, ip+"/32") {
			t.Errorf("lab exec in pod %s/%.20s... is not in its namespace (address %s):\n%s", p[0], p[1], ip, out)
		}
		if _, code := l.shunt("lab", "logs", "-n", p[0], p[1]); code != 0 {
			t.Errorf("lab logs of pod %s/%.20s...: exit %d", p[0], p[1], code)
		}
	}
	veths, err := podnet.LinksWithAliasPrefix("shunt:" + l.instance + ":")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, v := range veths {
		if len(v) > 15 || seen[v] {
			t.Errorf("host interface %q: over 15 bytes or not unique (%v)", v, veths)
		}
		seen[v] = true
	}
	if len(veths) != len(pods) {
		t.Errorf("%d pod interfaces for %d pods: %v", len(veths), len(pods), veths)
	}

	longIP, siblingIP := l.podIPIn(ns, long), l.podIPIn(ns, sibling)
	var svcObj struct {
		Spec struct {
			ClusterIP string `json:"clusterIP"`
		}
	}
	if err := json.Unmarshal([]byte(l.mustShunt("get", "svc", "-n", ns, svc, "-o", "json")), &svcObj); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ns, from, target, want string
	}{
		{ns, sibling, longIP + ":7000", labtools.Connected},               // the policy's long label allows it
		{ns, "other", longIP + ":7000", labtools.Timeout},                 // no label: isolated by the policy
		{ns, long, svcObj.Spec.ClusterIP + ":80", labtools.Connected},     // the service's long selector
		{"a-b", "c", l.podIPIn("a", "b-c") + ":7000", labtools.Connected}, // the once-colliding pair
		{"a", "b-c", siblingIP + ":7000", labtools.Timeout},
	} {
		if r := l.probeFrom(c.ns, c.from, "tcp", c.target); r.Result != c.want {
			t.Errorf("from %s/%.20s... to %s: %s (%s), want %s", c.ns, c.from, c.target, r.Result, r.Error, c.want)
		}
	}
}

// TestHundredThousandDocuments: one manifest of 100 000 NetworkPolicies is
// applied whole and deleted whole, the pods' traffic goes on, and the
// agent's memory stays bounded. Times and memory are logged (measured, not
// asserted: this machine is shared); the memory bound is a guard against
// unbounded growth, far above what it takes.
func TestHundredThousandDocuments(t *testing.T) {
	const n = 100000
	l := newLab(t, "redirect-peer", twoPods)
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np-%d}\nspec:\n  podSelector: {matchLabels: {app: a%d}}\n"+
			"  ingress:\n  - from: [{podSelector: {matchLabels: {app: b%d}}}]\n    ports: [{port: 80}]\n---\n", i, i%100, i%50)
	}
	file := filepath.Join(t.TempDir(), "many.yaml")
	writeFile(t, file, b.String())
	docs, err := manifest.ReadDocuments([]string{file}, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs := make([]api.Object, len(docs))
	for i, d := range docs {
		objs[i] = api.Object{Source: d.Source, Object: d.JSON}
	}
	body, err := api.EncodeObjects(objs)
	if err != nil {
		t.Fatalf("%d documents do not fit one request: %v", n, err)
	}
	pid := l.status().PID
	t.Logf("%d documents: manifest %.1f MiB, request %.1f MiB (limit %d MiB); agent before: %s",
		n, float64(b.Len())/(1<<20), float64(len(body))/(1<<20), api.MaxRequestBytes>>20, agentMemory(t, pid))

	start := time.Now()
	out := l.mustShunt("apply", "-f", file)
	t.Logf("apply: %s; agent after: %s", time.Since(start).Round(time.Millisecond), agentMemory(t, pid))
	if got := strings.Count(out, " created\n"); got != n {
		t.Errorf("apply created %d objects, want %d", got, n)
	}
	l.probe("client", "connected", "--tcp", l.podIP("server")+":7000")

	start = time.Now()
	l.mustShunt("delete", "-f", file)
	t.Logf("delete: %s; agent after: %s", time.Since(start).Round(time.Millisecond), agentMemory(t, pid))
	if out := l.mustShunt("get", "networkpolicies", "-A", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("policies left after the delete: %.200s", out)
	}
	l.probe("client", "connected", "--tcp", l.podIP("server")+":7000")
	if hwm := procStatusKiB(t, pid, "VmHWM:"); hwm > 1536<<10 {
		t.Errorf("the agent's peak memory reached %d MiB", hwm>>10)
	}
}

// agentMemory reads a process' resident and peak memory from /proc.
func agentMemory(t *testing.T, pid int) string {
	t.Helper()
	rss, hwm := procStatusKiB(t, pid, "VmRSS:"), procStatusKiB(t, pid, "VmHWM:")
	return fmt.Sprintf("RSS %d MiB, peak %d MiB", rss>>10, hwm>>10)
}

func procStatusKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	for _, line := range strings.Split(readFile(fmt.Sprintf("/proc/%d/status", pid)), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			var kib int
			fmt.Sscanf(strings.TrimSpace(rest), "%d", &kib)
			return kib
		}
	}
	t.Fatalf("no %s in /proc/%d/status (is the agent gone?)", field, pid)
	return 0
}

// TestThousandPods: 1 000 pods on one node (a /22 pod CIDR, 1 021
// addresses) each get an address, an interface and a cgroup; 22 more, past
// the pool, are refused whole, naming the pod CIDR; deleted, the pods
// leave no namespace, interface or cgroup behind. Times and the agent's
// memory are logged (measured here on the shared, loaded 2-core machine:
// 56 s to create, 41 s to delete, the agent at 93 MiB; 99 s in all).
func TestThousandPods(t *testing.T) {
	const n = 1000
	l := newLabWith(t, []string{"--mode", "redirect-peer", "--pod-cidr", fmt.Sprintf("10.%d.%d.0/22", labOctet(), 4*rand.IntN(60))})
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata: {name: p%04d}\nspec:\n  containers:\n  - {name: c, command: [sleep, infinity]}\n---\n", i)
	}
	file := filepath.Join(t.TempDir(), "pods.yaml")
	writeFile(t, file, b.String())
	pid := l.status().PID
	t.Logf("agent before: %s", agentMemory(t, pid))

	start := time.Now()
	l.mustShunt("apply", "-f", file)
	t.Logf("%d pods applied and started: %s; agent: %s", n, time.Since(start).Round(time.Millisecond), agentMemory(t, pid))
	var list podList
	if err := json.Unmarshal([]byte(l.mustShunt("get", "pods", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	addrs := map[string]bool{}
	for _, p := range list.Items {
		if p.Status.Phase != "Running" || p.Status.PodIP == "" || addrs[p.Status.PodIP] {
			t.Errorf("pod %s: %s, address %q (duplicate: %v)", p.Metadata.Name, p.Status.Phase, p.Status.PodIP, addrs[p.Status.PodIP])
		}
		addrs[p.Status.PodIP] = true
	}
	if len(list.Items) != n {
		t.Errorf("%d pods listed, want %d", len(list.Items), n)
	}
	veths, err := podnet.LinksWithAliasPrefix("shunt:" + l.instance + ":")
	if err != nil || len(veths) != n {
		t.Errorf("%d pod interfaces, want %d (%v)", len(veths), n, err)
	}
	if got := countEntries(t, "/run/netns", l.instance+"-"); got != n {
		t.Errorf("%d network namespaces, want %d", got, n)
	}
	root, err := cgroup.Root()
	if err != nil {
		t.Fatal(err)
	}
	cgroups := filepath.Join(root, l.instance, "pods")
	if got := countEntries(t, cgroups, "default_"); got != n {
		t.Errorf("%d pod cgroups in %s, want %d", got, cgroups, n)
	}
	l.probe("p0000", "refused", "--tcp", l.status().NodeIP+":1") // the node answers: the pod's network works

	// Past the pool: refused whole, before anything is built.
	var more strings.Builder
	for i := range 22 {
		fmt.Fprintf(&more, "apiVersion: v1\nkind: Pod\nmetadata: {name: extra%02d}\nspec:\n  containers:\n  - {name: c, command: [sleep, infinity]}\n---\n", i)
	}
	extra := filepath.Join(t.TempDir(), "extra.yaml")
	writeFile(t, extra, more.String())
	if out, code := l.shunt("apply", "-f", extra); code == 0 || !strings.Contains(out, "1022 pods do not fit in pod CIDR") {
		t.Errorf("22 pods past a full pool: exit %d:\n%s", code, out)
	}

	start = time.Now()
	l.mustShunt("delete", "-f", file)
	t.Logf("%d pods deleted: %s; agent: %s", n, time.Since(start).Round(time.Millisecond), agentMemory(t, pid))
	if out := l.mustShunt("get", "pods", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("pods left: %.300s", out)
	}
	if veths, _ := podnet.LinksWithAliasPrefix("shunt:" + l.instance + ":"); len(veths) != 0 {
		t.Errorf("%d pod interfaces left", len(veths))
	}
	if got := countEntries(t, "/run/netns", l.instance+"-"); got != 0 {
		t.Errorf("%d network namespaces left", got)
	}
	if got := countEntries(t, cgroups, "default_"); got != 0 {
		t.Errorf("%d pod cgroups left", got)
	}
}

// countEntries counts the entries of dir whose name starts with prefix.
func countEntries(t *testing.T, dir, prefix string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			n++
		}
	}
	return n
}
