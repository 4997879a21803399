// Package deploy holds what installs shunt on a cluster: its
// CustomResourceDefinitions (crds/, generated from internal/manifest's
// types and copied from the Gateway API release) and the DaemonSet
// (shunt.yaml). The CRDs are embedded so that `shunt dev cluster up` can
// install them from the binary alone, as an operator does with
// `kubectl apply -f deploy/crds/`.
package deploy

import (
	"bytes"
	"embed"
	"io/fs"
)

//go:embed crds/*.yaml
var crds embed.FS

// CRDs is every file of crds/ as one YAML stream, in file name order.
func CRDs() []byte {
	files, err := fs.Glob(crds, "crds/*.yaml")
	if err != nil {
		panic(err) // the pattern is constant and valid
	}
	var b bytes.Buffer
	for _, f := range files {
		data, err := crds.ReadFile(f)
		if err != nil {
			panic(err) // embedded: cannot fail
		}
		b.WriteString("---\n")
		b.Write(data)
		if !bytes.HasSuffix(data, []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}
