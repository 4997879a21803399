package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/lab"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
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
	srv := &http.Server{Handler: a.apiHandler()}
	go srv.Serve(ln)
	return srv, nil
}

// apiHandler is every route of the agent's API, with bodies capped and a
// handler's panic turned into a 500.
func (a *Agent) apiHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", a.handleStatus)
	mux.HandleFunc("GET /v1/healthz", a.handleHealth)
	mux.HandleFunc("GET /v1/network", a.handleNetwork)
	mux.HandleFunc("GET /v1/endpoints", a.handleListEndpoints)
	mux.HandleFunc("GET /v1/endpoints/{namespace}/{name}", a.handleGetEndpoint)
	mux.HandleFunc("PUT /v1/endpoints/{namespace}/{name}", a.handlePutEndpoint)
	mux.HandleFunc("DELETE /v1/endpoints/{namespace}/{name}", a.handleDeleteEndpoint)
	mux.HandleFunc("GET /v1/pods", a.handlePods)
	mux.HandleFunc("GET /v1/namespaces", a.handleNamespaces)
	mux.HandleFunc("GET /v1/nodes", a.handleNodes)
	mux.HandleFunc("GET /v1/services", a.handleServices)
	mux.HandleFunc("GET /v1/endpointslices", a.handleEndpointSlices)
	mux.HandleFunc("GET /v1/networkpolicies", a.handleNetworkPolicies)
	mux.HandleFunc("GET /v1/shuntnetworkpolicies", a.handleShuntPolicies)
	mux.HandleFunc("GET /v1/httproutes", a.handleHTTPRoutes)
	mux.HandleFunc("GET /v1/grpcroutes", a.handleGRPCRoutes)
	mux.HandleFunc("GET /v1/maps/services", a.handleServiceMap)
	mux.HandleFunc("GET /v1/maps/policy", a.handlePolicyMap)
	mux.HandleFunc("GET /v1/identities", a.handleIdentities)
	mux.HandleFunc("GET /v1/policy/trace", a.handleTrace)
	mux.HandleFunc("GET /v1/flows", a.handleFlows)
	mux.HandleFunc("GET /v1/flows/sampling", a.handleSampling)
	mux.HandleFunc("POST /v1/flows/sampling", a.handleSampling)
	mux.HandleFunc("GET /v1/maps", a.handleMaps)
	mux.HandleFunc("POST /v1/proxy/restart", a.handleProxyRestart)
	mux.HandleFunc("POST /v1/accel", a.handleAccel)
	mux.HandleFunc("GET /v1/maps/{name}", a.handleMapDump)
	mux.HandleFunc("POST /v1/maps/{name}/flush", a.handleMapFlush)
	mux.HandleFunc("POST "+api.PathVerify, a.handleVerify)
	mux.Handle("GET /metrics", a.metrics.handler())
	// Go profiles of the agent (root-only socket), e.g.
	// curl --unix-socket SOCK http://shuntd/debug/pprof/profile?seconds=10
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("POST /v1/apply", a.handleObjects(func(ctx context.Context, d []manifest.Document) ([]model.Change, error) {
		return a.src.Apply(ctx, d)
	}))
	mux.HandleFunc("POST /v1/delete", a.handleObjects(func(ctx context.Context, d []manifest.Document) ([]model.Change, error) {
		return a.src.Delete(ctx, d)
	}))
	mux.HandleFunc("POST /v1/wait", a.handleWait)
	mux.HandleFunc("POST "+lab.PathWatch, a.handleLabWatch)
	mux.HandleFunc("POST "+lab.PathNodes, a.handleLabNode)
	mux.HandleFunc("POST "+lab.PathIdentities, a.handleLabIdentities)
	mux.HandleFunc("PUT "+lab.PathPodStatus+"{namespace}/{name}/status", a.handleLabPodStatus)
	mux.HandleFunc("POST /v1/shutdown", func(w http.ResponseWriter, r *http.Request) {
		a.shutdown <- r.URL.Query().Get("uninstall") == "true"
		writeJSON(w, http.StatusOK, struct{}{})
	})
	return recoverPanics(a.log, limitBodies(mux))
}

