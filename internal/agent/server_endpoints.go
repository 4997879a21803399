package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/model"
)

// The CNI plugin's side of the API: shunt-cni plumbs a pod and hands its
// endpoint here; the agent gives it to the reconciler and answers once a
// sync covered it, so the runtime starts the pod's containers only when
// the datapath (identity, policy, forwarding) is programmed for it.

// endpointWait bounds how long an ADD or DEL waits for the datapath. The
// runtime's own timeout is longer; the plugin says "try again later".
const endpointWait = time.Minute

// cniEndpoints are the endpoints the CNI plugin reported, kept in
// endpoints.json: a runtime never repeats an ADD, so a restarted agent
// must program them again from its own record (as Cilium restores its
// endpoints).
type cniEndpoints struct {
	mu    sync.Mutex // held across a change and its file write, so they stay in order
	path  string
	byPod map[string]api.Endpoint // by namespace/name
	saved []byte
}

func loadEndpoints(dir string) (*cniEndpoints, error) {
	e := &cniEndpoints{path: filepath.Join(dir, "endpoints.json"), byPod: map[string]api.Endpoint{}}
	data, err := os.ReadFile(e.path)
	if errors.Is(err, os.ErrNotExist) {
		return e, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &e.byPod); err != nil {
		return nil, fmt.Errorf("reading %s: %w (remove it: pods lose their datapath until their sandboxes are re-created)", e.path, err)
	}
	e.saved = data
	return e, nil
}

func (e *cniEndpoints) save() error {
	var err error
	e.saved, err = atomicfile.WriteJSON(e.path, e.byPod, e.saved)
	return err
}

// restoreEndpoints hands the reconciler the endpoints a previous agent was
// given whose interface is still there (same name, same index); the others
// were deleted while no agent ran (a DEL that could not reach it) and are
// forgotten.
func (a *Agent) restoreEndpoints() error {
	e := a.cniEndpoints
	e.mu.Lock()
	defer e.mu.Unlock()
	for pod, ae := range e.byPod {
		ep, err := toModelEndpoint(pod, ae)
		if err == nil {
			var l netlink.Link
			if l, err = netlink.LinkByName(ae.HostIf); err == nil && l.Attrs().Index != ae.Ifindex {
				err = fmt.Errorf("%s has index %d now, not %d", ae.HostIf, l.Attrs().Index, ae.Ifindex)
			}
		}
		if err != nil {
			a.log.Info("forgetting the endpoint of a pod whose interface is gone", "pod", pod, "reason", err)
			delete(e.byPod, pod)
			continue
		}
		a.rec.SetEndpoint(ep)
	}
	return e.save()
}

func toModelEndpoint(pod string, e api.Endpoint) (model.Endpoint, error) {
	ip, err := netip.ParseAddr(e.IP)
	if err != nil || !ip.Is4() {
		return model.Endpoint{}, fmt.Errorf("ip %q: want an IPv4 address", e.IP)
	}
	podMAC, err := net.ParseMAC(e.PodMAC)
	if err != nil {
		return model.Endpoint{}, fmt.Errorf("podMAC %q: %w", e.PodMAC, err)
	}
	nodeMAC, err := net.ParseMAC(e.NodeMAC)
	if err != nil {
		return model.Endpoint{}, fmt.Errorf("nodeMAC %q: %w", e.NodeMAC, err)
	}
	switch {
	case e.ContainerID == "":
		return model.Endpoint{}, errors.New("containerID is empty")
	case e.HostIf == "" || e.Ifindex <= 0:
		return model.Endpoint{}, fmt.Errorf("hostIf %q, ifindex %d: both are needed", e.HostIf, e.Ifindex)
	}
	return model.Endpoint{
		Pod: pod, IP: ip, Ifname: e.HostIf, Ifindex: e.Ifindex, PodMAC: podMAC, NodeMAC: nodeMAC,
		CgroupID: e.CgroupID, Cgroup: e.Cgroup, Netns: e.Netns,
	}, nil
}

func (a *Agent) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok"})
}

