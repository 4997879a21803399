package flows

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Handler serves the flows of h as the agent's API does (GET /v1/flows):
// the matching flows of the history as JSON lines and, with follow=true,
// every new one until the client leaves. Query: the filters ParseFilter
// reads, last=N. node, when set, names the node on every flow written (an
// agent's own flows); a relay's flows keep the node they came with.
func Handler(h *History, node string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		filter, err := ParseFilter(q)
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
		enc := json.NewEncoder(w)
		write := func(fl Flow) error {
			if node != "" {
				fl.Node = node
			}
			return enc.Encode(fl)
		}
		if q.Get("follow") != "true" {
			for _, fl := range h.Query(filter, last) {
				write(fl)
			}
			return
		}
		past, live, cancel := h.Follow(filter, last, 4096)
		defer cancel()
		for _, fl := range past {
			write(fl)
		}
		flusher, _ := w.(http.Flusher)
		if flusher != nil {
			flusher.Flush()
		}
		for {
			select {
			case fl := <-live:
				if err := write(fl); err != nil {
					return
				}
				if flusher != nil {
					flusher.Flush()
				}
			case <-r.Context().Done():
				return
			}
		}
	})
}

// writeError answers as the agent's API does: {"error": "..."}.
func writeError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// FollowQuery is the query that follows an agent's flows: its history's
// last `last` first, or, resuming after a break (after not zero), only the
// flows later than after, so nothing already received comes again and the
// agent filters by its own clock.
func FollowQuery(last int, after time.Time) url.Values {
	q := url.Values{"follow": {"true"}}
	if after.IsZero() {
		q.Set("last", strconv.Itoa(last))
	} else {
		q.Set("since", after.Add(time.Nanosecond).Format(time.RFC3339Nano))
	}
	return q
}
