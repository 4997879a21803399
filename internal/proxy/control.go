package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// flowBatchInterval is how long /flows gathers records before writing
// them: at most this late for shunt observe, and one wake-up of the
// writer per batch rather than per request.
const flowBatchInterval = 50 * time.Millisecond

// maxConfigBytes bounds a pushed configuration.
const maxConfigBytes = 64 << 20

// ControlHandler is the control API the agent uses on the proxy's unix
// socket (proxyapi.Client):
//
//	PUT /config   replace the configuration (400: invalid, 409: older version,
//	              or incomplete while a complete one is in force)
//	GET /config   the configuration in force
//	GET /status   proxyapi.Status
//	GET /metrics  Prometheus text
//	GET /flows    the flow records made from now on, one JSON object a line,
//	              until the client leaves (filters as flows.ParseFilter reads them);
//	              with format=batch in the compact form of proxyapi.FlowEncoder
func (p *Proxy) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /config", p.handlePutConfig)
	mux.HandleFunc("GET /config", func(w http.ResponseWriter, _ *http.Request) {
		cfg, ok := p.Config()
		if !ok {
			http.Error(w, "no configuration yet: PUT /config", http.StatusNotFound)
			return
		}
		writeJSON(w, cfg)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, p.Status()) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(p.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /flows", p.handleFlows)
	return mux
}

func (p *Proxy) handlePutConfig(w http.ResponseWriter, r *http.Request) {
	var cfg proxyapi.Config
	// Unknown fields are ignored: an agent newer than this proxy may send
	// fields it does not know, and it must still be configurable.
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxConfigBytes)).Decode(&cfg); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			err = fmt.Errorf("%s: a JSON %s cannot be a %s", te.Field, te.Value, te.Type)
		}
		err = fmt.Errorf("invalid configuration: %w", err)
		p.mu.Lock()
		p.noteConfigError(err)
		p.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	err := p.Apply(cfg)
	var ce *ConfigError
	var se *StaleError
	var ie *IncompleteError
	switch {
	case err == nil:
		writeJSON(w, p.Status())
	case errors.As(err, &ce):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case errors.As(err, &se), errors.As(err, &ie):
		http.Error(w, err.Error(), http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (p *Proxy) handleFlows(w http.ResponseWriter, r *http.Request) {
	filter, err := flows.ParseFilter(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	live, cancel := p.flows.subscribe(filter, 4096)
	defer cancel()
	// Records are written in batches, every flowBatchInterval while they
	// come: requests do not wake this writer one by one.
	var write func(fl flows.Flow) error
	var end func() error
	if r.URL.Query().Get("format") == "batch" {
		w.Header().Set("Content-Type", proxyapi.FlowBatchType)
		enc := proxyapi.NewFlowEncoder(w)
		var batch []flows.Flow
		write = func(fl flows.Flow) error { batch = append(batch, fl); return nil }
		end = func() error { err := enc.Encode(batch); clear(batch); batch = batch[:0]; return err }
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		write = func(fl flows.Flow) error { return enc.Encode(fl) }
		end = func() error { return nil }
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	timer := time.NewTimer(flowBatchInterval)
	timer.Stop()
	for {
		// Idle: the first record wakes the writer...
		select {
		case fl := <-live:
			if write(fl) != nil {
				return
			}
		case <-r.Context().Done():
			return
		}
		// ... then, while records keep coming, it wakes once per
		// interval only (not once for the first record of each batch
		// and once for its timer), until an interval brings none.
		for first := true; ; first = false {
			timer.Reset(flowBatchInterval)
			select {
			case <-timer.C:
			case <-r.Context().Done():
				return
			}
			n := len(live)
			if n == 0 && !first {
				break
			}
			for ; n > 0; n-- {
				if write(<-live) != nil {
					return
				}
			}
			if end() != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
