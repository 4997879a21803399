package agent

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/shuntnet/shunt/internal/datapath"
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
		rows = []datapath.Row{}
	}
	if !raw {
		names := a.names.Load()
		for _, row := range rows {
			annotate(row, names)
		}
	}
	writeJSON(w, http.StatusOK, rows)
}

// annotate adds names next to the numbers of a decoded row.
func annotate(row datapath.Row, n *flowNames) {
	for col, v := range row {
		switch col {
		case "ip", "endpoint", "source", "destination", "backend", "prefix":
			s, _ := v.(string)
			s, _, _ = strings.Cut(s, "/")
			if i := strings.LastIndex(s, ":"); i > 0 && strings.Count(s, ".") == 3 {
				s = s[:i]
			}
			if ip, err := netip.ParseAddr(s); err == nil {
				if ps, ok := n.podSides[ip]; ok {
					row[col+"Pod"] = ps.pod
				}
			}
		case "identity":
			if id, ok := v.(uint32); ok && n.identities[id] != nil {
				row["identityLabels"] = strings.Join(n.identities[id], ",")
			}
		case "ruleID":
			if id, ok := v.(uint32); ok && n.rules[id] != "" {
				row["rule"] = n.rules[id]
			}
		}
	}
}
