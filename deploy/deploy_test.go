package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCRDsHoldEveryFile: what `shunt dev cluster up` installs is what
// `kubectl apply -f deploy/crds/` would, every file of the folder.
func TestCRDsHoldEveryFile(t *testing.T) {
	files, err := filepath.Glob("crds/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("crds/*.yaml: %v %v", files, err)
	}
	all := CRDs()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(all, data) {
			t.Errorf("CRDs() lacks %s", f)
		}
	}
	if n := bytes.Count(all, []byte("\nkind: CustomResourceDefinition\n")); n != len(files) {
		t.Errorf("CRDs() holds %d CustomResourceDefinitions, want one per file (%d)", n, len(files))
	}
}
