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
	err := cp.RegisterNode(r.Context(), &n)
	switch {
	case errors.Is(err, lab.ErrNodeRefused):
		writeError(w, http.StatusUnprocessableEntity, err)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeJSON(w, http.StatusOK, struct{}{})
	}
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
	err := cp.UpdatePodStatus(r.Context(), r.URL.Query().Get("node"), &p)
	switch {
	case errors.Is(err, lab.ErrPodNotFound):
		writeError(w, http.StatusNotFound, err)
	case errors.Is(err, lab.ErrPodConflict):
		writeError(w, http.StatusConflict, err)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeJSON(w, http.StatusOK, struct{}{})
	}
}
