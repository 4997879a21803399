package api

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// objectOfRequestSize is one object whose request encodes to exactly size
// bytes: 37 bytes of request around a JSON string.
func objectOfRequestSize(size int) []Object {
	return []Object{{Object: json.RawMessage(`"` + strings.Repeat("x", size-37-2) + `"`)}}
}

// TestEncodeObjectsLimit: a request of exactly MaxRequestBytes is built; one
// byte more is refused, saying how large, the limit and what to do.
func TestEncodeObjectsLimit(t *testing.T) {
	body, err := EncodeObjects(objectOfRequestSize(MaxRequestBytes))
	if err != nil || len(body) != MaxRequestBytes {
		t.Fatalf("request of exactly the limit: %d bytes, %v", len(body), err)
	}
	_, err = EncodeObjects(objectOfRequestSize(MaxRequestBytes + 1))
	var tooLarge *TooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.Size != MaxRequestBytes+1 {
		t.Fatalf("one byte over the limit: %v", err)
	}
	for _, want := range []string{"1 objects encoding to 64.0 MiB", "limit of 64 MiB", "apply the manifests in parts"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
