package cniplugin_test

// These tests run the shunt-cni binary the way a runtime does, through
// libcni (and, for input libcni itself would refuse, through its invoke
// package), against a small agent API on a Unix socket. They need root:
// each builds a node interface, network namespaces and a cgroup with
// unique names and removes them even when it fails. test/e2e drives the
// plugin through the real agent.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/shuntnet/shunt/internal/addrstore"
	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/cniplugin"
	"github.com/shuntnet/shunt/internal/podnet"
)

var binDir string // where TestMain built shunt-cni

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shunt-cni-test-")
	if err != nil {
		panic(err)
	}
	out, err := exec.Command("go", "build", "-o", dir+"/", "../../cmd/shunt-cni").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building shunt-cni: %v\n%s", err, out)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fakeAgent is the agent's CNI-facing API with a map for a reconciler.
type fakeAgent struct {
	socket string
	net    api.Network
	srv    *http.Server
	mu     sync.Mutex
	eps    map[string]api.Endpoint
}

func startAgent(t *testing.T, socket string, n api.Network) *fakeAgent {
	a := &fakeAgent{socket: socket, net: n, eps: map[string]api.Endpoint{}}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, code int, v any) {
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /v1/healthz", func(w http.ResponseWriter, r *http.Request) { reply(w, 200, api.Health{Status: "ok"}) })
	mux.HandleFunc("GET /v1/network", func(w http.ResponseWriter, r *http.Request) { reply(w, 200, a.net) })
	mux.HandleFunc("GET /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		out := []api.Endpoint{}
		for pod, ep := range a.eps {
			ep.Pod = pod
			out = append(out, ep)
		}
		reply(w, 200, out)
	})
	mux.HandleFunc("GET /v1/endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		ep, ok := a.eps[r.PathValue("ns")+"/"+r.PathValue("name")]
		if !ok {
			reply(w, 404, api.Error{Error: "no endpoint"})
			return
		}
		reply(w, 200, ep)
	})
	mux.HandleFunc("PUT /v1/endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		var ep api.Endpoint
		if err := json.NewDecoder(r.Body).Decode(&ep); err != nil {
			reply(w, 400, api.Error{Error: err.Error()})
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.eps[r.PathValue("ns")+"/"+r.PathValue("name")] = ep
		reply(w, 200, ep)
	})
	mux.HandleFunc("DELETE /v1/endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		pod := r.PathValue("ns") + "/" + r.PathValue("name")
		if ep, ok := a.eps[pod]; ok && ep.ContainerID == r.URL.Query().Get("containerID") {
			delete(a.eps, pod)
		}
		reply(w, 200, struct{}{})
	})
	a.srv = &http.Server{Handler: mux}
	go a.srv.Serve(ln)
	t.Cleanup(a.stop)
	return a
}

func (a *fakeAgent) stop() { a.srv.Close(); os.Remove(a.socket) }

func (a *fakeAgent) endpoint(pod string) (api.Endpoint, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ep, ok := a.eps[pod]
	return ep, ok
}

// env is one test's node: a node interface, an agent, an address store.
type env struct {
	t       *testing.T
	id      string
	node    podnet.Node
	agent   *fakeAgent
	dataDir string
	cni     *libcni.CNIConfig
	conf    *libcni.NetworkConfigList
	confRaw string
}

func newEnv(t *testing.T) *env {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veths and cgroups")
	}
	id := fmt.Sprintf("%05x", rand.IntN(1<<20))
	cidr := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 200+rand.IntN(50), rand.IntN(250)))
	e := &env{t: t, id: id, dataDir: t.TempDir()}
	e.node = podnet.Node{PodCIDR: cidr, NodeIP: cidr.Addr().Next(), HostIf: "cnit" + id, ServiceCIDR: netip.MustParsePrefix("10.96.0.0/16")}
	if err := podnet.SetupNode(e.node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { podnet.TeardownNode(e.node) })
	sock := filepath.Join(t.TempDir(), "agent.sock")
	e.agent = startAgent(t, sock, api.Network{
		PodCIDR: cidr.String(), NodeIP: e.node.NodeIP.String(), ServiceCIDR: e.node.ServiceCIDR.String(),
		Mode: "routed", NodeIf: e.node.HostIf, LinkAliasPrefix: "shunt:cnit" + id + ":",
	})
	e.confRaw = fmt.Sprintf(`{"cniVersion":"1.1.0","name":"shunt-test","plugins":[{"type":"shunt-cni","agentSocket":%q,"dataDir":%q,"capabilities":{"cgroupPath":true}}]}`,
		sock, e.dataDir)
	var err error
	if e.conf, err = libcni.ConfListFromBytes([]byte(e.confRaw)); err != nil {
		t.Fatal(err)
	}
	e.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(e.dataDir, "cache"), nil)
	return e
}

