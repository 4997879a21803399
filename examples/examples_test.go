// Package examples holds no code: its test checks that every manifest under
// examples/ is ordinary Kubernetes YAML that a real API server accepts, not
// only what the lab accepts (the lab ignores a container's image; an API
// server refuses a container without one).
package examples

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

func TestExamplesContainersHaveNameAndImage(t *testing.T) {
	var paths []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no examples found")
	}
	docs, err := manifest.ReadDocuments(paths, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Decode(docs)
	if err != nil {
		t.Fatal(err)
	}
	pods := 0
	for _, o := range objs {
		pod, ok := o.Obj.(*corev1.Pod)
		if !ok {
			continue
		}
		pods++
		checkPodSpec(t, o.Source, "Pod "+pod.Namespace+"/"+pod.Name, &pod.Spec)
	}
	if pods == 0 {
		t.Fatal("no Pod in examples/: the test checks nothing")
	}
}

func checkPodSpec(t *testing.T, source, object string, spec *corev1.PodSpec) {
	t.Helper()
	for field, cs := range map[string][]corev1.Container{
		"spec.initContainers": spec.InitContainers,
		"spec.containers":     spec.Containers,
	} {
		for i, c := range cs {
			if c.Name == "" {
				t.Errorf("examples/%s: %s: %s[%d].name: Required value", source, object, field, i)
			}
			if c.Image == "" {
				t.Errorf("examples/%s: %s: %s[%d].image: Required value (the lab ignores it; a real API server refuses the pod)", source, object, field, i)
			}
		}
	}
}
