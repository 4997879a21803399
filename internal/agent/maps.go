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