func (a *Agent) handleNetwork(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Network{
		PodCIDR: a.podPool.CIDR.String(), NodeIP: a.podPool.NodeIP().String(), ServiceCIDR: a.svcPool.CIDR.String(),
		Mode: string(a.state.Mode), Bridge: a.state.Mode == datapath.ModeBridge, NodeIf: a.cfg.Instance.NodeIf(),
		LinkAliasPrefix: a.cfg.Instance.LinkAliasPrefix(), MTU: a.podMTU, ClusterCIDR: a.clusterCIDR(),
		DefaultRoute: podsDefaultRoute(a.cfg),
	})
}

func (a *Agent) handleListEndpoints(w http.ResponseWriter, r *http.Request) {
	e := a.cniEndpoints
	e.mu.Lock()
	out := []api.Endpoint{}
	for pod, ep := range e.byPod {
		ep.Pod = pod
		out = append(out, ep)
	}
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (a *Agent) handleGetEndpoint(w http.ResponseWriter, r *http.Request) {
	pod := r.PathValue("namespace") + "/" + r.PathValue("name")
	e := a.cniEndpoints
	e.mu.Lock()
	ep, ok := e.byPod[pod]
	e.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Errorf("the agent has no endpoint for pod %s", pod))
		return
	}
	ep.Pod = pod
	writeJSON(w, http.StatusOK, ep)
}

// handlePutEndpoint records a pod's interface and answers once the
// datapath programmed it (or failed to: 503, the plugin says try again).
func (a *Agent) handlePutEndpoint(w http.ResponseWriter, r *http.Request) {
	pod := r.PathValue("namespace") + "/" + r.PathValue("name")
	var in api.Endpoint
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		code, err := bodyError(err)
		writeError(w, code, fmt.Errorf("endpoint of pod %s: %w", pod, err))
		return
	}
	ep, err := toModelEndpoint(pod, in)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("endpoint of pod %s: %w", pod, err))
		return
	}
	e := a.cniEndpoints
	e.mu.Lock()
	in.Pod = ""
	old, had := e.byPod[pod]
	e.byPod[pod] = in
	if err := e.save(); err != nil {
		if had {
			e.byPod[pod] = old
		} else {
			delete(e.byPod, pod)
		}
		e.mu.Unlock()
		writeError(w, http.StatusInternalServerError, fmt.Errorf("recording the endpoint of pod %s: %w", pod, err))
		return
	}
	gen := a.rec.SetEndpoint(ep)
	e.mu.Unlock()
	a.waitEndpoint(w, r, pod, gen, in)
}

// handleDeleteEndpoint forgets a pod's interface. Idempotent: an unknown
// pod is fine, and so is one a newer sandbox owns (another containerID),
// which is left alone.
func (a *Agent) handleDeleteEndpoint(w http.ResponseWriter, r *http.Request) {
	pod := r.PathValue("namespace") + "/" + r.PathValue("name")
	containerID := r.URL.Query().Get("containerID")
	e := a.cniEndpoints
	e.mu.Lock()
	ep, ok := e.byPod[pod]
	if !ok || (containerID != "" && ep.ContainerID != containerID) {
		e.mu.Unlock()
		writeJSON(w, http.StatusOK, struct{}{})
		return
	}
	delete(e.byPod, pod)
	if err := e.save(); err != nil {
		e.byPod[pod] = ep
		e.mu.Unlock()
		writeError(w, http.StatusInternalServerError, fmt.Errorf("forgetting the endpoint of pod %s: %w", pod, err))
		return
	}
	gen := a.rec.RemoveEndpoint(pod)
	e.mu.Unlock()
	a.waitEndpoint(w, r, pod, gen, struct{}{})
}

func (a *Agent) waitEndpoint(w http.ResponseWriter, r *http.Request, pod string, gen uint64, answer any) {
	ctx, cancel := context.WithTimeout(r.Context(), endpointWait)
	defer cancel()
	if err := a.rec.Wait(ctx, gen); err != nil {
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("the datapath is not programmed for pod %s (the agent retries; see `shunt status`): %w", pod, err))
		return
	}
	writeJSON(w, http.StatusOK, answer)
}

// clusterCIDR is the range pods route through their node ("" for none).
func (a *Agent) clusterCIDR() string {
	if !a.cfg.ClusterCIDR.IsValid() {
		return ""
	}
	return a.cfg.ClusterCIDR.String()
}
