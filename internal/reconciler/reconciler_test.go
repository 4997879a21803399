package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// fakeDatapath records what the reconciler would write to the kernel, as
// kube-proxy's tests drive its proxier against a fake nftables.
type fakeDatapath struct {
	mu        sync.Mutex
	log       []string
	attached  map[string]int
	policy    policy.State
	endpoints []datapath.Endpoint
	services  map[services.Frontend]services.Port
	redirects []datapath.L7Redirect
	// tunnelRoutes: the last SyncTunnelRoutes
	tunnelRoutes []datapath.TunnelRoute
	// dsrNodes: the last SyncDSRNodes
	dsrNodes []netip.Addr
	// knobs
	failServices error
	unreachable  map[netip.Addr]bool // nodes SyncTunnelRoutes cannot route to (native routing)
	maxEntries   int                 // policy entries that fit (0: any)
	gate         chan struct{}       // if set, SyncPolicy waits for it
	syncs        int
}

func newFake() *fakeDatapath {
	return &fakeDatapath{attached: map[string]int{}, services: map[services.Frontend]services.Port{}}
}

func (f *fakeDatapath) record(format string, args ...any) {
	f.log = append(f.log, fmt.Sprintf(format, args...))
}

func (f *fakeDatapath) AttachPod(ifname string, ifindex int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attached[ifname] = ifindex
	f.record("attach %s", ifname)
	return nil
}

func (f *fakeDatapath) DetachPod(ifname string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.attached, ifname)
	f.record("detach %s", ifname)
	return nil
}

func (f *fakeDatapath) PolicyFits(state policy.State, endpoints int) error {
	if f.maxEntries > 0 && len(state.Entries) > f.maxEntries {
		return fmt.Errorf("shunt_policy is full: %d entries needed, the map holds %d", len(state.Entries), f.maxEntries)
	}
	return nil
}

func (f *fakeDatapath) SyncTunnelRoutes(src netip.Addr, routes []datapath.TunnelRoute) ([]datapath.TunnelRoute, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tunnelRoutes = routes
	var unreachable []datapath.TunnelRoute
	for _, r := range routes {
		if f.unreachable[r.Node] {
			unreachable = append(unreachable, r)
		}
	}
	return unreachable, nil
}

func (f *fakeDatapath) SyncDSRNodes(addrs []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dsrNodes = slices.Clone(addrs)
	return nil
}

func (f *fakeDatapath) SyncPolicy(state policy.State, endpoints []datapath.Endpoint) error {
	if f.gate != nil {
		<-f.gate
	}
	if err := f.PolicyFits(state, len(endpoints)); err != nil {
		return err // as the datapath refuses before writing
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncs++
	f.policy, f.endpoints = state, endpoints
	f.record("policy entries=%d endpoints=%d", len(state.Entries), len(endpoints))
	return nil
}

func (f *fakeDatapath) SyncServices(all []services.Port) ([]netip.AddrPort, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failServices != nil {
		return nil, f.failServices
	}
	clear(f.services)
	var names []string
	for _, p := range all {
		f.services[p.Frontend] = p
		names = append(names, p.Name)
	}
	f.record("services all=%s", strings.Join(names, ","))
	return nil, nil
}

func (f *fakeDatapath) UpdateServices(upsert []services.Port, remove []services.Frontend) ([]netip.AddrPort, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failServices != nil {
		return nil, f.failServices
	}
	var up, rm []string
	var gone []netip.AddrPort
	for _, fr := range remove {
		for _, b := range f.services[fr].Backends {
			gone = append(gone, netip.AddrPortFrom(b.IP, b.Port))
		}
		delete(f.services, fr)
		rm = append(rm, fmt.Sprintf("%s:%d", fr.VIP, fr.Port))
	}
	for _, p := range upsert {
		f.services[p.Frontend] = p
		up = append(up, p.Name)
	}
	f.record("services upsert=%s remove=%s", strings.Join(up, ","), strings.Join(rm, ","))
	return gone, nil
}

func (f *fakeDatapath) DestroyUDPSockets(netns []string, gone []netip.AddrPort) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("destroy netns=%d gone=%d", len(netns), len(gone))
	return 0, nil
}

