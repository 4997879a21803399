package manifest

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseValidate: whatever bytes a user applies, parsing and validation
// end with objects or an error that says something; never a panic or a
// hang. Seeds: every manifest the tests and examples use.
func FuzzParseValidate(f *testing.F) {
	for _, glob := range []string{"../../test/e2e/testdata/*.yaml", "../../examples/*/*.yaml", "../../deploy/*.yaml"} {
		files, _ := filepath.Glob(glob)
		for _, p := range files {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
			}
		}
	}
	f.Add([]byte("apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: Pod, metadata: {name: a}}]\n"))
	f.Add([]byte("{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"s\"},\"spec\":{\"ports\":[{\"port\":80}]}}"))
	f.Add([]byte("---\n---\n# only a comment\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := Parse("fuzz.yaml", data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if err := Validate(objs); err != nil && err.Error() == "" {
			t.Fatal("a validation error without a message")
		}
		for _, o := range objs {
			_ = o.Key() // every decoded object is addressable
		}
		if refs, err := DecodeReferences(splitForFuzz(data)); err == nil {
			for _, r := range refs {
				_ = r.Key()
			}
		}
	})
}

// splitForFuzz splits data as a client does before sending it.
func splitForFuzz(data []byte) []Document {
	var errs Errors
	return splitDocuments("fuzz.yaml", data, &errs)
}
