package agent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/api"
)

// TestRequestBodyLimit: the agent reads a request body of exactly
// api.MaxRequestBytes; one byte more is refused with 413, the limit and
// what to do, not read on.
func TestRequestBodyLimit(t *testing.T) {
	handler := limitBodies(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		docs, err := readDocuments(r)
		if err != nil {
			writeBodyError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, len(docs))
	}))
	body := func(size int) string {
		const head, tail = `{"objects":[{"source":"","object":"`, `"}]}`
		return head + strings.Repeat("x", size-len(head)-len(tail)) + tail
	}
	for _, c := range []struct {
		size int
		code int
		want string
	}{
		{api.MaxRequestBytes, http.StatusOK, "1"},
		{api.MaxRequestBytes + 1, http.StatusRequestEntityTooLarge, "over the agent's limit of 64 MiB per request: apply the manifests in parts"},
	} {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/apply", strings.NewReader(body(c.size))))
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.want) {
			t.Errorf("a body of %d bytes: %d %s, want %d and %q", c.size, rec.Code, rec.Body, c.code, c.want)
		}
	}
}
