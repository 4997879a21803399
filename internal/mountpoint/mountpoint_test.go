package mountpoint

import (
	"os"
	"path/filepath"
	"testing"
)

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// Mount points are made with their missing parents, held by each pod that
// needs them (of any node), and removed with the last holder, deepest
// first; what the node had, or what someone filled, stays.
func TestAcquireRelease(t *testing.T) {
	root := t.TempDir()
	Dir = filepath.Join(root, "record", "mountpoints")
	node := filepath.Join(root, "node") // the machine's file system
	os.MkdirAll(filepath.Join(node, "etc"), 0o755)
	os.WriteFile(filepath.Join(node, "etc", "hosts"), []byte("127.0.0.1 localhost\n"), 0o644)
	coredns := filepath.Join(node, "etc", "coredns")
	secrets := filepath.Join(node, "var", "run", "secrets", "coredns")
	agnhost := filepath.Join(node, "agnhost")
	a, b := Holder("n1k", "kube-system_coredns"), Holder("n2k", "default_web")

	if err := Acquire(a, []Target{{Path: coredns}, {Path: secrets}, {Path: agnhost, File: true}, {Path: filepath.Join(node, "etc", "hosts"), File: true}}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(agnhost); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("file mount point %s: %v", agnhost, err)
	}
	for _, p := range []string{coredns, secrets} {
		if st, err := os.Stat(p); err != nil || !st.IsDir() {
			t.Fatalf("directory mount point %s: %v", p, err)
		}
	}
	// Another node's pod needs /agnhost and a path below /var/run/secrets.
	other := filepath.Join(node, "var", "run", "secrets", "other")
	if err := Acquire(b, []Target{{Path: agnhost, File: true}, {Path: other}}); err != nil {
		t.Fatal(err)
	}
	if err := Release(a); err != nil {
		t.Fatal(err)
	}
	if exists(coredns) || exists(secrets) {
		t.Error("a's own mount points outlived it")
	}
	if !exists(agnhost) || !exists(other) || !exists(filepath.Join(node, "var", "run")) {
		t.Error("b's mount points (and their parents) went with a")
	}
	if !exists(filepath.Join(node, "etc", "hosts")) || !exists(filepath.Join(node, "etc")) {
		t.Error("what the node had was removed")
	}
	// Someone put a file into a directory the lab made: it stays.
	os.WriteFile(filepath.Join(other, "keep"), []byte("x"), 0o644)
	if err := ReleaseInstance("n2k"); err != nil {
		t.Fatal(err)
	}
	if exists(agnhost) {
		t.Error("/agnhost outlived its last holder")
	}
	if !exists(filepath.Join(other, "keep")) {
		t.Error("a directory someone filled was removed")
	}
	if exists(filepath.Join(node, "var", "run", "secrets", "coredns")) {
		t.Error("coredns mount point back")
	}
	if entries, _ := os.ReadDir(Dir); len(entries) != 0 {
		t.Errorf("records left: %v", entries)
	}
}