// recoverPanics turns a handler's panic into a 500 naming the request and
// the panic (logged with its stack), so a bug in one handler is an error
// the CLI shows, not a connection closed mid-answer that looks like a dead
// agent. http.ErrAbortHandler keeps its meaning (abort the response).
func recoverPanics(log *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler {
				panic(p)
			}
			log.Error("API handler panicked", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery,
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			writeError(w, http.StatusInternalServerError,
				fmt.Errorf("the agent failed on %s %s: %v (a bug in shuntd: its log has the stack)", r.Method, r.URL.Path, p))
		}()
		h.ServeHTTP(w, r)
	})
}

// limitBodies caps every request body at api.MaxRequestBytes, so no
// request can make the agent read (and hold) more; a decoder reading past
// it gets an error, which bodyError turns into 413 and what to do.
func limitBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, api.MaxRequestBytes)
		}
		h.ServeHTTP(w, r)
	})
}

// bodyError is the status and error for a request body that could not be
// decoded: 413 and api.TooLargeError over the limit, else 400.
func bodyError(err error) (int, error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return http.StatusRequestEntityTooLarge, &api.TooLargeError{}
	}
	return http.StatusBadRequest, err
}

func writeBodyError(w http.ResponseWriter, err error) {
	code, err := bodyError(err)
	writeError(w, code, err)
}

// readDocuments reads an api.ObjectsRequest: the manifests' documents.
func readDocuments(r *http.Request) ([]manifest.Document, error) {
	var req api.ObjectsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return nil, err
	}
	docs := make([]manifest.Document, len(req.Objects))
	for i, o := range req.Objects {
		docs[i] = manifest.Document{Source: o.Source, JSON: o.Object}
	}
	return docs, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, api.Error{Error: err.Error()})
}

