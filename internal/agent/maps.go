package agent

import (
	"net/http"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

func (a *Agent) handleMaps(w http.ResponseWriter, r *http.Request) {
	maps, err := a.dp.Maps()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, maps)
}

// handleMapDump decodes one map; unless raw, addresses are named with their
// pods, identities with their labels and rule ids with their rules.
func (a *Agent) handleMapDump(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query().Get("raw") == "true"
	rows, err := a.dp.DumpMap(r.PathValue("name"), raw)
	if err != nil {
		writeError(w, http.StatusNotFound, err)
		return
	}
	if rows == nil {
		rows = []dpinfo.Row{}
	}
	if !raw {
		names := a.rec.Names()
		for _, row := range rows {
			names.Annotate(row)
		}
	}
	writeJSON(w, http.StatusOK, rows)
}

// handleMapFlush empties one map of per-connection state (`shunt map
// flush`); the log keeps who emptied what, as the traffic it cut is gone.
func (a *Agent) handleMapFlush(w http.ResponseWriter, r *http.Request) {
	res, err := a.dp.FlushMap(r.PathValue("name"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	a.log.Info("map flushed", "map", res.Map, "removed", res.Removed, "effect", res.Effect)
	writeJSON(w, http.StatusOK, res)
}