// SyncL7Redirects keeps the entries; it is logged only when they change,
// as policy and service changes resync them.
func (f *fakeDatapath) SyncL7Redirects(want []datapath.L7Redirect) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.redirects, want) {
		f.record("l7 redirects=%d", len(want))
	}
	f.redirects = want
	return nil
}

func (f *fakeDatapath) AttachProxy(name, cgroupPath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("attach proxy %s %s", name, cgroupPath)
	return nil
}

func (f *fakeDatapath) DetachProxy(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("detach proxy %s", name)
	return nil
}

func (f *fakeDatapath) takeLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.log
	f.log = nil
	return out
}

func parse(t *testing.T, doc string) []manifest.Object {
	t.Helper()
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// start runs a reconciler over the fake until the test ends.
func start(t *testing.T, f *fakeDatapath) *Reconciler {
	t.Helper()
	r := New(Config{NodeName: "node-1", NodeAddrs: []netip.Addr{netip.MustParseAddr("10.244.0.1")}}, f)
	runUntilEnd(t, r)
	return r
}

// runUntilEnd runs a reconciler until the test ends.
func runUntilEnd(t *testing.T, r *Reconciler) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go r.Run(ctx)
}

// apply puts objects into the reconciler's store and waits for the sync.
func apply(t *testing.T, r *Reconciler, store *model.Store, doc string) *model.Store {
	t.Helper()
	next, changes := store.Put(parse(t, doc))
	wait(t, r, r.Update(next, changes))
	return next
}

func wait(t *testing.T, r *Reconciler, gen uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Wait(ctx, gen); err != nil {
		t.Fatal(err)
	}
}

func service(name, vip string, backends ...string) string {
	doc := fmt.Sprintf("---\napiVersion: v1\nkind: Service\nmetadata: {name: %s}\nspec: {clusterIP: %s, ports: [{port: 80, targetPort: 8080}]}\n", name, vip)
	if len(backends) > 0 {
		doc += fmt.Sprintf("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s-1, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n", name, name)
		for _, b := range backends {
			doc += fmt.Sprintf("- addresses: [%s]\n", b)
		}
	}
	return doc
}

// TestServicesSyncWhatChanged: the first sync writes the whole table; later
// ones write only the services a change touched, and remove what went.
func TestServicesSyncWhatChanged(t *testing.T) {
	f := newFake()
	r := start(t, f)
	s := apply(t, r, model.New(), service("a", "10.96.0.1", "10.244.0.5")+service("b", "10.96.0.2", "10.244.0.6"))
	// The first sync may have run on the empty store already.
	if got := f.takeLog(); !slices.Contains(got, "services all=default/a:80/TCP,default/b:80/TCP") &&
		!slices.Contains(got, "services upsert=default/a:80/TCP,default/b:80/TCP remove=") {
		t.Errorf("first sync: %q", got)
	}
	s = apply(t, r, s, service("b", "10.96.0.2", "10.244.0.6", "10.244.0.7"))
	if got := f.takeLog(); !slices.Contains(got, "services upsert=default/b:80/TCP remove=") {
		t.Errorf("update of b: %q", got)
	}
	if n := len(f.services[services.Frontend{VIP: netip.MustParseAddr("10.96.0.2"), Port: 80, Proto: 6}].Backends); n != 2 {
		t.Errorf("b has %d backends, want 2", n)
	}
	next, changes := s.Remove([]manifest.Key{{Kind: "Service", Namespace: "default", Name: "a"}, {Kind: "EndpointSlice", Namespace: "default", Name: "a-1"}})
	wait(t, r, r.Update(next, changes))
	got := f.takeLog()
	if !slices.Contains(got, "services upsert= remove=10.96.0.1:80") || !slices.Contains(got, "destroy netns=1 gone=1") {
		t.Errorf("removing a: %q (want its frontend removed and its UDP sockets looked for)", got)
	}
	if ports := r.ServicePorts(); len(ports) != 1 || ports[0].Name != "default/b:80/TCP" {
		t.Errorf("service table %v", ports)
	}
}

