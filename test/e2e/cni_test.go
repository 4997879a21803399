package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/shuntnet/shunt/internal/addrstore"
	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/instance"
)

// TestCNIThroughAgent drives shunt-cni with libcni against a real agent:
// the lab's pods were plumbed by the plugin (the agent has their
// endpoints); a runtime-style DEL takes the server pod's endpoint out of
// the agent, and a runtime-style ADD into the same namespace puts it back
// and the datapath with it (the client reaches the server again, in
// redirect-peer mode, which needs the new interface's programs and
// endpoint entries); CHECK, STATUS and GC agree with the agent; deleting
// the pod object removes endpoint, veth and reservation.
func TestCNIThroughAgent(t *testing.T) {
	l := newLab(t, "redirect-peer", twoPods)
	inst := instance.Instance{Name: l.instance}
	c := api.NewClient(inst.Socket())
	endpoints := func() map[string]api.Endpoint {
		t.Helper()
		var eps []api.Endpoint
		if err := c.Do(http.MethodGet, "/v1/endpoints", nil, &eps); err != nil {
			t.Fatal(err)
		}
		out := map[string]api.Endpoint{}
		for _, ep := range eps {
			out[ep.Pod] = ep
		}
		return out
	}
	server := l.podIP("server")
	eps := endpoints()
	for _, pod := range []string{"client", "server"} {
		ep, ok := eps["default/"+pod]
		if !ok || ep.ContainerID == "" || ep.IP != l.podIP(pod) || ep.CgroupID == 0 {
			t.Fatalf("the agent's endpoint of %s: %+v (known: %v)", pod, ep, ok)
		}
	}
	l.probe("client", "connected", "--tcp", server+":7000")

	// The runtime's view: the lab's network configuration and libcni cache.
	dataDir := filepath.Join(inst.StateDir(), "cni", "networks")
	conf, err := libcni.ConfListFromBytes(fmt.Appendf(nil,
		`{"cniVersion":"1.1.0","name":"shunt","plugins":[{"type":"shunt-cni","agentSocket":%q,"dataDir":%q,"capabilities":{"cgroupPath":true}}]}`,
		inst.Socket(), dataDir))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(inst.StateDir(), "cni", "cache"), nil)
	ctx := context.Background()
	sv := eps["default/server"]
	rt := &libcni.RuntimeConf{
		ContainerID: sv.ContainerID, NetNS: sv.Netns, IfName: "eth0",
		Args:           [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "server"}},
		CapabilityArgs: map[string]any{"cgroupPath": sv.Cgroup},
	}
	if err := cni.CheckNetworkList(ctx, conf, rt); err != nil {
		t.Errorf("CHECK of the server's sandbox: %v", err)
	}
	if err := cni.GetStatusNetworkList(ctx, conf); err != nil {
		t.Errorf("STATUS with the agent up: %v", err)
	}

	for range 2 { // DEL is idempotent
		if err := cni.DelNetworkList(ctx, conf, rt); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	}
	if _, ok := endpoints()["default/server"]; ok {
		t.Error("the agent kept the server's endpoint after DEL")
	}
	if _, err := netlink.LinkByName(sv.HostIf); err == nil {
		t.Error("DEL left the server's veth")
	}
	if err := cni.CheckNetworkList(ctx, conf, rt); err == nil {
		t.Error("CHECK passed after DEL")
	}

	r, err := cni.AddNetworkList(ctx, conf, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	res, _ := current.NewResultFromResult(r)
	if got := res.IPs[0].Address.IP.String(); got != server {
		t.Fatalf("ADD gave %s, not the address the pod object has (%s)", got, server)
	}
	ep, ok := endpoints()["default/server"]
	if !ok || ep.Ifindex == sv.Ifindex || ep.ContainerID != sv.ContainerID {
		t.Errorf("the agent's endpoint after ADD: %+v (before: ifindex %d)", ep, sv.Ifindex)
	}
	// ADD answered after the agent's sync: the new veth forwards at once.
	l.probe("client", "connected", "--tcp", server+":7000", "--udp", server+":7000")
	l.probe("server", "connected", "--tcp", l.podIP("client")+":7000")

	// GC with every attachment valid keeps them all.
	valid := []types.GCAttachment{}
	for _, ep := range endpoints() {
		valid = append(valid, types.GCAttachment{ContainerID: ep.ContainerID, IfName: "eth0"})
	}
	if err := cni.GCNetworkList(ctx, conf, &libcni.GCArgs{ValidAttachments: valid}); err != nil {
		t.Errorf("GC: %v", err)
	}
	if err := cni.CheckNetworkList(ctx, conf, rt); err != nil {
		t.Errorf("CHECK after GC: %v", err)
	}

	// Deleting the pod object: the lab's kubelet runs DEL.
	l.mustShunt("delete", "pod", "server")
	if _, ok := endpoints()["default/server"]; ok {
		t.Error("the agent kept the endpoint of a deleted pod")
	}
	if _, err := netlink.LinkByName(ep.HostIf); err == nil {
		t.Error("deleting the pod left its veth")
	}
	store, err := addrstore.Open(dataDir, "shunt")
	if err != nil {
		t.Fatal(err)
	}
	all, _ := store.List()
	if len(all) != 1 || all[0].IP.String() != l.podIP("client") {
		t.Errorf("reservations after deleting server: %+v", all)
	}
	if _, err := os.Stat(sv.Netns); err == nil {
		t.Error("deleting the pod left its network namespace")
	}
}

// TestCNIAgentRestart: an agent restart keeps the plugin's endpoints (from
// endpoints.json), so pods stay programmed without a new ADD; a pod whose
// veth vanished while the agent was down is re-plumbed.
func TestCNIAgentRestart(t *testing.T) {
	l := newLab(t, "redirect-peer", twoPods)
	inst := instance.Instance{Name: l.instance}
	server := l.podIP("server")
	var before []api.Endpoint
	api.NewClient(inst.Socket()).Do(http.MethodGet, "/v1/endpoints", nil, &before)
	pid := l.status().PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	var client api.Endpoint
	for _, ep := range before {
		if ep.Pod == "default/client" {
			client = ep
		}
	}
	// The client's veth goes while no agent runs (as after a crash of the
	// runtime's DEL half way): the restarted lab rebuilds the sandbox.
	if l, err := netlink.LinkByName(client.HostIf); err == nil {
		netlink.LinkDel(l)
	}
	l.mustShunt("lab", "up")
	waitRunning(t, l, "client")
	if got := l.podIP("server"); got != server {
		t.Errorf("server address changed across the restart: %s -> %s", server, got)
	}
	l.probe("client", "connected", "--tcp", server+":7000")
	l.probe("server", "connected", "--tcp", l.podIP("client")+":7000")
}
