package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestCrossNamespaceBackendNeedsReferenceGrant: a route's backendRef to a
// Service of another namespace is not followed until a ReferenceGrant of
// that namespace permits it: its requests are answered 500 and the route's
// ResolvedRefs is False (RefNotPermitted); once the grant is applied they
// reach the other namespace's pod and ResolvedRefs turns True; deleting the
// grant takes the permission back.
func TestCrossNamespaceBackendNeedsReferenceGrant(t *testing.T) {
	l := newLab(t, "redirect-peer", "testdata/cross-namespace-route.yaml")
	l.waitProxyConfigured()
	front := "http://" + l.clusterIP("front") + "/"

	// until polls the request until its status is want, or fails after 20 s.
	until := func(want int, why string) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			status, body := l.httpGet("client", "GET", front)
			if status == want {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: GET %s answered %d %q, want %d", why, front, status, body, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	resolvedRefs := func() (status, reason, message string) {
		t.Helper()
		var rt struct {
			Status struct {
				Parents []struct {
					Conditions []struct{ Type, Status, Reason, Message string }
				}
			}
		}
		if err := json.Unmarshal([]byte(l.mustShunt("get", "httproutes", "to-shop", "-o", "json")), &rt); err != nil {
			t.Fatal(err)
		}
		for _, p := range rt.Status.Parents {
			for _, c := range p.Conditions {
				if c.Type == "ResolvedRefs" {
					return c.Status, c.Reason, c.Message
				}
			}
		}
		return "", "", ""
	}

	until(500, "no ReferenceGrant")
	if st, reason, msg := resolvedRefs(); st != "False" || reason != "RefNotPermitted" || !strings.Contains(msg, "shop/web:80") {
		t.Errorf("ResolvedRefs without a grant: %s %s %q, want False RefNotPermitted naming shop/web:80", st, reason, msg)
	}

	l.mustShunt("apply", "-f", "testdata/shop-grant.yaml")
	if body := until(200, "with the grant"); !strings.Contains(body, "web") {
		t.Errorf("with the grant the request reached %q, want shop's web pod", body)
	}
	if st, reason, _ := resolvedRefs(); st != "True" {
		t.Errorf("ResolvedRefs with the grant: %s %s, want True", st, reason)
	}

	l.mustShunt("delete", "-f", "testdata/shop-grant.yaml")
	until(500, "the grant deleted")
	if st, reason, _ := resolvedRefs(); st != "False" || reason != "RefNotPermitted" {
		t.Errorf("ResolvedRefs after the grant went: %s %s, want False RefNotPermitted", st, reason)
	}
}
