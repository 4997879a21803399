package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/flows"
)

// readFlows moves flow events from the datapath into the history until the
// reader is closed.
func (a *Agent) readFlows(fr *datapath.FlowReader) {
	for {
		e, err := fr.Read()
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			a.log.Warn("reading flow events", "err", err)
			continue
		}
		a.flows.Add(a.rec.Names().Enrich(e))
	}
}

// handleFlows serves the node's flows (flows.Handler), each naming the
// node, so a lab's or a cluster's flows merged from every node still say
// where each was seen. The node's name is settled after the server is
// made: it is read per request.
func (a *Agent) handleFlows(w http.ResponseWriter, r *http.Request) {
	flows.Handler(a.flows, a.nodeName).ServeHTTP(w, r)
}

// serveFlowsTCP serves the node's flows, and nothing else, on
// cfg.FlowsAddr for a relay: by mutual TLS with cfg.FlowsTLSDir, else only
// on loopback.
func (a *Agent) serveFlowsTCP() (*http.Server, net.Addr, error) {
	var tlsConfig *tls.Config
	if a.cfg.FlowsTLSDir != "" {
		var err error
		if tlsConfig, err = api.LoadTLS(a.cfg.FlowsTLSDir, true); err != nil {
			return nil, nil, fmt.Errorf("serving flows on %s: %w", a.cfg.FlowsAddr, err)
		}
	} else if err := api.CheckPlainListen(a.cfg.FlowsAddr); err != nil {
		return nil, nil, fmt.Errorf("serving flows: %w", err)
	}
	ln, err := net.Listen("tcp", a.cfg.FlowsAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("serving flows on %s: %w", a.cfg.FlowsAddr, err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/flows", a.handleFlows)
	mux.HandleFunc("GET /v1/healthz", a.handleHealth)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	a.log.Info("serving flows", "addr", ln.Addr().String(), "mutualTLS", tlsConfig != nil)
	return srv, ln.Addr(), nil
}

// handleSampling reports (GET) or sets (POST ?mode=) the flow sampling.
func (a *Agent) handleSampling(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		m, err := datapath.ParseFlowMode(r.URL.Query().Get("mode"))
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		if err := a.dp.SetFlowMode(m); err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		a.sampling.Store(uint32(m))
		a.log.Info("flow sampling changed", "mode", m)
	}
	writeJSON(w, http.StatusOK, map[string]string{"sampling": datapath.FlowMode(a.sampling.Load()).String()})
}