// pod is one sandbox: a network namespace and a cgroup.
type pod struct {
	name, netns, cgroup string
	rt                  *libcni.RuntimeConf
}

func (e *env) newPod(name string) *pod {
	t := e.t
	p := &pod{name: name, netns: "cnit-" + e.id + "-" + name}
	if err := podnet.CreateNetns(p.netns, ""); err != nil {
		t.Fatal(err)
	}
	root, err := cgroup.Root()
	if err != nil {
		t.Fatal(err)
	}
	p.cgroup = filepath.Join(root, "cnit-"+e.id+"-"+name)
	if err := cgroup.Create(p.cgroup); err != nil {
		t.Fatal(err)
	}
	p.rt = &libcni.RuntimeConf{
		ContainerID: "cnit" + e.id + name, NetNS: podnet.NetnsPath(p.netns), IfName: "eth0",
		Args:           [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", name}},
		CapabilityArgs: map[string]any{"cgroupPath": p.cgroup},
	}
	t.Cleanup(func() {
		podnet.DetachPod(podnet.Pod{HostIf: cniplugin.HostIfName(p.rt.ContainerID, "eth0")})
		podnet.DeleteNetns(p.netns)
		cgroup.Remove(p.cgroup)
	})
	return p
}

func (e *env) add(p *pod) *current.Result {
	e.t.Helper()
	r, err := e.cni.AddNetworkList(context.Background(), e.conf, p.rt)
	if err != nil {
		e.t.Fatalf("ADD %s: %v", p.name, err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a CNI error", err, err)
	}
	if e.Msg == "" {
		t.Errorf("CNI error %d has no message", e.Code)
	}
	return e.Code
}

// TestAddCheckDel: ADD plumbs the pod (the pod reaches the node), reports
// a CNI 1.1 result and the endpoint to the agent; CHECK passes; DEL
// removes veth, reservation and endpoint, twice in a row; CHECK then fails.
func TestAddCheckDel(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("a")
	res := e.add(p)

	if len(res.Interfaces) != 2 || res.Interfaces[1].Sandbox != p.rt.NetNS || res.Interfaces[1].Name != "eth0" {
		t.Fatalf("interfaces: %+v", res.Interfaces)
	}
	if len(res.IPs) != 1 || res.IPs[0].Interface == nil || *res.IPs[0].Interface != 1 || !res.IPs[0].Gateway.Equal(e.node.NodeIP.AsSlice()) {
		t.Fatalf("ips: %+v", res.IPs)
	}
	ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	if !e.node.PodCIDR.Contains(ip) || ip == e.node.NodeIP {
		t.Errorf("address %s is not a pod address of %s", ip, e.node.PodCIDR)
	}
	if len(res.Routes) != 2 {
		t.Errorf("routes: %+v", res.Routes)
	}
	ep, ok := e.agent.endpoint("default/a")
	if !ok {
		t.Fatal("the agent got no endpoint")
	}
	if ep.ContainerID != p.rt.ContainerID || ep.IP != ip.String() || ep.HostIf != res.Interfaces[0].Name || ep.Netns != p.rt.NetNS || ep.Cgroup != p.cgroup || ep.CgroupID == 0 {
		t.Errorf("endpoint %+v does not match the attachment", ep)
	}
	host, err := netlink.LinkByName(ep.HostIf)
	if err != nil || host.Attrs().Index != ep.Ifindex || !strings.HasPrefix(host.Attrs().Alias, "shunt:cnit"+e.id+":default/a") {
		t.Errorf("host veth %s: %v %+v", ep.HostIf, err, host)
	}
	if out, err := exec.Command("ip", "netns", "exec", p.netns, "ping", "-c", "1", "-W", "2", e.node.NodeIP.String()).CombinedOutput(); err != nil {
		t.Errorf("pod -> node: %v\n%s", err, out)
	}
	if err := e.cni.CheckNetworkList(context.Background(), e.conf, p.rt); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}

	for i := range 2 {
		if err := e.cni.DelNetworkList(context.Background(), e.conf, p.rt); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if _, ok := e.agent.endpoint("default/a"); ok {
		t.Error("the agent still has the endpoint after DEL")
	}
	if _, err := netlink.LinkByName(ep.HostIf); err == nil {
		t.Error("the host veth is still there after DEL")
	}
	store, _ := addrstore.Open(e.dataDir, "shunt-test")
	if all, _ := store.List(); len(all) != 0 {
		t.Errorf("reservations after DEL: %+v", all)
	}
	// DEL of a namespace that is gone too, as after a reboot.
	podnet.DeleteNetns(p.netns)
	if err := e.cni.DelNetworkList(context.Background(), e.conf, p.rt); err != nil {
		t.Errorf("DEL without the namespace: %v", err)
	}
}

// TestCheckFailures: CHECK fails when the veth is gone or the agent does
// not know the endpoint.
func TestCheckFailures(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("a")
	e.add(p)
	e.agent.mu.Lock()
	delete(e.agent.eps, "default/a")
	e.agent.mu.Unlock()
	if err := e.cni.CheckNetworkList(context.Background(), e.conf, p.rt); err == nil || !strings.Contains(err.Error(), "no endpoint") {
		t.Errorf("CHECK with the agent not knowing the endpoint: %v", err)
	}
	podnet.DetachPod(podnet.Pod{HostIf: cniplugin.HostIfName(p.rt.ContainerID, "eth0")})
	if err := e.cni.CheckNetworkList(context.Background(), e.conf, p.rt); err == nil {
		t.Error("CHECK passed without the veth")
	}
}

// TestConcurrentAdds: ADDs run at once (as a runtime starting many pods)
// get distinct addresses, and each pod reaches the others.
func TestConcurrentAdds(t *testing.T) {
	e := newEnv(t)
	pods := make([]*pod, 8)
	for i := range pods {
		pods[i] = e.newPod(fmt.Sprint("p", i))
	}
	ips := make([]netip.Addr, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.cni.AddNetworkList(context.Background(), e.conf, p.rt)
			if err != nil {
				t.Errorf("ADD %s: %v", p.name, err)
				return
			}
			res, _ := current.NewResultFromResult(r)
			ips[i], _ = netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]string{}
	for i, ip := range ips {
		if other, dup := seen[ip]; dup {
			t.Errorf("%s and %s both got %s", other, pods[i].name, ip)
		}
		seen[ip] = pods[i].name
	}
	if out, err := exec.Command("ip", "netns", "exec", pods[0].netns, "ping", "-c", "1", "-W", "2", ips[len(ips)-1].String()).CombinedOutput(); err != nil {
		t.Errorf("pod -> pod: %v\n%s", err, out)
	}
}

// TestGC: GC keeps the valid attachments and removes everything of the
// others: reservation, veth, the agent's endpoint.
func TestGC(t *testing.T) {
	e := newEnv(t)
	keep, drop := e.newPod("keep"), e.newPod("drop")
	e.add(keep)
	e.add(drop)
	err := e.cni.GCNetworkList(context.Background(), e.conf, &libcni.GCArgs{
		ValidAttachments: []types.GCAttachment{{ContainerID: keep.rt.ContainerID, IfName: "eth0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.agent.endpoint("default/drop"); ok {
		t.Error("GC left the endpoint of an invalid attachment")
	}
	if _, err := netlink.LinkByName(cniplugin.HostIfName(drop.rt.ContainerID, "eth0")); err == nil {
		t.Error("GC left the veth of an invalid attachment")
	}
	store, _ := addrstore.Open(e.dataDir, "shunt-test")
	all, _ := store.List()
	if len(all) != 1 || all[0].ContainerID != keep.rt.ContainerID {
		t.Errorf("reservations after GC: %+v", all)
	}
	if err := e.cni.CheckNetworkList(context.Background(), e.conf, keep.rt); err != nil {
		t.Errorf("the valid attachment after GC: %v", err)
	}
}

// TestAgentDown: STATUS says "not available" (50) and ADD "try again
// later" (11) while the agent is down; DEL still cleans up.
func TestAgentDown(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("a")
	if err := e.cni.GetStatusNetworkList(context.Background(), e.conf); err != nil {
		t.Errorf("STATUS with the agent up: %v", err)
	}
	e.add(p)
	e.agent.stop()
	if code := cniCode(t, e.cni.GetStatusNetworkList(context.Background(), e.conf)); code != cniplugin.ErrPluginNotAvailable {
		t.Errorf("STATUS with the agent down: code %d, want 50", code)
	}
	q := e.newPod("b")
	_, err := e.cni.AddNetworkList(context.Background(), e.conf, q.rt)
	if code := cniCode(t, err); code != types.ErrTryAgainLater {
		t.Errorf("ADD with the agent down: code %d (%v), want 11", code, err)
	}
	if err := e.cni.DelNetworkList(context.Background(), e.conf, p.rt); err != nil {
		t.Errorf("DEL with the agent down: %v", err)
	}
	if _, err := netlink.LinkByName(cniplugin.HostIfName(p.rt.ContainerID, "eth0")); err == nil {
		t.Error("DEL with the agent down left the veth")
	}
}

// TestBadInput: what libcni would not send, sent straight to the binary,
// is answered with the specification's error codes.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("a")
	plugin := filepath.Join(binDir, "shunt-cni")
	conf := func(extra string) []byte {
		return fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"shunt-test","type":"shunt-cni","agentSocket":%q,"dataDir":%q%s}`,
			e.agent.socket, e.dataDir, extra)
	}
	args := func(cmd, netns, cniArgs string) *invoke.Args {
		return &invoke.Args{Command: cmd, ContainerID: p.rt.ContainerID, NetNS: netns, IfName: "eth0", Path: binDir, PluginArgsStr: cniArgs}
	}
	podArgs := "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=a"
	for _, c := range []struct {
		name  string
		stdin []byte
		args  *invoke.Args
		code  uint
	}{
		{"malformed config", []byte(`{"cniVersion":"1.1.0","name":`), args("ADD", p.rt.NetNS, podArgs), types.ErrDecodingFailure},
		{"bad podCIDR", conf(`,"podCIDR":"10.0.0.0/33"`), args("ADD", p.rt.NetNS, podArgs), types.ErrInvalidNetworkConfig},
		{"bad mtu", conf(`,"mtu":12`), args("ADD", p.rt.NetNS, podArgs), types.ErrInvalidNetworkConfig},
		{"no CNI_NETNS", conf(""), args("ADD", "", podArgs), types.ErrInvalidEnvironmentVariables},
		{"netns missing", conf(""), args("ADD", "/run/netns/cnit-none-"+e.id, podArgs), types.ErrInvalidNetNS},
		{"no pod in CNI_ARGS", conf(""), args("ADD", p.rt.NetNS, "IgnoreUnknown=1"), types.ErrInvalidEnvironmentVariables},
		{"unsupported cniVersion", []byte(`{"cniVersion":"9.9.9","name":"shunt-test","type":"shunt-cni"}`), args("ADD", p.rt.NetNS, podArgs), types.ErrIncompatibleCNIVersion},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := invoke.ExecPluginWithResult(context.Background(), plugin, c.stdin, c.args, nil)
			if code := cniCode(t, err); code != c.code {
				t.Errorf("code %d (%v), want %d", code, err, c.code)
			}
		})
	}
	store, _ := addrstore.Open(e.dataDir, "shunt-test")
	if all, _ := store.List(); len(all) != 0 {
		t.Errorf("failed ADDs left reservations: %+v", all)
	}
	info, err := e.cni.GetVersionInfo(context.Background(), "shunt-cni")
	if err != nil || !strings.Contains(strings.Join(info.SupportedVersions(), ","), "1.1.0") {
		t.Errorf("VERSION: %v %v", info, err)
	}
}