// handleObjects passes apply and delete requests to the lab's API server,
// which decodes and validates them whoever the client is: nothing reaches
// the store unchecked.
func (a *Agent) handleObjects(do func(context.Context, []manifest.Document) ([]model.Change, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		docs, err := readDocuments(r)
		if err != nil {
			writeBodyError(w, err)
			return
		}
		changes, err := do(r.Context(), docs)
		resp := api.ChangesResponse{}
		for _, c := range changes {
			resp.Changes = append(resp.Changes, api.Change{Key: c.Key.String(), Action: string(c.Action)})
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
		pol, svc := a.rec.SyncTimes()
		a.log.Info(r.URL.Path, "objects", len(docs), "policyMs", ms(pol), "servicesMs", ms(svc), "totalMs", resp.TookMs)
		writeJSON(w, http.StatusOK, resp)
	}
}

func (a *Agent) handleStatus(w http.ResponseWriter, r *http.Request) {
	// The socket serves while the lab starts its pods (they call shunt-cni,
	// which calls back here); clients wait for the whole agent.
	if !a.ready.Load() {
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("agent %s is starting", a.cfg.Instance.Name))
		return
	}
	st := api.Status{
		Instance: a.cfg.Instance.Name, NodeName: a.nodeName, PID: os.Getpid(), Mode: string(a.state.Mode),
		PodCIDR: a.podPool.CIDR.String(), NodeIP: a.podPool.NodeIP().String(), ServiceCIDR: a.svcPool.CIDR.String(),
		PinDir: a.cfg.Instance.PinDir(), Pods: a.rec.EndpointCount(),
	}
	counters, err := a.dp.Counters()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	st.Counters = counters
	st.Started, st.Features, st.Kernel = a.started, a.dp.Features(), a.kernel
	st.FlowSampling = datapath.FlowMode(a.sampling.Load()).String()
	st.Flows.History, st.Flows.FollowerMissed = a.flows.Len(), a.flows.Dropped()
	st.Flows.Emitted, st.Flows.Lost, _ = a.dp.FlowStats()
	st.MetricsAddr, _ = a.metricsAddr.Load().(string)
	st.Accel, _ = a.accelStatus()
	st.Drift = a.metrics.drift.status(a.cfg.DriftCheckPeriod)
	if st.Drift.LastError != "" {
		st.Health = append(st.Health, "the last drift check failed: "+st.Drift.LastError)
	}
	ps := a.proxyStatus(r.Context())
	st.Proxy = &ps
	if !ps.Healthy {
		st.Health = append(st.Health, "the node L7 proxy is down: "+ps.Error)
	}
	if h := a.src.Health(); h != "" {
		st.Health = append(st.Health, h)
	}
	if err := a.rec.PolicyError(); err != nil {
		st.Health = append(st.Health, "policy not programmed (the previous one stays in force): "+err.Error())
	}
	if a.cfg.Tunnel != "" {
		st.Tunnel = &api.TunnelStatus{Kind: a.cfg.Tunnel, Device: a.cfg.Instance.TunnelIf(), Underlay: a.cfg.Underlay.String(), PodMTU: a.podMTU}
		st.Routing = &api.RoutingStatus{Mode: RoutingTunnel, Device: st.Tunnel.Device, Underlay: st.Tunnel.Underlay, PodMTU: a.podMTU}
	}
	if a.cfg.Routing == RoutingNative {
		st.Routing = &api.RoutingStatus{Mode: RoutingNative, Device: a.uplink, Underlay: a.cfg.Underlay.String(), PodMTU: a.podMTU}
	}
	if st.Routing != nil {
		st.Routing.Peers = a.peers()
	}
	if a.masq != nil {
		st.Masquerade = a.masq
	}
	st.ExternalByKubeProxy = a.cfg.LeaveExternalToKubeProxy
	if !st.ExternalByKubeProxy {
		st.NodePortMode = string(a.nodePortMode)
	}
	st.Source = a.src.Describe()
	st.Problems = a.Warnings()
	if st.Hooks, err = a.dp.Hooks(); err != nil {
		st.Health = append(st.Health, "cannot list attached programs: "+err.Error())
	}
	if st.ProgramStatsOn = a.dp.ProgramStatsOn(); st.ProgramStatsOn {
		if st.ProgramStats, err = a.dp.ProgramStats(); err != nil {
			st.Health = append(st.Health, "cannot read the programs' run-time statistics: "+err.Error())
		}
	}
	if st.Maps, err = a.dp.Maps(); err != nil {
		st.Health = append(st.Health, "cannot read maps: "+err.Error())
	}
	for _, m := range st.Maps {
		if p := m.Pressure(); p != "" {
			st.Health = append(st.Health, p)
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
	// Containers exit on their own: bring their status up to date first.
	if err := a.src.Resync(r.Context()); err != nil {
		a.log.Warn("pod status", "err", err)
	}
	list := corev1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, p := range a.objects().Pods() {
		pod := *p.DeepCopy()
		pod.APIVersion, pod.Kind = "v1", "Pod"
		list.Items = append(list.Items, pod)
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *Agent) handleNamespaces(w http.ResponseWriter, r *http.Request) {
	list := corev1.NamespaceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, ns := range a.objects().Namespaces() {
		n := *ns.DeepCopy()
		n.Status.Phase = corev1.NamespaceActive
		list.Items = append(list.Items, n)
	}
	writeJSON(w, http.StatusOK, list)
}

// handleNodes lists the cluster's Nodes; this node is marked Ready (its
// agent answers) and, in the lab, which has no Node objects, is the one
// listed, built from what the agent knows of itself.
func (a *Agent) handleNodes(w http.ResponseWriter, r *http.Request) {
	list := corev1.NodeList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	own := false
	for _, n := range a.objects().Nodes() {
		node := *n.DeepCopy()
		node.APIVersion, node.Kind = "v1", "Node"
		if node.Name == a.nodeName {
			own = true
			node.Status.Conditions = setNodeReady(node.Status.Conditions, a.readyCondition())
		}
		list.Items = append(list.Items, node)
	}
	if !own {
		list.Items = append(list.Items, *a.nodeObject())
	}
	writeJSON(w, http.StatusOK, list)
}

// peers are the other nodes of the cluster, as the datapath reaches them.
func (a *Agent) peers() []api.Peer {
	var out []api.Peer
	for _, n := range a.objects().Nodes() {
		if n.Name == a.nodeName {
			continue
		}
		p := api.Peer{Node: n.Name, PodCIDR: n.Spec.PodCIDR, Ready: true}
		if addr := policy.NodeTunnel(n); addr.IsValid() {
			p.Address = addr.String()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				p.Ready = c.Status == corev1.ConditionTrue
			}
		}
		out = append(out, p)
	}
	return out
}

// nodeObject is this node's Node as its agent knows it: its pod CIDR,
// underlay address, readiness.
func (a *Agent) nodeObject() *corev1.Node {
	node := newNodeObject(a.nodeName, a.podPool.CIDR, a.cfg.Underlay, a.started)
	if a.rec != nil {
		node.Status.Conditions = []corev1.NodeCondition{a.readyCondition()}
	}
	return node
}

// newNodeObject is a node's Node: name, pod CIDR, the underlay address as
// its InternalIP (when it has one).
func newNodeObject(name string, podCIDR netip.Prefix, underlay netip.Addr, created time.Time) *corev1.Node {
	node := &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec:       corev1.NodeSpec{PodCIDR: podCIDR.String(), PodCIDRs: []string{podCIDR.String()}}}
	if underlay.IsValid() {
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: underlay.String()}}
	}
	return node
}

