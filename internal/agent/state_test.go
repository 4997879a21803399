package agent

import (
	"os"
	"testing"

	"github.com/shuntnet/shunt/internal/manifest"
)

// TestStateRoundTrip: settings and pods go to state.json, each object to its
// own file; a deleted object's file goes away; loading gives it all back.
func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	objs, err := manifest.Parse("t.yaml", []byte(svc("a", "")+svc("b", "")))
	if err != nil {
		t.Fatal(err)
	}
	st := &State{Mode: "redirect", PodCIDR: "10.1.0.0/24", ClusterIPs: map[string]string{"default/a": "10.96.0.2"},
		Pods: map[string]*PodRecord{"default/p": {Name: "p", IP: "10.1.0.2"}}}
	for _, o := range objs {
		if err := saveObject(dir, o.Key(), &o); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.save(dir); err != nil {
		t.Fatal(err)
	}
	if err := saveObject(dir, objs[1].Key(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(objectPath(dir, objs[1].Key())); !os.IsNotExist(err) {
		t.Errorf("deleted object's file remains: %v", err)
	}
	got, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := decodeObjects(got.Objects)
	if err != nil {
		t.Fatal(err)
	}
	if len(decoded) != 1 || decoded[0].Key() != objs[0].Key() || decoded[0].Source != "t.yaml#1" {
		t.Errorf("objects after load: %+v", decoded)
	}
	if got.Mode != "redirect" || got.ClusterIPs["default/a"] != "10.96.0.2" || got.Pods["default/p"].IP != "10.1.0.2" {
		t.Errorf("state after load: %+v", got)
	}
	if fresh, err := loadState(t.TempDir()); err != nil || len(fresh.Pods) != 0 {
		t.Errorf("empty dir: %+v %v", fresh, err)
	}
}
