package relay

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/testpki"
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
	ca := testpki.NewCA(t)
	agentDir, relayDir, strangerDir := ca.Issue(t, "agent", true), ca.Issue(t, "relay", false), testpki.NewCA(t).Issue(t, "stranger", false)
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
	ca2 := testpki.NewCA(t)
	ca2.IssueInto(t, agentDir, "agent", true)
	ca2.IssueInto(t, relayDir, "relay", false)
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
