package agent

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/testpki"
)

// TestFlowsOverTCP: the agent's flows listener (shuntd --flows-addr with
// --flows-tls-dir) serves the node's flows, named by the node, to a client
// with a certificate of the cluster's CA, and to no other; without TLS it
// refuses an address beyond loopback.
func TestFlowsOverTCP(t *testing.T) {
	ca := testpki.NewCA(t)
	a := &Agent{log: slog.New(slog.DiscardHandler), flows: flows.NewHistory(16), nodeName: "node-7",
		cfg: Config{FlowsAddr: "127.0.0.1:0", FlowsTLSDir: ca.Issue(t, "agent", true)}}
	a.flows.Add(flows.Flow{Time: time.Now(), Verdict: "DROPPED", Source: flows.Endpoint{Pod: "default/a"}})
	srv, addr, err := a.serveFlowsTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	relayTLS, err := api.LoadTLS(ca.Issue(t, "relay", false), false)
	if err != nil {
		t.Fatal(err)
	}
	var got []flows.Flow
	if err := api.NewRemoteClient(addr.String(), relayTLS).Stream("/v1/flows?verdict=DROPPED", func(line []byte) error {
		var fl flows.Flow
		if err := json.Unmarshal(line, &fl); err != nil {
			return err
		}
		got = append(got, fl)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Node != "node-7" || got[0].Source.Pod != "default/a" {
		t.Errorf("flows over TCP: %+v, want the one drop, named by node-7", got)
	}
	strangerTLS, err := api.LoadTLS(testpki.NewCA(t).Issue(t, "stranger", false), false)
	if err != nil {
		t.Fatal(err)
	}
	for name, client := range map[string]*api.Client{"plain HTTP": api.NewRemoteClient(addr.String(), nil), "another CA": api.NewRemoteClient(addr.String(), strangerTLS)} {
		if err := client.Stream("/v1/flows", func([]byte) error { return nil }); err == nil {
			t.Errorf("%s: the agent served its flows", name)
		}
	}
	// Maps, endpoints and the rest of the agent's API are not on it.
	if err := api.NewRemoteClient(addr.String(), relayTLS).Do("GET", "/v1/status", nil, nil); err == nil {
		t.Errorf("the flows listener served /v1/status")
	}

	plain := &Agent{log: a.log, flows: a.flows, cfg: Config{FlowsAddr: "0.0.0.0:0"}}
	if _, _, err := plain.serveFlowsTCP(); err == nil {
		t.Errorf("flows without TLS on every address were served")
	}
}
