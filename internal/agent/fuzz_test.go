package agent

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/shuntnet/shunt/internal/manifest"
)

// FuzzObjectsRequest: any body sent to the agent's apply, delete or wait
// endpoints is decoded into documents and objects, or refused with an
// error; never a panic.
func FuzzObjectsRequest(f *testing.F) {
	f.Add([]byte(`{"objects":[{"source":"a.yaml#1","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}}]}`))
	f.Add([]byte(`{"objects":[{"source":"x","object":null}]}`))
	f.Add([]byte(`{"objects":[{"object":{"kind":"List","items":[{}]}}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		docs, err := readDocuments(httptest.NewRequest("POST", "/v1/apply", bytes.NewReader(body)))
		if err != nil {
			return
		}
		if objs, err := manifest.Decode(docs); err == nil {
			_ = manifest.Validate(objs)
		}
		_, _ = manifest.DecodeReferences(docs)
	})
}
