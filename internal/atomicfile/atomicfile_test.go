package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWrite: the file holds the old or the new content, never a mix; a
// temporary file a crash left behind is overwritten, not read; a failed
// write leaves the old content and no temporary file.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := Write(path, []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path+".tmp", []byte(`{"v":`), 0o600) // a crash in the middle of a write
	if got, _ := os.ReadFile(path); string(got) != `{"v":1}` {
		t.Fatalf("after a crash mid-write: %q", got)
	}
	if err := Write(path, []byte(`{"v":2}`)); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != `{"v":2}` {
		t.Fatalf("replaced: %q", got)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
	// The destination is a non-empty directory: the rename fails.
	bad := filepath.Join(dir, "sub")
	os.MkdirAll(filepath.Join(bad, "x"), 0o700)
	if err := Write(bad, []byte("x")); err == nil {
		t.Error("writing over a directory succeeded")
	}
	if _, err := os.Stat(bad + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left after a failed write: %v", err)
	}
}

// TestWriteMode: the file has the mode asked, whatever the umask and a
// leftover temporary file's mode, and Write's files stay private.
func TestWriteMode(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "plugin")
	os.WriteFile(bin+".tmp", []byte("partial"), 0o600) // left by a crash
	if err := WriteMode(bin, []byte("#!"), 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(bin); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("WriteMode 0755: %v %v", fi.Mode(), err)
	}
	state := filepath.Join(dir, "state.json")
	os.WriteFile(state+".tmp", nil, 0o644)
	if err := Write(state, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("Write: %v %v, want 0600", fi.Mode(), err)
	}
}
