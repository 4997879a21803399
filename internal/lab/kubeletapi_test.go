package lab

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// testCA signs client certificates for the tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client is an HTTPS client presenting a certificate of this CA for user
// cn in groups (the kubelet's own certificate is not checked, as the
// API server without --kubelet-certificate-authority does not).
func (ca testCA) client(t *testing.T, cn string, groups ...string) *http.Client {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn, Organization: groups}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true,
		Certificates:       []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}}}
}

// testKubeletAPI serves the kubelet API of a node with one pod,
// default/p, whose container c logged three lines and still runs.
func testKubeletAPI(t *testing.T, ca testCA) (string, *ContainerRecord) {
	t.Helper()
	dir := t.TempDir()
	c := ContainerRecord{Name: "c", ShimPID: os.Getpid(), LogFile: filepath.Join(dir, "c.log"), ExitFile: filepath.Join(dir, "c.exit"),
		Last: &LastRun{LogFile: filepath.Join(dir, "c.0.log")}}
	// As the shim writes it (crilog.go): b on stderr.
	cri := "2026-01-01T00:00:01Z stdout F a\n2026-01-01T00:00:02.5Z stderr F b\n2026-01-01T00:00:03Z stdout F c\n"
	if err := os.WriteFile(c.LogFile, []byte(cri), 0o644); err != nil {
		t.Fatal(err)
	}
	// The previous instance's, from a shim of before the CRI format.
	if err := os.WriteFile(c.Last.LogFile, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := &APIKubelet{
		cfg:     Config{NodeName: "n1", NodeIP: netip.MustParseAddr("127.0.0.1"), Log: slog.New(slog.DiscardHandler)},
		kubelet: kubelet{pods: map[string]*PodRecord{"default/p": {Namespace: "default", Name: "p", UID: "u1", Containers: []ContainerRecord{c}}}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	api, err := k.ServeKubeletAPI(ctx, k.cfg.NodeIP, 0, ca.pem)
	if err != nil {
		t.Fatal(err)
	}
	return "https://" + api.Addr().String(), &c
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestKubeletAPIClients: only a client whose certificate the cluster's CA
// signed, in group system:masters (the API server's kubelet client), is
// served.
func TestKubeletAPIClients(t *testing.T) {
	ca := newTestCA(t)
	base, _ := testKubeletAPI(t, ca)
	if code, body := get(t, ca.client(t, "kube-apiserver-kubelet-client", "system:masters"), base+"/healthz"); code != 200 {
		t.Errorf("the API server's client: %d %s", code, body)
	}
	if code, body := get(t, ca.client(t, "system:node:n2", "system:nodes"), base+"/containerLogs/default/p/c"); code != http.StatusForbidden {
		t.Errorf("another node's client read a container's log: %d %s", code, body)
	}
	other := newTestCA(t)
	if _, err := other.client(t, "admin", "system:masters").Get(base + "/healthz"); err == nil {
		t.Error("a client certificate of another CA was accepted")
	}
	anonymous := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if _, err := anonymous.Get(base + "/healthz"); err == nil {
		t.Error("a client without a certificate was accepted")
	}
}

// TestKubeletAPIContainerLogs: pods/log as kubectl logs asks for it from
// a log in the CRI's format: all, the last lines, a byte limit, times,
// since a time, one stream, the previous instance's (a log of an older
// shim, lines without times), following until the container ends (a line
// written in pieces comes out whole); options kubelet refuses are refused.
func TestKubeletAPIContainerLogs(t *testing.T) {
	ca := newTestCA(t)
	base, c := testKubeletAPI(t, ca)
	cl := ca.client(t, "kube-apiserver-kubelet-client", "system:masters")
	for _, tc := range []struct {
		query, want string
		code        int
	}{
		{"", "a\nb\nc\n", 200},
		{"?tailLines=2", "b\nc\n", 200},
		{"?tailLines=0", "", 200},
		{"?tailLines=9", "a\nb\nc\n", 200},
		{"?limitBytes=3", "a\nb", 200},
		{"?timestamps=true", "2026-01-01T00:00:01Z a\n2026-01-01T00:00:02.5Z b\n2026-01-01T00:00:03Z c\n", 200},
		{"?timestamps=true&tailLines=1", "2026-01-01T00:00:03Z c\n", 200},
		{"?sinceTime=2026-01-01T00:00:02Z", "b\nc\n", 200},
		{"?sinceTime=2026-01-01T00:00:03Z&timestamps=true", "2026-01-01T00:00:03Z c\n", 200},
		{"?sinceSeconds=60", "", 200}, // written long ago
		{"?stream=Stderr", "b\n", 200},
		{"?stream=Stdout&limitBytes=100", "a\nc\n", 200},
		{"?previous=true", "old\n", 200},
		{"?previous=true&timestamps=true", "old\n", 200}, // no times in an old log
		{"?sinceSeconds=5&sinceTime=2026-01-01T00:00:02Z", "at most one of sinceTime or sinceSeconds", 400},
		{"?stream=Stderr&tailLines=1", "mutually exclusive", 400},
		{"?tailLines=x", "tailLines", 400},
	} {
		code, body := get(t, cl, base+"/containerLogs/default/p/c"+tc.query)
		if code != tc.code || (tc.code == 200 && body != tc.want) || (tc.code != 200 && !strings.Contains(body, tc.want)) {
			t.Errorf("logs%s: %d %q, want %d %q", tc.query, code, body, tc.code, tc.want)
		}
	}
	if code, body := get(t, cl, base+"/containerLogs/default/nope/c"); code != 404 {
		t.Errorf("logs of a pod not on the node: %d %s", code, body)
	}

	// Follow: what the container writes next, until it ends.
	go func() {
		time.Sleep(300 * time.Millisecond)
		f, _ := os.OpenFile(c.LogFile, os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString("2026-01-01T00:00:04Z stdout P d")
		time.Sleep(300 * time.Millisecond)
		f.WriteString("\n2026-01-01T00:00:04Z stdout F e\n") // the rest of the line, in pieces
		f.Close()
		time.Sleep(300 * time.Millisecond)
		os.WriteFile(c.ExitFile, []byte(`{"exitCode":0}`), 0o644)
	}()
	start := time.Now()
	if code, body := get(t, cl, base+"/containerLogs/default/p/c?follow=true&tailLines=1"); code != 200 || body != "c\nde\n" {
		t.Errorf("logs -f --tail=1: %d %q, want the last line, then the one written later", code, body)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("logs -f ended %v after the container did", time.Since(start))
	}
}

// The kubelet API asks the API server about each client (the review's
// attributes are kubelet's: nodes, the node's name, the verb of the
// method, proxy, or healthz then proxy) and caches the answers as
// kubelet's webhook does; without the right to ask, it serves
// system:masters only.
func TestKubeletAPIReviews(t *testing.T) {
	var reviews []authorizationv1.ResourceAttributes
	forbidden := false
	review := func(_ context.Context, r *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error) {
		if forbidden {
			return nil, apierrors.NewForbidden(schema.GroupResource{Group: "authorization.k8s.io", Resource: "subjectaccessreviews"}, "", errors.New("no"))
		}
		ra := *r.Spec.ResourceAttributes
		reviews = append(reviews, ra)
		out := r.DeepCopy()
		// alice may use nodes/proxy of n1; bob only nodes/healthz.
		out.Status.Allowed = (r.Spec.User == "alice" && ra.Subresource == "proxy" && ra.Name == "n1") ||
			(r.Spec.User == "bob" && ra.Subresource == "healthz")
		return out, nil
	}
	now := time.Now()
	a := newReviewAuthorizer("n1", review, slog.New(slog.DiscardHandler))
	a.now = func() time.Time { return now }
	h := authorized(a, slog.New(slog.DiscardHandler), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	call := func(user, method, path string, groups ...string) int {
		r := httptest.NewRequest(method, path, nil)
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: user, Organization: groups}}}}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for _, tc := range []struct {
		user, method, path string
		want               int
	}{
		{"alice", "POST", "/exec/default/p/c", 200},
		{"alice", "GET", "/containerLogs/default/p/c", 200},
		{"alice", "GET", "/healthz", 200}, // healthz denied, then proxy allowed
		{"bob", "GET", "/healthz", 200},
		{"bob", "GET", "/containerLogs/default/p/c", 403},
		{"mallory", "POST", "/portForward/default/p", 403},
	} {
		if got := call(tc.user, tc.method, tc.path); got != tc.want {
			t.Errorf("%s %s %s: %d, want %d", tc.user, tc.method, tc.path, got, tc.want)
		}
	}
	if ra := reviews[0]; ra.Verb != "create" || ra.Resource != "nodes" || ra.Subresource != "proxy" || ra.Name != "n1" || ra.Version != "v1" {
		t.Errorf("the first review %+v: want create nodes/proxy of n1", ra)
	}
	if ra := reviews[2]; ra.Verb != "get" || ra.Subresource != "healthz" {
		t.Errorf("the review of GET /healthz %+v: want get nodes/healthz first", ra)
	}
	// Cached: allowed for 5 minutes, denied for 30 s.
	n := len(reviews)
	call("alice", "POST", "/exec/default/p/c")
	call("mallory", "POST", "/portForward/default/p")
	if len(reviews) != n {
		t.Errorf("%d reviews more for answers still cached", len(reviews)-n)
	}
	now = now.Add(time.Minute)
	call("alice", "POST", "/exec/default/p/c")
	call("mallory", "POST", "/portForward/default/p")
	if len(reviews) != n+1 {
		t.Errorf("after a minute: %d reviews more, want 1 (the denial's cache ended, the allowance's not)", len(reviews)-n)
	}
	// The API server does not let the kubelet ask: masters only.
	forbidden = true
	now = now.Add(time.Hour)
	if got := call("alice", "POST", "/exec/default/p/c"); got != 403 {
		t.Errorf("alice with no review possible: %d, want 403", got)
	}
	if got := call("admin", "POST", "/exec/default/p/c", "system:masters"); got != 200 {
		t.Errorf("system:masters with no review possible: %d, want 200", got)
	}
	if got := call("admin", "GET", "/healthz"); got != 403 {
		t.Errorf("a client outside system:masters with no review possible: %d, want 403", got)
	}
}
