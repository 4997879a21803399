package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/policy"
)

// TestStateFilesDamaged: each state file the agent writes comes back as
// written, and a truncated or garbage one (a crash of an older version
// that did not fsync, a disk error) stops the start with an error naming
// the file and what to do, rather than an agent that forgot its state.
func TestStateFilesDamaged(t *testing.T) {
	dir := t.TempDir()
	st := &State{Mode: datapath.Mode("redirect-peer"), PodCIDR: "10.1.0.0/24", ServiceCIDR: "10.2.0.0/24"}
	if err := st.save(dir); err != nil {
		t.Fatal(err)
	}
	if err := saveAllocations(dir, policy.Allocations{Identities: map[string]uint32{"ns=default app=a": 256}}); err != nil {
		t.Fatal(err)
	}
	eps, err := loadEndpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	eps.byPod["default/a"] = api.Endpoint{IP: "10.1.0.5", HostIf: "veth-a", Ifindex: 7}
	if err := eps.save(); err != nil {
		t.Fatal(err)
	}
	if got, err := loadState(dir); err != nil || got.PodCIDR != st.PodCIDR {
		t.Fatalf("state.json read back: %+v, %v", got, err)
	}
	if got, err := loadEndpoints(dir); err != nil || got.byPod["default/a"].Ifindex != 7 {
		t.Fatalf("endpoints.json read back: %+v, %v", got, err)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(tmp) > 0 {
		t.Errorf("temporary files left: %v", tmp)
	}

	loaders := map[string]func() error{
		"state.json":      func() error { _, err := loadState(dir); return err },
		"identities.json": func() error { _, err := loadAllocations(dir, nil); return err },
		"endpoints.json":  func() error { _, err := loadEndpoints(dir); return err },
	}
	for name, load := range loaders {
		path := filepath.Join(dir, name)
		good, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range [][]byte{nil, good[:len(good)/2], []byte("\x00\x00\x00\x00"), []byte("garbage")} {
			os.WriteFile(path, bad, 0o600)
			err := load()
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "remove") {
				t.Errorf("%s holding %q: want an error naming the file and the fix, got %v", name, bad, err)
			}
		}
		os.WriteFile(path, good, 0o600)
		if err := load(); err != nil {
			t.Errorf("%s restored: %v", name, err)
		}
	}
}
