package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"k8s.io/apimachinery/pkg/types"
)

// serveAPI listens on the instance's socket (root only: it controls the node).
func (a *Agent) serveAPI() (*http.Server, error) {
	sock := a.cfg.Instance.Socket()
	os.Remove(sock)
	old := syscall.Umask(0o077)
	ln, err := net.Listen("unix", sock)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", a.handleStatus)
	mux.HandleFunc("GET /v1/pods", a.handlePods)
	mux.HandleFunc("GET /v1/namespaces", a.handleNamespaces)
	mux.HandleFunc("GET /v1/services", a.handleServices)
	mux.HandleFunc("GET /v1/endpointslices", a.handleEndpointSlices)
	mux.HandleFunc("GET /v1/networkpolicies", a.handleNetworkPolicies)
	mux.HandleFunc("GET /v1/shuntnetworkpolicies", a.handleShuntPolicies)
	mux.HandleFunc("GET /v1/maps/services", a.handleServiceMap)
	mux.HandleFunc("GET /v1/maps/policy", a.handlePolicyMap)
	mux.HandleFunc("GET /v1/identities", a.handleIdentities)
	mux.HandleFunc("GET /v1/policy/trace", a.handleTrace)
	mux.HandleFunc("GET /v1/flows", a.handleFlows)
	mux.HandleFunc("GET /v1/flows/sampling", a.handleSampling)
	mux.HandleFunc("POST /v1/flows/sampling", a.handleSampling)
	mux.HandleFunc("GET /v1/maps", a.handleMaps)
	mux.HandleFunc("GET /v1/maps/{name}", a.handleMapDump)
	mux.Handle("GET /metrics", a.metrics.handler())
	// Go profiles of the agent (root-only socket), e.g.
	// curl --unix-socket SOCK http://shuntd/debug/pprof/profile?seconds=10
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("POST /v1/apply", a.handleObjects(decodeValid, a.Apply))
	mux.HandleFunc("POST /v1/delete", a.handleObjects(decodeReferences, a.Delete))
	mux.HandleFunc("POST /v1/shutdown", func(w http.ResponseWriter, r *http.Request) {
		a.shutdown <- r.URL.Query().Get("uninstall") == "true"
		writeJSON(w, http.StatusOK, struct{}{})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	return srv, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, api.Error{Error: err.Error()})
}

// decodeValid is what apply needs: complete objects, decoded strictly and
// validated.
func decodeValid(docs []manifest.Document) ([]manifest.Object, error) {
	objs, err := manifest.Decode(docs)
	if err == nil {
		err = manifest.Validate(objs)
	}
	return objs, err
}

// decodeReferences is what delete needs, as kubectl's: apiVersion, kind,
// namespace and name, checked; the rest of a manifest is not read.
func decodeReferences(docs []manifest.Document) ([]manifest.Object, error) {
	objs, err := manifest.DecodeReferences(docs)
	if err == nil {
		err = manifest.CheckReferences(objs)
	}
	return objs, err
}

func (a *Agent) handleObjects(decode func([]manifest.Document) ([]manifest.Object, error), do func([]manifest.Object) ([]model.Change, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var req api.ObjectsRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		docs := make([]manifest.Document, len(req.Objects))
		for i, o := range req.Objects {
			docs[i] = manifest.Document{Source: o.Source, JSON: o.Object}
		}
		// Decoded and checked here, whoever the client is: nothing
		// reaches the store unchecked.
		objs, err := decode(docs)
		if err != nil {
			writeError(w, http.StatusUnprocessableEntity, err)
			return
		}
		changes, err := do(objs)
		resp := api.ChangesResponse{}
		for _, c := range changes {
			resp.Changes = append(resp.Changes, api.Change{Key: c.Key, Action: c.Action})
		}
		if err != nil {
			var code = http.StatusInternalServerError
			if changes == nil {
				code = http.StatusUnprocessableEntity // refused as a whole
			}
			writeError(w, code, err)
			return
		}
		resp.Warnings = a.Warnings()
		resp.TookMs = ms(time.Since(start))
		writeJSON(w, http.StatusOK, resp)
	}
}

func (a *Agent) handleStatus(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	st := api.Status{
		Instance: a.cfg.Instance.Name, PID: os.Getpid(), Mode: string(a.state.Mode),
		PodCIDR: a.pool.CIDR.String(), NodeIP: a.pool.NodeIP().String(), ServiceCIDR: a.svcPool.CIDR.String(),
		PinDir: a.cfg.Instance.PinDir(), Pods: len(a.state.Pods),
	}
	a.mu.Unlock()
	counters, err := a.dp.Counters()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	st.Counters = counters
	st.Started, st.Features = a.started, a.dp.Features()
	st.FlowSampling = datapath.FlowMode(a.sampling.Load()).String()
	st.Flows.History, st.Flows.FollowerMissed = a.flows.Len(), a.flows.Dropped()
	st.Flows.Emitted, st.Flows.Lost, _ = a.dp.FlowStats()
	st.MetricsAddr, _ = a.metricsAddr.Load().(string)
	if st.Hooks, err = a.dp.Hooks(); err != nil {
		st.Health = append(st.Health, "cannot list attached programs: "+err.Error())
	}
	if st.Maps, err = a.dp.Maps(); err != nil {
		st.Health = append(st.Health, "cannot read maps: "+err.Error())
	}
	for _, m := range st.Maps {
		if m.Entries >= 0 && m.Type != "Array" && m.Type != "PerCPUArray" && m.Entries*10 >= m.Capacity*9 {
			st.Health = append(st.Health, fmt.Sprintf("map %s is %d%% full (%d of %d)", m.Name, 100*m.Entries/m.Capacity, m.Entries, m.Capacity))
		}
	}
	if st.Flows.Lost > 0 {
		st.Health = append(st.Health, fmt.Sprintf("%d flow events lost (ring buffer full): raise --flow-buffer-bytes or lower the sampling", st.Flows.Lost))
	}
	if want := 2 * st.Pods; st.Mode == string(datapath.ModeRedirectPeer) || st.Mode == string(datapath.ModeRedirect) {
		if got := st.Hooks["from-pod"] + st.Hooks["to-pod"]; got != want {
			st.Health = append(st.Health, fmt.Sprintf("%d pod programs attached, %d expected", got, want))
		}
	}
	if len(st.Health) == 0 {
		st.Health = []string{"ok"}
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *Agent) handlePods(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	list := corev1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, p := range a.store.Pods() {
		list.Items = append(list.Items, a.podWithStatus(p))
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *Agent) handleNamespaces(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	list := corev1.NamespaceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, ns := range a.store.Namespaces() {
		n := *ns.DeepCopy()
		n.Status.Phase = corev1.NamespaceActive
		list.Items = append(list.Items, n)
	}
	writeJSON(w, http.StatusOK, list)
}

// podWithStatus fills in what the API server and kubelet would: UID,
// addresses, phase and container states.
func (a *Agent) podWithStatus(p *corev1.Pod) corev1.Pod {
	out := *p.DeepCopy()
	out.APIVersion, out.Kind = "v1", "Pod"
	rec := a.state.Pods[podKey(p.Namespace, p.Name)]
	if rec == nil {
		out.Status.Phase = corev1.PodPending
		return out
	}
	out.UID = types.UID(rec.UID)
	out.CreationTimestamp = metav1.NewTime(rec.Created)
	out.Spec.NodeName = a.cfg.Instance.Name
	out.Status.PodIP = rec.IP
	out.Status.PodIPs = []corev1.PodIP{{IP: rec.IP}}
	out.Status.HostIP = a.pool.NodeIP().String()
	start := metav1.NewTime(rec.Created)
	out.Status.StartTime = &start
	running, failed := 0, 0
	for _, c := range rec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: imageOf(p, c.Name)}
		if st, ok := readExitStatus(c.ExitFile); ok {
			reason := "Completed"
			if st.ExitCode != 0 {
				reason, failed = "Error", failed+1
			}
			cs.State.Terminated = &corev1.ContainerStateTerminated{
				ExitCode: int32(st.ExitCode), Reason: reason, Message: st.Error, Signal: 0,
				StartedAt: metav1.NewTime(c.Started), FinishedAt: metav1.NewTime(st.FinishedAt),
			}
		} else if processAlive(c.ShimPID) {
			running++
			cs.Ready, cs.Started = true, ptr(true)
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.Started)}
		} else {
			failed++
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Unknown",
				Message: "the container's shim is gone without recording an exit status"}
		}
		out.Status.ContainerStatuses = append(out.Status.ContainerStatuses, cs)
	}
	total := len(rec.Containers)
	switch {
	case running == total && total > 0:
		out.Status.Phase = corev1.PodRunning
	case running > 0:
		out.Status.Phase = corev1.PodRunning
	case failed > 0:
		out.Status.Phase = corev1.PodFailed
	default:
		out.Status.Phase = corev1.PodSucceeded
	}
	ready := corev1.ConditionFalse
	if running == total && total > 0 {
		ready = corev1.ConditionTrue
	}
	out.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}
	return out
}

