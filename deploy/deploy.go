// Package deploy holds what installs shunt on a cluster: its
// CustomResourceDefinitions (crds/, generated from internal/manifest's
// types and copied from the Gateway API release), the Helm chart
// (helm/shunt, whose crds/ is a link to crds/), the DaemonSet manifest
// (shunt.yaml, the chart rendered with its default values) and the CNI
// installer of the chart's init container (shunt-install-cni). The CRDs
// are embedded so that `shunt dev cluster up` can install them from the
// binary alone, as an operator does with `kubectl apply -f deploy/crds/`.
package deploy

// shunt.yaml is generated from the chart by tools/helm (the Helm Go module,
// kept out of shunt's go.mod); the first run compiles Helm (minutes), later
// ones reuse Go's cache of the `go run` executable.
//go:generate sh -c "cd ../tools/helm && GOWORK=off go run . manifest ../../deploy/helm/shunt > ../../deploy/shunt.yaml.tmp && mv ../../deploy/shunt.yaml.tmp ../../deploy/shunt.yaml"

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
