package manifest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func ns(name string) string {
	return "apiVersion: v1\nkind: Namespace\nmetadata: {name: " + name + "}\n"
}

// writeFiles creates files (relative path -> content) under a new temp dir.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// sources lists "source key" for each object, with dir made relative.
func sources(dir string, objs []Object) []string {
	var out []string
	for _, o := range objs {
		src := strings.TrimPrefix(o.Source, dir+string(filepath.Separator))
		out = append(out, filepath.ToSlash(src)+" "+o.Key().String())
	}
	return out
}

func TestLoadDirectoryRecursiveSorted(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"b.yaml":           ns("b"),
		"a.json":           `{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}`,
		"sub/z.yml":        ns("z") + "---\n" + ns("zz"),
		"sub/deeper/c.yml": ns("c"),
		"c.yaml":           ns("c2"),
		"README.md":        "not a manifest",
		"notes.txt":        "kind: Nonsense",
	})
	objs, err := Load([]string{dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"a.json#1 Namespace//a",
		"b.yaml#1 Namespace//b",
		"c.yaml#1 Namespace//c2",
		"sub/deeper/c.yml#1 Namespace//c",
		"sub/z.yml#1 Namespace//z",
		"sub/z.yml#2 Namespace//zz",
	}
	if got := sources(dir, objs); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestLoadFilesAndStdin(t *testing.T) {
	dir := writeFiles(t, map[string]string{"one.yaml": ns("one"), "manifest.txt": ns("txt")})
	list := `{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "in"}}]}`
	objs, err := Load([]string{
		filepath.Join(dir, "one.yaml"),
		"-",
		filepath.Join(dir, "manifest.txt"), // named explicitly: read whatever the extension
	}, strings.NewReader(list))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"one.yaml#1 Namespace//one", "<stdin>#1 items[0] Namespace//in", "manifest.txt#1 Namespace//txt"}
	if got := sources(dir, objs); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestLoadStdinAlone(t *testing.T) {
	objs, err := Load([]string{"-"}, strings.NewReader(ns("a")+"---\n"+ns("b")))
	if err != nil {
		t.Fatal(err)
	}
	if got := sources("", objs); !reflect.DeepEqual(got, []string{"<stdin>#1 Namespace//a", "<stdin>#2 Namespace//b"}) {
		t.Errorf("got %q", got)
	}
}

func TestLoadErrors(t *testing.T) {
	empty := t.TempDir()
	dir := writeFiles(t, map[string]string{
		"a.yaml": ns("dup"),
		"b.yaml": ns("dup") + "---\nkind: Gadget\n",
		"c.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n",
	})
	for _, tc := range []struct {
		name  string
		paths []string
		stdin string
		want  []string // lines of the error, with dir replaced by DIR
	}{
		{"missing file", []string{filepath.Join(empty, "nope.yaml")}, "",
			[]string{"EMPTY/nope.yaml: no such file or directory"}},
		{"empty directory", []string{empty}, "",
			[]string{"EMPTY: directory has no *.yaml, *.yml or *.json files"}},
		{"stdin twice", []string{"-", "-"}, ns("a"),
			[]string{`<stdin>: cannot read: "-" (stdin) given more than once`}},
		// Parse and validation problems of all files come back together.
		{"every problem in every file", []string{dir}, "",
			[]string{
				"DIR/b.yaml#2: Gadget (unnamed): kind: unknown kind \"Gadget\": supported kinds are discovery.k8s.io/v1 EndpointSlice, gateway.networking.k8s.io/v1 GRPCRoute, gateway.networking.k8s.io/v1 HTTPRoute, gateway.networking.k8s.io/v1beta1 ReferenceGrant, networking.k8s.io/v1 NetworkPolicy, shunt.io/v1alpha1 ShuntNetworkPolicy, v1 Namespace, v1 Node, v1 Pod, v1 Service",
				"DIR/b.yaml#1: Namespace dup: metadata.name: duplicate: Namespace dup is also defined in DIR/a.yaml#1",
				"DIR/c.yaml#1: Pod default/p: spec.containers[0].command: must not be empty: the lab runs command + args as the container's process (the image is not run)",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Load(tc.paths, strings.NewReader(tc.stdin))
			if err == nil {
				t.Fatalf("no error; loaded %v", sources("", objs))
			}
			if _, ok := err.(*Errors); !ok {
				t.Errorf("error is %T, want *Errors", err)
			}
			got := strings.ReplaceAll(strings.ReplaceAll(err.Error(), empty, "EMPTY"), dir, "DIR")
			if want := strings.Join(tc.want, "\n"); got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestManyDocumentsKeepTheirOrder: documents are decoded and validated on
// every CPU; objects and problems still come out in file order.
func TestManyDocumentsKeepTheirOrder(t *testing.T) {
	var b strings.Builder
	for i := range 500 {
		port := "80"
		if i%50 == 7 {
			port = "70000" // invalid: every 50th document from the 8th
		}
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%d}\nspec: {ports: [{port: %s}]}\n", i, port)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "many.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load([]string{path}, nil)
	var errs *Errors
	if !errors.As(err, &errs) || len(errs.List) != 10 {
		t.Fatalf("want 10 problems, got %v", err)
	}
	for i, fe := range errs.List {
		if want := fmt.Sprintf("%s#%d", path, i*50+8); fe.Source != want {
			t.Errorf("problem %d from %s, want %s", i, fe.Source, want)
		}
	}
	docs, err := ReadDocuments([]string{path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(docs)
	if err != nil || len(objs) != 500 {
		t.Fatalf("decoded %d objects: %v", len(objs), err)
	}
	for i, o := range objs {
		if _, name := o.NamespaceName(); name != fmt.Sprintf("s%d", i) || o.Source != fmt.Sprintf("%s#%d", path, i+1) {
			t.Fatalf("object %d is %s from %s", i, name, o.Source)
		}
	}
}

// What users copy and what the end-to-end tests apply passes validation:
// each example folder as one set, each e2e manifest on its own (they are
// applied in different combinations).
func TestExamplesAndTestdataValidate(t *testing.T) {
	for _, pattern := range []string{"../../examples/*", "../../test/e2e/testdata/*.yaml"} {
		paths, err := filepath.Glob(pattern)
		if err != nil || len(paths) == 0 {
			t.Fatalf("%s: nothing found (%v)", pattern, err)
		}
		for _, p := range paths {
			// examples/ holds its own Go test beside the folders.
			if st, err := os.Stat(p); err == nil && !st.IsDir() && !slices.Contains([]string{".yaml", ".yml", ".json"}, filepath.Ext(p)) {
				continue
			}
			if _, err := Load([]string{p}, nil); err != nil {
				t.Errorf("%s:\n%v", p, err)
			}
		}
	}
}
