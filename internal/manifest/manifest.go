// Package manifest reads Kubernetes YAML (or JSON) into the typed objects of
// k8s.io/api, strictly: unknown kinds and fields are errors, and every error
// names the file, the document, the object and the field.
package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
)

// Object is one parsed manifest document.
type Object struct {
	Source string         // "path/file.yaml#2": file and 1-based document index
	Obj    runtime.Object // *corev1.Pod, *corev1.Service, ...
}

// Kind is the object's kind, e.g. "Pod".
func (o Object) Kind() string { return o.Obj.GetObjectKind().GroupVersionKind().Kind }

// NamespaceName returns the object's namespace ("" when cluster-scoped) and name.
func (o Object) NamespaceName() (ns, name string) {
	m := metaOf(o.Obj)
	return m.GetNamespace(), m.GetName()
}

// Key identifies an object across applies: "Pod/default/web", "Namespace//prod".
func (o Object) Key() string {
	ns, name := o.NamespaceName()
	return o.Kind() + "/" + ns + "/" + name
}

// kindInfo is what the lab knows about a kind.
type kindInfo struct {
	apiVersion string
	namespaced bool
	new        func() runtime.Object
}

var kinds = map[string]kindInfo{
	"Namespace":          {"v1", false, func() runtime.Object { return &corev1.Namespace{} }},
	"Pod":                {"v1", true, func() runtime.Object { return &corev1.Pod{} }},
	"Service":            {"v1", true, func() runtime.Object { return &corev1.Service{} }},
	"EndpointSlice":      {"discovery.k8s.io/v1", true, func() runtime.Object { return &discoveryv1.EndpointSlice{} }},
	"NetworkPolicy":      {"networking.k8s.io/v1", true, func() runtime.Object { return &networkingv1.NetworkPolicy{} }},
	"ShuntNetworkPolicy": {"shunt.io/v1alpha1", true, func() runtime.Object { return &ShuntNetworkPolicy{} }},
}

func supportedKinds() string {
	var names []string
	for k, v := range kinds {
		names = append(names, v.apiVersion+" "+k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// Load reads files, directories (recursively, *.yaml|*.yml|*.json in sorted
// order) and "-" (stdin), then validates the whole set.
func Load(paths []string, stdin io.Reader) ([]Object, error) {
	var objs []Object
	for _, p := range paths {
		files, err := expand(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			var data []byte
			if f == "-" {
				data, err = io.ReadAll(stdin)
				f = "<stdin>"
			} else {
				data, err = os.ReadFile(f)
			}
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", f, err)
			}
			parsed, err := Parse(f, data)
			if err != nil {
				return nil, err
			}
			objs = append(objs, parsed...)
		}
	}
	if err := Validate(objs); err != nil {
		return nil, err
	}
	return objs, nil
}

func expand(p string) ([]string, error) {
	if p == "-" {
		return []string{"-"}, nil
	}
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	if !st.IsDir() {
		return []string{p}, nil
	}
	var files []string
	err = filepath.WalkDir(p, func(f string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch filepath.Ext(f) {
		case ".yaml", ".yml", ".json":
			if !d.IsDir() {
				files = append(files, f)
			}
		}
		return nil
	})
	sort.Strings(files)
	if err == nil && len(files) == 0 {
		err = fmt.Errorf("%s: no *.yaml, *.yml or *.json files", p)
	}
	return files, err
}

// Parse parses one stream of YAML or JSON documents (and List kinds) into
// typed, defaulted objects. It does not check the set as a whole (Validate does).
func Parse(source string, data []byte) ([]Object, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []Object
	for doc := 1; ; doc++ {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		src := fmt.Sprintf("%s#%d", source, doc)
		if err != nil {
			return nil, fmt.Errorf("%s: not valid YAML or JSON: %w", src, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
			continue // empty document
		}
		objs, err := decodeDocument(src, raw)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
}

func decodeDocument(src string, raw []byte) ([]Object, error) {
	var head struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Items      []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("%s: not an object: %w", src, err)
	}
	if head.Kind == "List" {
		var out []Object
		for i, item := range head.Items {
			objs, err := decodeDocument(fmt.Sprintf("%s items[%d]", src, i), item)
			if err != nil {
				return nil, err
			}
			out = append(out, objs...)
		}
		return out, nil
	}
	info, ok := kinds[head.Kind]
	if !ok {
		if head.Kind == "" {
			return nil, fmt.Errorf("%s: kind: missing", src)
		}
		return nil, fmt.Errorf("%s: kind: unknown kind %q: supported kinds are %s", src, head.Kind, supportedKinds())
	}
	if head.APIVersion != info.apiVersion {
		return nil, fmt.Errorf("%s: %s: apiVersion: %q is not served; use %q", src, head.Kind, head.APIVersion, info.apiVersion)
	}
	obj := info.new()
	// sigs.k8s.io/json is the API server's strict decoder: its errors carry
	// the full field path (spec.containers[0].comand), not just the name.
	strictErrs, err := sigsjson.UnmarshalStrict(raw, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("%s: %s %s: %v", src, head.Kind, nameIn(raw), err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return nil, fmt.Errorf("%s: %s %s: %s", src, head.Kind, nameIn(raw), strings.Join(msgs, "; "))
	}
	if info.namespaced && metaOf(obj).GetNamespace() == "" {
		metaOf(obj).SetNamespace("default")
	}
	if !info.namespaced && metaOf(obj).GetNamespace() != "" {
		return nil, fmt.Errorf("%s: %s %s: metadata.namespace: must be empty: %s is not namespaced", src, head.Kind, nameIn(raw), head.Kind)
	}
	setDefaults(obj)
	return []Object{{Source: src, Obj: obj}}, nil
}

// nameIn digs metadata.name out of a document that failed to decode, so
// the error can still name the object.
func nameIn(raw []byte) string {
	var m struct {
		Metadata struct{ Name, Namespace string } `json:"metadata"`
	}
	json.Unmarshal(raw, &m)
	if m.Metadata.Namespace != "" {
		return m.Metadata.Namespace + "/" + m.Metadata.Name
	}
	return m.Metadata.Name
}

// metaOf returns the object's metadata accessor; every supported kind has one.
func metaOf(obj runtime.Object) interface {
	GetNamespace() string
	SetNamespace(string)
	GetName() string
	GetLabels() map[string]string
} {
	return obj.(interface {
		GetNamespace() string
		SetNamespace(string)
		GetName() string
		GetLabels() map[string]string
	})
}
