package manifest

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// references splits and decodes a stream as the agent does for a delete.
func references(t *testing.T, doc string) ([]Object, error) {
	t.Helper()
	var errs Errors
	docs := splitDocuments("x.yaml", []byte(doc), &errs)
	if err := errs.orNil(); err != nil {
		t.Fatalf("splitting: %v", err)
	}
	objs, err := DecodeReferences(docs)
	if err != nil {
		return nil, err
	}
	return objs, CheckReferences(objs)
}

// A delete needs apiVersion, kind, namespace and name; what Validate asks
// of a spec does not matter.
func TestReferencesNeedOnlyWhatNamesTheObject(t *testing.T) {
	minimal := "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n"
	full, err := Parse("x.yaml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	assertHasError(t, Validate(full), FieldError{"x.yaml#1", "Service shop/web", "spec.ports", "at least one port"})

	doc := minimal +
		// The namespace defaults, as for apply.
		"---\napiVersion: shunt.io/v1alpha1\nkind: ShuntNetworkPolicy\nmetadata: {name: snp}\n" +
		// A spec Decode refuses (unknown field, wrong type) is not read.
		"---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {app: web}}\nspec: {containers: [{name: c, comand: [x], ports: [{containerPort: http}]}]}\nstatuss: {}\n" +
		"---\napiVersion: v1\nkind: Namespace\nmetadata: {name: prod}\n" +
		"---\napiVersion: v1\nkind: List\nitems: [{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: web-1, namespace: shop}}]\n" +
		// A route Validate refuses (its parent is a Gateway) is deleted all the same.
		"---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec: {parentRefs: [{name: gw}]}\n"
	objs, err := references(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key().String())
	}
	want := []string{"Service/shop/web", "ShuntNetworkPolicy/default/snp", "Pod/default/p", "Namespace//prod", "EndpointSlice/shop/web-1", "HTTPRoute/default/r"}
	if len(keys) != len(want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	for i := range want {
		if keys[i] != want[i] {
			t.Errorf("keys %v, want %v", keys, want)
			break
		}
	}
	if objs[1].Source != "x.yaml#2" || objs[4].Source != "x.yaml#5 items[0]" {
		t.Errorf("sources %q %q", objs[1].Source, objs[4].Source)
	}
	// Only the reference is decoded: no spec, no defaults.
	if pod := objs[2].Obj.(*corev1.Pod); len(pod.Spec.Containers) != 0 || pod.Labels["app"] != "web" || pod.Kind != "Pod" {
		t.Errorf("pod reference: %+v", pod)
	}
}

func TestReferencesRejects(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      FieldError // Message is matched as a substring
	}{
		{"unknown kind", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}",
			FieldError{"x.yaml#1", "Deployment d", "kind", `unknown kind "Deployment": supported kinds are`}},
		{"missing kind", "apiVersion: v1\nmetadata: {name: d}",
			FieldError{"x.yaml#1", "", "kind", "required"}},
		{"wrong apiVersion", "apiVersion: v1\nkind: NetworkPolicy\nmetadata: {name: np}",
			FieldError{"x.yaml#1", "NetworkPolicy default/np", "apiVersion", `"v1" is not supported for NetworkPolicy: use "networking.k8s.io/v1"`}},
		{"missing apiVersion", "kind: Service\nmetadata: {name: web}",
			FieldError{"x.yaml#1", "Service default/web", "apiVersion", "required"}},
		{"name required", "apiVersion: v1\nkind: Service\nmetadata: {namespace: shop}",
			FieldError{"x.yaml#1", "Service (unnamed)", "metadata.name", "required"}},
		{"no metadata", "apiVersion: v1\nkind: Service",
			FieldError{"x.yaml#1", "Service (unnamed)", "metadata.name", "required"}},
		{"service name not a label", "apiVersion: v1\nkind: Service\nmetadata: {name: a.b}",
			FieldError{"x.yaml#1", "Service default/a.b", "metadata.name", "must not contain dots"}},
		{"bad namespace", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: Shop}",
			FieldError{"x.yaml#1", "Service Shop/web", "metadata.namespace", "RFC 1123 label"}},
		{"cluster-scoped with namespace", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, namespace: b}",
			FieldError{"x.yaml#1", "Namespace b/a", "metadata.namespace", "must be empty"}},
		{"metadata is strict", "apiVersion: v1\nkind: Service\nmetadata: {nmae: web}",
			FieldError{"x.yaml#1", "Service (unnamed)", "metadata.nmae", "unknown field"}},
		{"metadata types", "apiVersion: v1\nkind: Service\nmetadata: {name: 5}",
			FieldError{"x.yaml#1", "Service (unnamed)", "metadata.name", "got number, want a string"}},
		{"duplicate", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}",
			FieldError{"x.yaml#2", "Service default/web", "metadata.name", "duplicate: Service default/web is also named in x.yaml#1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := references(t, tc.doc)
			assertHasError(t, err, tc.want)
		})
	}
}

func TestCheckReferencesOfObjectsBuiltInCode(t *testing.T) {
	err := CheckReferences([]Object{{Source: "code", Obj: &corev1.ConfigMap{}}})
	assertHasError(t, err, FieldError{"code", " (unnamed)", "", "unsupported object type *v1.ConfigMap"})
	// No TypeMeta, no namespace: the kind comes from the Go type, and a
	// namespaced kind needs its namespace.
	err = CheckReferences([]Object{{Source: "code", Obj: &corev1.Service{}}})
	assertHasError(t, err, FieldError{"code", "Service (unnamed)", "metadata.namespace", "required"})
}
