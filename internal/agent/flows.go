package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"

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

// handleFlows answers with the matching flows of the history as JSON lines
// and, with follow=true, keeps streaming new ones until the client leaves.
func (a *Agent) handleFlows(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	filter, err := flows.ParseFilter(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	last := 0
	if s := q.Get("last"); s != "" {
		if last, err = strconv.Atoi(s); err != nil || last < 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("bad last %q: want a count", s))
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := nodeEncoder{json.NewEncoder(w), a.nodeName}
	if q.Get("follow") != "true" {
		for _, fl := range a.flows.Query(filter, last) {
			enc.Encode(fl)
		}
		return
	}
	past, live, cancel := a.flows.Follow(filter, last, 4096)
	defer cancel()
	for _, fl := range past {
		enc.Encode(fl)
	}
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	for {
		select {
		case fl := <-live:
			if err := enc.Encode(fl); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		case <-r.Context().Done():
			return
		}
	}
}

// nodeEncoder writes flows with the node that saw them, so a lab's or a
// cluster's flows merged from every node still say where each was seen.
type nodeEncoder struct {
	enc  *json.Encoder
	node string
}

func (e nodeEncoder) Encode(fl flows.Flow) error {
	fl.Node = e.node
	return e.enc.Encode(fl)
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
