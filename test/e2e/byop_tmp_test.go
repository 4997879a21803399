package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBringYourOwnProxy: a pod asks that its port 7000 go to its own proxy
// on 15006 (a Python script, as a third-party sidecar would be): the proxy
// reads the dialled address with SO_ORIGINAL_DST, its marked upstream
// connection reaches the server instead of being redirected again, and a
// client the pod's policy does not allow on 7000 stays out.
func TestBringYourOwnProxy(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	script, _ := filepath.Abs("testdata/byop.py")
	log := filepath.Join(dir, "byop.log")
	manifest := filepath.Join(dir, "byop.yaml")
	writeFile(t, manifest, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata:
  name: server
  labels: {app: server}
  annotations: {shunt.io/inbound-redirect: "7000:15006"}
spec:
  containers:
  - {name: app, command: ["shunt", "lab", "serve", "--tcp", "7000"]}
  - {name: proxy, command: ["python3", %q, "15006", "0x5e000000", %q]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers: [{name: c, command: ["shunt", "lab", "serve", "--tcp", "7000"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: other, labels: {app: other}}
spec:
  containers: [{name: c, command: ["shunt", "lab", "serve", "--tcp", "7000"]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-client}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{port: 7000}]}]
`, script, log))
	l := newLab(t, "redirect-peer", manifest)
	server := l.podIP("server")
	l.probe("client", "connected", "--tcp", server+":7000", "--send", "hello")
	got := readFile(log)
	if !strings.Contains(got, "orig="+server+":7000 upstream="+server+":7000") {
		t.Errorf("the pod's proxy log %q: want the dialled address from SO_ORIGINAL_DST and a direct upstream", got)
	}
	lines := strings.Count(got, "\n")
	l.probe("other", "timeout", "--tcp", server+":7000")
	if now := strings.Count(readFile(log), "\n"); now != lines {
		t.Errorf("a client the policy does not allow on 7000 reached the pod's proxy: %q", readFile(log))
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