func imageOf(p *corev1.Pod, container string) string {
	for _, c := range p.Spec.Containers {
		if c.Name == container {
			return c.Image
		}
	}
	return ""
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func ptr[T any](v T) *T { return &v }

func (a *Agent) handleServices(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	list := corev1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, s := range a.store.Services() {
		svc := *s.DeepCopy()
		svc.APIVersion, svc.Kind = "v1", "Service"
		list.Items = append(list.Items, svc)
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *Agent) handleEndpointSlices(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	list := discoveryv1.EndpointSliceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, s := range a.store.Services() {
		if e := a.svcCache[s.Namespace+"/"+s.Name]; e != nil {
			for _, sl := range append(slices.Clip(e.derived), e.slices...) {
				list.Items = append(list.Items, *sl)
			}
		}
	}
	writeJSON(w, http.StatusOK, list)
}

// handleServiceMap decodes what the kernel's service maps hold, named with
// the agent's desired state so drift would be visible.
func (a *Agent) handleServiceMap(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	names := map[string]string{}
	for _, p := range a.desiredServicePorts() {
		names[fmt.Sprintf("%s:%d/%d", p.VIP, p.Port, p.Proto)] = p.Name
	}
	a.mu.Unlock()
	entries, err := a.dp.DumpServices()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	out := []api.ServiceEntry{}
	for _, e := range entries {
		se := api.ServiceEntry{
			Service: names[fmt.Sprintf("%s:%d/%d", e.VIP, e.Port, e.Proto)], VIP: e.VIP.String(), Port: e.Port,
			Protocol: datapath.ProtoName(e.Proto), ID: e.ID, Affinity: e.AffinityTimeout, Backends: []string{},
		}
		for _, b := range e.Backends {
			se.Backends = append(se.Backends, fmt.Sprintf("%s:%d (#%d)", b.IP, b.Port, b.ID))
		}
		out = append(out, se)
	}
	writeJSON(w, http.StatusOK, out)
}