// setNodeReady puts this agent's view of its readiness in place of the
// stored one: the agent knows best whether it programs its node.
func setNodeReady(conds []corev1.NodeCondition, ready corev1.NodeCondition) []corev1.NodeCondition {
	for i, c := range conds {
		if c.Type == corev1.NodeReady {
			conds[i] = ready
			return conds
		}
	}
	return append(conds, ready)
}

// readyCondition is this node's Ready condition as its agent sees it: ready
// once it started and its policy is programmed.
func (a *Agent) readyCondition() corev1.NodeCondition {
	c := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "AgentReady",
		Message: "shuntd " + a.cfg.Instance.Name + " programs this node", LastHeartbeatTime: metav1.Now()}
	if err := a.rec.PolicyError(); err != nil {
		c.Status, c.Reason, c.Message = corev1.ConditionFalse, "PolicyNotProgrammed", err.Error()
	}
	return c
}

func (a *Agent) handleServices(w http.ResponseWriter, r *http.Request) {
	list := corev1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, s := range a.objects().Services() {
		svc := *s.DeepCopy()
		svc.APIVersion, svc.Kind = "v1", "Service"
		list.Items = append(list.Items, svc)
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *Agent) handleEndpointSlices(w http.ResponseWriter, r *http.Request) {
	list := discoveryv1.EndpointSliceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, sl := range a.objects().EndpointSlices() {
		s := *sl.DeepCopy()
		s.APIVersion, s.Kind = "discovery.k8s.io/v1", "EndpointSlice"
		list.Items = append(list.Items, s)
	}
	writeJSON(w, http.StatusOK, list)
}

// handleServiceMap decodes what the kernel's service maps hold, named with
// the agent's desired state so drift would be visible.
func (a *Agent) handleServiceMap(w http.ResponseWriter, r *http.Request) {
	names := map[services.Frontend]string{}
	for _, p := range a.rec.ServicePorts() {
		names[p.Frontend] = p.Name
	}
	entries, err := a.dp.DumpServices()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	out := []api.ServiceEntry{}
	for _, e := range entries {
		se := api.ServiceEntry{
			Service: names[services.Frontend{VIP: e.VIP, Port: e.Port, Proto: e.Proto}], VIP: e.VIP.String(), Port: e.Port,
			Protocol: dpinfo.ProtoName(e.Proto), ID: e.ID, Affinity: e.AffinityTimeout, Backends: []string{},
		}
		for _, b := range e.Backends {
			se.Backends = append(se.Backends, fmt.Sprintf("%s:%d (#%d)", b.IP, b.Port, b.ID))
		}
		out = append(out, se)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleAccel switches socket acceleration for new connections
// (?on=true[&nodeProcesses=true][&withoutBackpressure=true]). Turning it
// on where the kernel has no backpressure for accelerated sockets is
// refused (409) unless withoutBackpressure or the agent's flag says so.
func (a *Agent) handleAccel(w http.ResponseWriter, r *http.Request) {
	var c datapath.AccelConfig
	var withoutBackpressure bool
	for _, p := range []struct {
		name string
		to   *bool
	}{{"on", &c.On}, {"nodeProcesses", &c.NodeProcesses}, {"withoutBackpressure", &withoutBackpressure}} {
		v := r.URL.Query().Get(p.name)
		if v == "" && p.name != "on" {
			continue
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("%s=%q: want true or false", p.name, v))
			return
		}
		*p.to = b
	}
	if accelRefusedHere(c.On, a.accelUnsafe, withoutBackpressure || a.cfg.AccelWithoutBackpressure) {
		writeError(w, http.StatusConflict, fmt.Errorf("refusing socket acceleration: %s; `shunt accel on --without-backpressure` turns it on anyway", a.accelUnsafe))
		return
	}
	if err := a.dp.SetAccel(c); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	a.accelRefused.Store("")
	st, err := a.accelStatus()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	a.log.Info("socket acceleration", "enabled", c.On, "nodeProcesses", c.NodeProcesses)
	if c.On && a.accelCaveat != "" {
		a.log.Warn("socket acceleration", "caveat", a.accelCaveat)
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *Agent) accelStatus() (api.AccelStatus, error) {
	c, n, err := a.dp.AccelStatus()
	refused, _ := a.accelRefused.Load().(string)
	return api.AccelStatus{Enabled: c.On, NodeProcesses: c.NodeProcesses, Sockets: n, Caveat: a.accelCaveat, Refused: refused}, err
}

// handleWait answers once this node's datapath reflects the objects given
// (as the API server returned them, e.g. `kubectl apply -o json`): each is
// in the agent's store at that resourceVersion or later (absent, with
// ?deleted=true), and a sync covered it. Changes made through a Kubernetes
// API server reach the node asynchronously; this is how a script or a
// test knows a policy is in force.
func (a *Agent) handleWait(w http.ResponseWriter, r *http.Request) {
	docs, err := readDocuments(r)
	if err != nil {
		writeBodyError(w, err)
		return
	}
	objs, err := manifest.DecodeReferences(docs)
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, err)
		return
	}
	timeout := 30 * time.Second
	if s := r.URL.Query().Get("timeout"); s != "" {
		if timeout, err = time.ParseDuration(s); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("timeout: %w", err))
			return
		}
	}
	deleted := r.URL.Query().Get("deleted") == "true"
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	var missing []string
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		missing = missing[:0]
		store := a.objects()
		for _, o := range objs {
			if !reflected(store, o, deleted) {
				missing = append(missing, o.Key().String())
			}
		}
		return len(missing) == 0, nil
	})
	if err == nil {
		err = a.rec.WaitCurrent(ctx)
	}
	if err != nil {
		writeError(w, http.StatusGatewayTimeout, fmt.Errorf("after %s, not reflected on this node: %v (%w)", timeout, missing, err))
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// reflected says whether the store holds o at o's resourceVersion or a
// later one (resourceVersions of one API server only grow), or no longer
// holds it when deleted.
func reflected(store *model.Store, o manifest.Object, deleted bool) bool {
	have, ok := store.Get(o.Key())
	if deleted || !ok {
		return deleted && !ok
	}
	want, got := resourceVersion(o), resourceVersion(have)
	if want == "" {
		return true
	}
	wn, err1 := strconv.ParseUint(want, 10, 64)
	gn, err2 := strconv.ParseUint(got, 10, 64)
	if err1 != nil || err2 != nil {
		return got == want
	}
	return gn >= wn
}

func resourceVersion(o manifest.Object) string {
	if m, ok := o.Obj.(metav1.Object); ok {
		return m.GetResourceVersion()
	}
	return ""
}
