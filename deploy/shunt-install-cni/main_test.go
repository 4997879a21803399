package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInstallAndUninstall: the plugin and its configuration land on the
// node's directories with their modes, replace older ones, and
// --uninstall leaves neither.
func TestInstallAndUninstall(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "image", "shunt-cni")
	os.MkdirAll(filepath.Dir(src), 0o755)
	if err := os.WriteFile(src, []byte("new plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := options{pluginSrc: src, binDir: filepath.Join(dir, "opt/cni/bin"), confDir: filepath.Join(dir, "etc/cni/net.d"),
		confName: "10-shunt.conflist", conf: `{"cniVersion":"1.1.0","name":"shunt","plugins":[{"type":"shunt-cni"}]}`}
	os.MkdirAll(o.binDir, 0o755)
	os.WriteFile(filepath.Join(o.binDir, "shunt-cni"), []byte("old plugin"), 0o755)
	if err := o.run(); err != nil {
		t.Fatal(err)
	}
	plugin := filepath.Join(o.binDir, "shunt-cni")
	if b, _ := os.ReadFile(plugin); string(b) != "new plugin" {
		t.Errorf("plugin holds %q, want the image's", b)
	}
	if fi, err := os.Stat(plugin); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("plugin mode: %v %v", fi, err)
	}
	conf := filepath.Join(o.confDir, o.confName)
	b, err := os.ReadFile(conf)
	if err != nil || len(b) == 0 {
		t.Fatalf("configuration: %q %v", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(o.binDir, "*.tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	o.uninstall = true
	if err := o.run(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{plugin, conf} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after --uninstall: %v", p, err)
		}
	}
	if err := o.run(); err != nil {
		t.Errorf("a second --uninstall: %v", err)
	}
}

// TestRefusesBadConfiguration: a configuration the runtime would reject
// is refused before anything is written.
func TestRefusesBadConfiguration(t *testing.T) {
	dir := t.TempDir()
	o := options{pluginSrc: "/nonexistent", binDir: dir, confDir: dir, confName: "10-shunt.conflist", conf: `{"name":"shunt"}`}
	if err := o.run(); err == nil {
		t.Fatal("a configuration without cniVersion and plugins was accepted")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("wrote %v", ents)
	}
}
