package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/policy"
)

// The API a multi-node lab's control plane serves to the nodes that joined
// it (internal/lab cluster.go): their Nodes, the objects, their pods'
// status and the lab's identity numbers.

// watchPoll is how long a joining node's poll waits for a change: its
// heartbeat comes at least this often.
const watchPoll = 10 * time.Second

// controlPlane answers 404 unless this agent serves a multi-node lab.
func (a *Agent) controlPlane(w http.ResponseWriter) *lab.ControlPlane {
	if a.labCP == nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("instance %q serves no multi-node lab (it was not started with --lab-control-plane): join the lab's first node", a.cfg.Instance.Name))
	}
	return a.labCP
}

// decodeBody reads a JSON request body into v, answering 400 if it is not.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return false
	}
	return true
}

func (a *Agent) handleLabWatch(w http.ResponseWriter, r *http.Request) {
	cp := a.controlPlane(w)
	var req lab.WatchRequest
	if cp == nil || !decodeBody(w, r, &req) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), watchPoll)
	defer cancel()
	res, err := cp.Watch(ctx, req)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (a *Agent) handleLabNode(w http.ResponseWriter, r *http.Request) {
	cp := a.controlPlane(w)
	var n corev1.Node
	if cp == nil || !decodeBody(w, r, &n) {
		return
	}
	writeOutcome(w, cp.RegisterNode(r.Context(), &n), errorCode{lab.ErrNodeRefused, http.StatusUnprocessableEntity})
}

// errorCode is the HTTP status for errors of one kind.
type errorCode struct {
	kind error
	code int
}

// writeOutcome answers an empty object, or err with the status of the
// first kind it is (else 500).
func writeOutcome(w http.ResponseWriter, err error, codes ...errorCode) {
	if err == nil {
		writeJSON(w, http.StatusOK, struct{}{})
		return
	}
	for _, c := range codes {
		if errors.Is(err, c.kind) {
			writeError(w, c.code, err)
			return
		}
	}
	writeError(w, http.StatusInternalServerError, err)
}

func (a *Agent) handleLabIdentities(w http.ResponseWriter, r *http.Request) {
	if a.controlPlane(w) == nil {
		return
	}
	var keys []policy.IdentityKey
	if !decodeBody(w, r, &keys) {
		return
	}
	ids, err := a.clusterIDs.Resolve(r.Context(), keys)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, ids)
}

func (a *Agent) handleLabPodStatus(w http.ResponseWriter, r *http.Request) {
	cp := a.controlPlane(w)
	var p corev1.Pod
	if cp == nil || !decodeBody(w, r, &p) {
		return
	}
	if p.Namespace != r.PathValue("namespace") || p.Name != r.PathValue("name") {
		writeError(w, http.StatusBadRequest, fmt.Errorf("the body is pod %s/%s, the path names %s/%s", p.Namespace, p.Name, r.PathValue("namespace"), r.PathValue("name")))
		return
	}
	writeOutcome(w, cp.UpdatePodStatus(r.Context(), r.URL.Query().Get("node"), &p),
		errorCode{lab.ErrPodNotFound, http.StatusNotFound}, errorCode{lab.ErrPodConflict, http.StatusConflict})
}