// TestFailedServiceWriteResyncsEverything: after a failed write the kernel
// may hold anything, so the next sync writes the whole table again, and
// Wait reports the failure.
func TestFailedServiceWriteResyncsEverything(t *testing.T) {
	f := newFake()
	r := start(t, f)
	s := apply(t, r, model.New(), service("a", "10.96.0.1", "10.244.0.5"))
	f.mu.Lock()
	f.failServices = errors.New("map full")
	f.mu.Unlock()
	next, changes := s.Put(parse(t, service("b", "10.96.0.2", "10.244.0.6")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Wait(ctx, r.Update(next, changes)); err == nil || !strings.Contains(err.Error(), "map full") {
		t.Fatalf("wait: %v, want the write's error", err)
	}
	f.mu.Lock()
	f.failServices = nil
	f.mu.Unlock()
	f.takeLog()
	// The retry (no new change needed) writes everything.
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(f.takeLog(), "services all=default/a:80/TCP,default/b:80/TCP") {
		if time.Now().After(deadline) {
			t.Fatal("no full resync after the failed write")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const policyDocs = `
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec: {nodeName: node-1, containers: [{name: c, command: [x]}]}
status: {podIP: 10.244.0.5}
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec: {nodeName: node-2, containers: [{name: c, command: [x]}]}
status: {podIP: 10.244.1.9}
---
apiVersion: v1
kind: Pod
metadata: {name: new, labels: {app: web}}
spec: {nodeName: node-1, containers: [{name: c, command: [x]}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{port: 80}]}]
`

func endpoint(pod, ip, ifname string, ifindex int) model.Endpoint {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	return model.Endpoint{Pod: pod, IP: netip.MustParseAddr(ip), Ifname: ifname, Ifindex: ifindex, PodMAC: mac, NodeMAC: mac, CgroupID: 42}
}

// TestPolicyForLocalAndRemotePods: a local pod with an endpoint gets its
// identity, isolation and entries; a pod of another node is only an
// address with an identity; a local pod whose object has no address yet is
// not programmed.
func TestPolicyForLocalAndRemotePods(t *testing.T) {
	f := newFake()
	r := start(t, f)
	wait(t, r, r.SetEndpoint(endpoint("default/web", "10.244.0.5", "lxc1", 7)))
	apply(t, r, model.New(), policyDocs)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.attached["lxc1"] != 7 {
		t.Errorf("attached %v, want lxc1 (ifindex 7)", f.attached)
	}
	if len(f.endpoints) != 1 || f.endpoints[0].IP != netip.MustParseAddr("10.244.0.5") || !f.endpoints[0].IngressIsolated || f.endpoints[0].Identity < policy.FirstPodIdentity {
		t.Fatalf("endpoints %+v: want web only, isolated for ingress, with a pod identity", f.endpoints)
	}
	var clientID uint32
	for _, p := range f.policy.IPCache {
		if p.Prefix == netip.MustParsePrefix("10.244.1.9/32") {
			clientID = p.Identity
		}
	}
	if clientID < policy.FirstPodIdentity {
		t.Fatalf("remote pod not in the ipcache: %+v", f.policy.IPCache)
	}
	found := false
	for _, e := range f.policy.Entries {
		found = found || (e.Endpoint == netip.MustParseAddr("10.244.0.5") && e.Identity == clientID && e.Port == 80 && e.Verdict == policy.VerdictAllow)
	}
	if !found {
		t.Errorf("no entry allowing the remote client to web:80: %+v", f.policy.Entries)
	}
	names := r.Names()
	if names.PodSides[netip.MustParseAddr("10.244.1.9")].Pod != "default/client" || names.Cgroups[42] != "default/web" || names.Ifaces[7] != "lxc1" {
		t.Errorf("names: %+v", names)
	}
}

// TestRemotePodsGetTheirNodesTunnel: a pod of another node is reached
// through that node's underlay address (its Node's InternalIP); a local pod
// and a pod of a node without an address have none; a Node that changes
// its address moves its pods' entries with it. The other nodes' addresses
// are the ones DSR packets are taken from, kept in step as nodes change
// and go.
func TestRemotePodsGetTheirNodesTunnel(t *testing.T) {
	f := newFake()
	r := start(t, f)
	wait(t, r, r.SetEndpoint(endpoint("default/web", "10.244.0.5", "lxc1", 7)))
	const nodes = `
apiVersion: v1
kind: Node
metadata: {name: node-1}
spec: {podCIDR: 10.244.0.0/24}
status: {addresses: [{type: InternalIP, address: 192.168.50.11}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
spec: {podCIDR: 10.244.1.0/24}
status: {addresses: [{type: Hostname, address: node-2}, {type: ExternalIP, address: 203.0.113.12}, {type: InternalIP, address: 192.168.50.12}]}
---
apiVersion: v1
kind: Pod
metadata: {name: orphan}
spec: {nodeName: node-9, containers: [{name: c, command: [x]}]}
status: {podIP: 10.244.9.9}
`
	store := apply(t, r, model.New(), policyDocs+"---"+nodes)
	tunnels := func() map[string]string {
		f.mu.Lock()
		defer f.mu.Unlock()
		out := map[string]string{}
		for _, p := range f.policy.IPCache {
			out[p.Prefix.Addr().String()] = p.Tunnel.String()
		}
		return out
	}
	// node-2's own address (the first of its pod CIDR) is behind its
	// tunnel too, as the remote-node identity, and its pods' range is
	// routed there for this node's own traffic; node-1 is this node.
	want := map[string]string{"10.244.0.5": "invalid IP", "10.244.1.9": "192.168.50.12", "10.244.9.9": "invalid IP", "10.244.1.1": "192.168.50.12"}
	f.mu.Lock()
	for _, p := range f.policy.IPCache {
		if p.Prefix.Addr().String() == "10.244.1.1" && p.Identity != policy.IdentityRemoteNode {
			t.Errorf("node-2's address has identity %d, want remote-node", p.Identity)
		}
		if p.Prefix.Addr().String() == "10.244.0.1" && p.Tunnel.IsValid() {
			t.Errorf("this node's own address behind a tunnel: %+v", p)
		}
	}
	if len(f.tunnelRoutes) != 1 || f.tunnelRoutes[0] != (datapath.TunnelRoute{PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), Node: netip.MustParseAddr("192.168.50.12")}) {
		t.Errorf("tunnel routes %+v: want node-2's pod CIDR via 192.168.50.12", f.tunnelRoutes)
	}
	f.mu.Unlock()
	got := tunnels()
	for ip, tun := range want {
		if got[ip] != tun {
			t.Errorf("ipcache %s: tunnel %s, want %s (all: %v)", ip, got[ip], tun, got)
		}
	}
	f.mu.Lock()
	syncs := f.syncs
	f.mu.Unlock()
	store = apply(t, r, store, strings.Replace(nodes, "{name: node-2}", "{name: node-2, labels: {zone: b}}", 1))
	f.mu.Lock()
	if f.syncs != syncs {
		t.Errorf("a Node change that keeps its address recomputed policy (%d syncs, want %d)", f.syncs, syncs)
	}
	f.mu.Unlock()
	dsrNodes := func() string {
		f.mu.Lock()
		defer f.mu.Unlock()
		return fmt.Sprint(f.dsrNodes)
	}
	if got := dsrNodes(); got != "[192.168.50.12]" {
		t.Errorf("DSR nodes %s, want node-2's underlay address only (node-1 is this node)", got)
	}
	store = apply(t, r, store, strings.Replace(nodes, "192.168.50.12", "192.168.50.22", 1))
	if got := tunnels()["10.244.1.9"]; got != "192.168.50.22" {
		t.Errorf("after node-2 moved: tunnel %s, want 192.168.50.22", got)
	}
	if got := dsrNodes(); got != "[192.168.50.22]" {
		t.Errorf("after node-2 moved: DSR nodes %s, want [192.168.50.22]", got)
	}
	next, changes := store.Remove([]manifest.Key{{Kind: manifest.KindNode, Name: "node-2"}})
	wait(t, r, r.Update(next, changes))
	if got := dsrNodes(); got != "[]" {
		t.Errorf("after node-2 went: DSR nodes %s, want none", got)
	}
}

// A node native routing cannot reach from here (not on the underlay's
// network) is named, not a failed sync: before, the policy sync failed
// at its route every second, and what comes after the routes (the DSR
// node map, the node proxy's cluster view) was never programmed.
func TestUnreachableNodeDoesNotFailTheSync(t *testing.T) {
	f := newFake()
	f.unreachable = map[netip.Addr]bool{netip.MustParseAddr("192.168.50.12"): true}
	r := start(t, f)
	wait(t, r, r.SetEndpoint(endpoint("default/web", "10.244.0.5", "lxc1", 7)))
	const nodes = `
apiVersion: v1
kind: Node
metadata: {name: node-1}
spec: {podCIDR: 10.244.0.0/24}
status: {addresses: [{type: InternalIP, address: 192.168.50.11}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
spec: {podCIDR: 10.244.1.0/24}
status: {addresses: [{type: InternalIP, address: 192.168.50.12}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-3}
spec: {podCIDR: 10.244.2.0/24}
status: {addresses: [{type: InternalIP, address: 192.168.50.13}]}
`
	store := apply(t, r, model.New(), policyDocs+"---"+nodes)
	if err := r.PolicyError(); err != nil {
		t.Errorf("policy error %v, want none", err)
	}
	want := []policy.NodeRoute{{Node: "node-2", PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), Tunnel: netip.MustParseAddr("192.168.50.12")}}
	if got := r.UnreachableNodes(); !slices.Equal(got, want) {
		t.Errorf("unreachable nodes %v, want %v", got, want)
	}
	f.mu.Lock()
	if got := fmt.Sprint(f.dsrNodes); got != "[192.168.50.12 192.168.50.13]" {
		t.Errorf("DSR nodes %s, want both other nodes (the sync went on past the routes)", got)
	}
	f.mu.Unlock()
	apply(t, r, store, strings.Replace(nodes, "192.168.50.12", "192.168.50.22", 1))
	if got := r.UnreachableNodes(); len(got) != 0 {
		t.Errorf("after node-2 moved onto a reachable address: unreachable %v, want none", got)
	}
}

// TestEndpointRemovalDetaches: a removed endpoint's programs are detached
// and it leaves the endpoint map.
func TestEndpointRemovalDetaches(t *testing.T) {
	f := newFake()
	r := start(t, f)
	apply(t, r, model.New(), policyDocs)
	wait(t, r, r.SetEndpoint(endpoint("default/web", "10.244.0.5", "lxc1", 7)))
	wait(t, r, r.RemoveEndpoint("default/web"))
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.attached["lxc1"]; ok || len(f.endpoints) != 0 {
		t.Errorf("after removal: attached %v, endpoints %v", f.attached, f.endpoints)
	}
}

// TestAdmitCountsPodsWithoutAddresses: a change whose policy would not fit
// is refused before commit, counting the entries of local pods that have
// no address yet.
func TestAdmitCountsPodsWithoutAddresses(t *testing.T) {
	f := newFake()
	r := start(t, f)
	// web has two entries (client -> 80, and the node, always allowed);
	// "new" selects the same policy and has no address yet: four in all.
	f.maxEntries = 3
	store, _ := model.New().Put(parse(t, policyDocs))
	if err := r.Admit(store); err == nil || !strings.Contains(err.Error(), "nothing applied") {
		t.Errorf("admit with 3 entries of room: %v, want refused", err)
	}
	f.maxEntries = 4
	if err := r.Admit(store); err != nil {
		t.Errorf("admit with 4 entries of room: %v", err)
	}
}

// TestBurstsCoalesce: changes that arrive while a sync runs become one
// more sync, not one each.
func TestBurstsCoalesce(t *testing.T) {
	f := newFake()
	f.gate = make(chan struct{})
	r := start(t, f)
	store := model.New()
	var gen uint64
	for i := 0; i < 50; i++ {
		next, changes := store.Put(parse(t, fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: ns%d}\n", i)))
		gen = r.Update(next, changes)
		store = next
	}
	close(f.gate) // the first sync (started by Run or the first change) may now finish
	wait(t, r, gen)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.syncs > 3 {
		t.Errorf("%d policy syncs for a burst of 50 changes, want at most 3", f.syncs)
	}
}

// TestEndpointBeforeThePodsAddress: with a real kubelet the CNI ADD (the
// endpoint) comes before status.podIP, and the ADD waits for the sync, so
// the pod must be programmed (identity, policy) from its endpoint alone:
// its containers start right after.
func TestEndpointBeforeThePodsAddress(t *testing.T) {
	f := newFake()
	r := start(t, f)
	apply(t, r, model.New(), policyDocs) // default/new has no status.podIP
	wait(t, r, r.SetEndpoint(endpoint("default/new", "10.244.0.6", "lxc2", 8)))
	f.mu.Lock()
	defer f.mu.Unlock()
	var ep *datapath.Endpoint
	for i := range f.endpoints {
		if f.endpoints[i].IP == netip.MustParseAddr("10.244.0.6") {
			ep = &f.endpoints[i]
		}
	}
	if ep == nil || !ep.IngressIsolated || ep.Identity < policy.FirstPodIdentity {
		t.Fatalf("endpoints %+v: want default/new at 10.244.0.6, isolated, with its identity", f.endpoints)
	}
	inCache, allowed := false, false
	for _, p := range f.policy.IPCache {
		inCache = inCache || p.Prefix == netip.MustParsePrefix("10.244.0.6/32")
	}
	for _, e := range f.policy.Entries {
		allowed = allowed || (e.Endpoint == netip.MustParseAddr("10.244.0.6") && e.Port == 80 && e.Verdict == policy.VerdictAllow)
	}
	if !inCache || !allowed {
		t.Errorf("10.244.0.6 in the ipcache: %v, its policy entries: %v; want both from the endpoint's address", inCache, allowed)
	}
}

// TestPolicyErrorIsKept: a policy the maps cannot hold is refused and the
// reason kept (the agent reports it), until a sync succeeds again.
func TestPolicyErrorIsKept(t *testing.T) {
	f := newFake()
	f.maxEntries = 1
	r := start(t, f)
	wait(t, r, r.SetEndpoint(endpoint("default/web", "10.244.0.5", "lxc1", 7)))
	next, changes := model.New().Put(parse(t, policyDocs))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Wait(ctx, r.Update(next, changes)); err == nil {
		t.Fatal("a policy larger than the map was programmed")
	}
	if err := r.PolicyError(); err == nil || !strings.Contains(err.Error(), "shunt_policy is full") {
		t.Fatalf("PolicyError() = %v, want the map-full reason", err)
	}
	f.mu.Lock()
	f.maxEntries = 0
	f.mu.Unlock()
	wait(t, r, r.Update(next, nil))
	if err := r.PolicyError(); err != nil {
		t.Errorf("after a successful sync PolicyError() = %v", err)
	}
}

// TestWaitForObjects: a restarted agent's reconciler writes nothing to the
// datapath (which still holds what the previous agent programmed) before
// the source's first Update, endpoints restored meanwhile included; the
// first sync then has both.
func TestWaitForObjects(t *testing.T) {
	f := newFake()
	r := New(Config{NodeName: "node-1", NodeAddrs: []netip.Addr{netip.MustParseAddr("10.244.0.1")}, WaitForObjects: true}, f)
	runUntilEnd(t, r)
	r.SetEndpoint(model.Endpoint{Pod: "default/a", Ifname: "veth-a", Ifindex: 7, IP: netip.MustParseAddr("10.244.0.5")})
	time.Sleep(50 * time.Millisecond)
	if log := f.takeLog(); len(log) > 0 {
		t.Fatalf("the datapath was written before the objects came: %v", log)
	}
	apply(t, r, model.New(), service("web", "10.96.0.10", "10.244.0.5"))
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.services) != 1 || f.attached["veth-a"] != 7 {
		t.Errorf("first sync: services %v, attached %v", f.services, f.attached)
	}
}
