package podexec

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A process's binds are its own: it sees the pod's file at the target (a
// missing mount point made for it, a read-only bind refusing writes),
// while the node keeps its file.
func TestBinds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a mount namespace needs root (CAP_SYS_ADMIN)")
	}
	dir := t.TempDir()
	nodeFile, podFile := filepath.Join(dir, "resolv.conf"), filepath.Join(dir, "pod-resolv.conf")
	os.WriteFile(nodeFile, []byte("nameserver 192.0.2.53\n"), 0o644)
	os.WriteFile(podFile, []byte("nameserver 10.96.0.10\n"), 0o644)
	volume := filepath.Join(dir, "volume")
	os.MkdirAll(volume, 0o755)
	os.WriteFile(filepath.Join(volume, "Corefile"), []byte(".:53 {}\n"), 0o644)
	mountPoint := filepath.Join(dir, "etc", "coredns")
	cmd := exec.Command("/bin/sh", "-c", `cat "$1" "$2/Corefile"; if touch "$2/x" 2>/dev/null; then echo writable; fi`, "sh", nodeFile, mountPoint)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := Start(Target{Binds: []Bind{{Source: podFile, Target: nodeFile}, {Source: volume, Target: mountPoint, ReadOnly: true}}}, cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if want := "nameserver 10.96.0.10\n.:53 {}\n"; out.String() != want {
		t.Errorf("the process saw %q, want %q (the pod's file, the volume, read-only)", out.String(), want)
	}
	if data, _ := os.ReadFile(nodeFile); string(data) != "nameserver 192.0.2.53\n" {
		t.Errorf("the node's file changed: %q", data)
	}
	if entries, _ := os.ReadDir(mountPoint); len(entries) != 0 {
		t.Errorf("the node sees the volume at the mount point: %v", entries)
	}
}
