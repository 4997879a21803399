package relay

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/flows"
)

// agent is a node's flow API as the agent serves it (flows.Handler over a
// history), on a TCP listener, by mutual TLS when tlsDir is set.
type agent struct {
	node    string
	history *flows.History
	addr    string
	srv     *http.Server
}

func startAgent(t *testing.T, node, tlsDir string) *agent {
	t.Helper()
	a := &agent{node: node, history: flows.NewHistory(1000)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if tlsDir != "" {
		cfg, err := api.LoadTLS(tlsDir, true)
		if err != nil {
			t.Fatal(err)
		}
		ln = tls.NewListener(ln, cfg)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /v1/flows", flows.Handler(a.history, node))
	a.srv = &http.Server{Handler: mux}
	go a.srv.Serve(ln)
	a.addr = ln.Addr().String()
	t.Cleanup(func() { a.srv.Close() })
	return a
}

func (a *agent) peer(tlsConfig *tls.Config) Peer {
	return Peer{Node: a.node, Addr: a.addr, Stream: api.NewRemoteClient(a.addr, tlsConfig).StreamContext}
}

// discovery is a set of peers a test changes while the relay runs.
type discovery struct {
	mu    sync.Mutex
	peers []Peer
}

func (d *discovery) set(p ...Peer) {
	d.mu.Lock()
	d.peers = p
	d.mu.Unlock()
}

func (d *discovery) discover(context.Context) ([]Peer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.peers), nil
}

func flowAt(t0 time.Time, ms int, pod string) flows.Flow {
	return flows.Flow{Time: t0.Add(time.Duration(ms) * time.Millisecond), Verdict: "FORWARDED", Event: "new",
		Source: flows.Endpoint{Pod: pod}, Protocol: "TCP"}
}

// TestRelayMergesNodesByTimeAndFollowsChanges: two agents' flows, sent
// interleaved out of time order across nodes, come out of the relay in
// time order with their nodes; a node removed from discovery is let go
// (its new flows no longer arrive) and a new one is followed, its recent
// history backfilled.
func TestRelayMergesNodesByTimeAndFollowsChanges(t *testing.T) {
	a1, a2 := startAgent(t, "node-1", ""), startAgent(t, "node-2", "")
	d := &discovery{}
	d.set(a1.peer(nil), a2.peer(nil))
	r := New(d.discover, Options{Window: 300 * time.Millisecond, Rescan: 100 * time.Millisecond, Retry: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	waitFor(t, "both agents followed", func() bool {
		n := r.Nodes()
		return len(n) == 2 && n[0].Following && n[1].Following
	})
	// Following is set as a stream opens: give them a moment to be open
	// before writing (a flow written earlier is backfilled anyway).
	time.Sleep(200 * time.Millisecond)

	t0 := time.Now()
	// node-2's older flows arrive after node-1's newer ones.
	a1.history.Add(flowAt(t0, 20, "default/a"))
	a1.history.Add(flowAt(t0, 40, "default/b"))
	a2.history.Add(flowAt(t0, 10, "default/c"))
	a2.history.Add(flowAt(t0, 30, "default/d"))
	waitFor(t, "four merged flows", func() bool { return r.History().Len() >= 4 })
	got := r.History().Query(flows.Filter{}, 0)
	var order []string
	for _, fl := range got {
		order = append(order, fl.Node+" "+fl.Source.Pod)
	}
	want := []string{"node-2 default/c", "node-1 default/a", "node-2 default/d", "node-1 default/b"}
	if !slices.Equal(order, want) {
		t.Fatalf("merged order %q, want by time %q", order, want)
	}

	// node-2 leaves, node-3 comes with a flow already in its history.
	a3 := startAgent(t, "node-3", "")
	a3.history.Add(flowAt(time.Now(), 0, "default/e"))
	d.set(a1.peer(nil), a3.peer(nil))
	waitFor(t, "node-3 followed and node-2 let go", func() bool {
		n := r.Nodes()
		return len(n) == 2 && n[1].Node == "node-3" && n[1].Following
	})
	a2.history.Add(flowAt(time.Now(), 0, "default/lost"))
	a1.history.Add(flowAt(time.Now(), 0, "default/f"))
	waitFor(t, "node-3's backfill and node-1's new flow", func() bool { return r.History().Len() >= 6 })
	time.Sleep(400 * time.Millisecond) // past the window: node-2's would have arrived
	pods := map[string]string{}
	for _, fl := range r.History().Query(flows.Filter{}, 0) {
		pods[fl.Source.Pod] = fl.Node
	}
	if pods["default/e"] != "node-3" || pods["default/f"] != "node-1" {
		t.Errorf("flows after the change: %v, want default/e from node-3 and default/f from node-1", pods)
	}
	if _, ok := pods["default/lost"]; ok {
		t.Errorf("a flow of node-2, no longer discovered, reached the relay")
	}

	// The relay serves the merged flows with the agent's API and filters.
	srv := &http.Server{Handler: r.Handler()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	var served []flows.Flow
	if err := api.NewRemoteClient(ln.Addr().String(), nil).Stream("/v1/flows?pod=default/e", func(line []byte) error {
		var fl flows.Flow
		if err := json.Unmarshal(line, &fl); err != nil {
			return err
		}
		served = append(served, fl)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(served) != 1 || served[0].Node != "node-3" {
		t.Errorf("relay's /v1/flows?pod=default/e = %+v, want node-3's one flow", served)
	}
}

// TestRelayReachesAgentsByMutualTLS: with the cluster's CA, the relay
// follows an agent's TLS listener; a client without a certificate of that
// CA is refused by the agent, and one the relay cannot verify is not
// followed.
func TestRelayReachesAgentsByMutualTLS(t *testing.T) {
	ca := newCA(t)
	agentDir, relayDir, strangerDir := ca.issue(t, "agent", true), ca.issue(t, "relay", false), newCA(t).issue(t, "stranger", false)
	a := startAgent(t, "node-1", agentDir)
	a.history.Add(flowAt(time.Now(), 0, "default/a"))

	relayTLS, err := api.LoadTLS(relayDir, false)
	if err != nil {
		t.Fatal(err)
	}
	d := &discovery{}
	d.set(a.peer(relayTLS))
	r := New(d.discover, Options{Rescan: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	waitFor(t, "the agent's flow through mutual TLS", func() bool { return r.History().Len() == 1 })

	strangerTLS, err := api.LoadTLS(strangerDir, false)
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*tls.Config{"no TLS": nil, "another CA's certificate": strangerTLS} {
		err := api.NewRemoteClient(a.addr, cfg).Stream("/v1/flows", func([]byte) error { return nil })
		if err == nil {
			t.Errorf("%s: the agent served its flows", name)
		}
	}
	noCert := &tls.Config{InsecureSkipVerify: true}
	if err := api.NewRemoteClient(a.addr, noCert).Stream("/v1/flows", func([]byte) error { return nil }); err == nil {
		t.Errorf("a client without a certificate read the agent's flows")
	}

	// A new CA's certificates written over both sides' files (a Secret
	// updated in place) take over at the next connection, no restart.
	ca2 := newCA(t)
	ca2.issueInto(t, agentDir, "agent", true)
	ca2.issueInto(t, relayDir, "relay", false)
	if err := api.NewRemoteClient(a.addr, relayTLS).Stream("/v1/flows", func([]byte) error { return nil }); err != nil {
		t.Errorf("after both sides' certificates were replaced: %v", err)
	}
	if err := api.NewRemoteClient(a.addr, strangerTLS).Stream("/v1/flows", func([]byte) error { return nil }); err == nil {
		t.Errorf("after the rotation, another CA's client was served")
	}
	if err := api.CheckPlainListen("0.0.0.0:4244"); err == nil {
		t.Errorf("a plain listener on every address was accepted")
	}
	if err := api.CheckPlainListen("127.0.0.1:4244"); err != nil {
		t.Errorf("plain loopback refused: %v", err)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shunt-flows-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a TLS directory (ca.crt, tls.crt, tls.key) for a server or
// client certificate the CA signs.
func (ca *testCA) issue(t *testing.T, name string, server bool) string {
	t.Helper()
	return ca.issueInto(t, filepath.Join(t.TempDir(), name), name, server)
}

func (ca *testCA) issueInto(t *testing.T, dir, name string, server bool) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := x509.ExtKeyUsageClientAuth
	if server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(dir, 0o700)
	for file, data := range map[string][]byte{
		api.TLSCAFile:   ca.pem,
		api.TLSCertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		api.TLSKeyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
