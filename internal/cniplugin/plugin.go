package cniplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/shuntnet/shunt/internal/addrstore"
	"github.com/shuntnet/shunt/internal/api"
	"github.com/shuntnet/shunt/internal/cgroup"
	"github.com/shuntnet/shunt/internal/ipam"
	"github.com/shuntnet/shunt/internal/podnet"
)

// agentTimeout bounds a call to the agent. An ADD waits for the datapath
// (the agent gives up after a minute and says why), so it gets more.
const (
	agentTimeout = 10 * time.Second
	addTimeout   = 90 * time.Second
)

// Funcs are the CNI commands, for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, Status: cmdStatus, GC: cmdGC}
}

// VersionInfo is what VERSION answers.
func VersionInfo() version.PluginInfo { return version.PluginSupports(Versions...) }

// HostIfName names the host side of an attachment's veth: "lxc" and a
// hash of the container ID and interface, the Cilium convention, so it is
// stable for the attachment (DEL and GC find it with no state) and fits
// IFNAMSIZ (14 bytes).
func HostIfName(containerID, ifName string) string {
	h := sha256.Sum256([]byte(containerID + "/" + ifName))
	return "lxc" + hex.EncodeToString(h[:])[:11]
}

// node is what the plugin needs of the agent's node, with the
// configuration's overrides applied.
type node struct {
	net   podnet.Node
	pool  ipam.Pool
	alias string // LinkAliasPrefix
}

func getNode(ctx context.Context, c *api.Client, conf *NetConf) (node, error) {
	var n api.Network
	if err := c.DoContext(ctx, http.MethodGet, "/v1/network", nil, &n); err != nil {
		return node{}, agentError("asking the agent for the node's pod network", conf, err)
	}
	cidr, err1 := netip.ParsePrefix(n.PodCIDR)
	nodeIP, err2 := netip.ParseAddr(n.NodeIP)
	svc, err3 := netip.ParsePrefix(n.ServiceCIDR)
	var cluster netip.Prefix
	var err4 error
	if n.ClusterCIDR != "" {
		cluster, err4 = netip.ParsePrefix(n.ClusterCIDR)
	}
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return node{}, types.NewError(types.ErrInternal, "the agent's node network is malformed: "+err.Error(), "upgrade shunt-cni and shuntd together")
	}
	if conf.podCIDR.IsValid() {
		if conf.podCIDR.Contains(nodeIP) && nodeIP != conf.podCIDR.Addr().Next() {
			return node{}, types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("podCIDR %s holds the node's address %s elsewhere than as its first address", conf.podCIDR, nodeIP),
				"use the node's spec.podCIDR, or leave podCIDR out")
		}
		cidr = conf.podCIDR
	}
	pool, err := ipam.NewPool(cidr.String())
	if err != nil {
		return node{}, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	mtu := n.MTU
	if conf.MTU != 0 {
		mtu = conf.MTU
	}
	return node{
		net: podnet.Node{Bridge: n.Bridge, PodCIDR: cidr, NodeIP: nodeIP, ServiceCIDR: svc, ClusterCIDR: cluster,
			DefaultRoute: n.DefaultRoute, HostIf: n.NodeIf, MTU: mtu},
		pool:  pool,
		alias: n.LinkAliasPrefix,
	}, nil
}

// agentError turns a failed agent call into a CNI error: unreachable or
// not ready means "try again later" (11), anything else is the agent's own
// message.
func agentError(doing string, conf *NetConf, err error) *types.Error {
	var unreachable *api.UnreachableError
	var status *api.StatusError
	switch {
	case errors.As(err, &unreachable), errors.Is(err, context.DeadlineExceeded):
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s: the shunt agent at %s does not answer", doing, conf.AgentSocket),
			"start it (shuntd, or `shunt lab up`) or set agentSocket in the network configuration to its socket; "+err.Error())
	case errors.As(err, &status) && status.Code == http.StatusServiceUnavailable:
		return types.NewError(types.ErrTryAgainLater, doing+": "+status.Msg, "")
	}
	return types.NewError(types.ErrInternal, doing+": "+err.Error(), "")
}

func unreachable(err error) bool {
	var u *api.UnreachableError
	return errors.As(err, &u)
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	pod, err := parsePodArgs(args.Args)
	if err != nil {
		return err
	}
	if _, err := os.Stat(args.Netns); err != nil {
		return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS %s: %v", args.Netns, err), "pass the path of the pod's network namespace")
	}
	ctx, cancel := context.WithTimeout(context.Background(), addTimeout)
	defer cancel()
	c := api.NewClient(conf.AgentSocket)
	n, err := getNode(ctx, c, conf)
	if err != nil {
		return err
	}
	cgroupPath, cgroupID, err := podCgroup(conf.RuntimeConfig.CgroupPath)
	if err != nil {
		return err
	}
	store, err := addrstore.Open(conf.DataDir, conf.Name)
	if err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "check that "+conf.DataDir+" is writable")
	}
	ip, err := store.Allocate(n.pool, args.ContainerID, args.IfName)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("no address for pod %s: %v", pod, err), "")
	}
	plumbing := podnet.Pod{NetnsPath: args.Netns, IfName: args.IfName, HostIf: HostIfName(args.ContainerID, args.IfName),
		PodIP: ip, Alias: n.alias + pod.String()}
	ok := false
	defer func() {
		if !ok { // leave nothing of a failed ADD behind
			podnet.DetachPod(plumbing)
			store.Release(args.ContainerID, args.IfName)
		}
	}()
	// A repeated ADD finds its plumbing in place; anything else in the way
	// (a half-built attempt) is rebuilt.
	links, err := podnet.Verify(n.net, plumbing)
	if err != nil {
		podnet.DetachPod(plumbing)
		if links, err = podnet.AttachPod(n.net, plumbing); err != nil {
			return types.NewError(types.ErrInternal, fmt.Sprintf("plumbing pod %s: %v", pod, err), "")
		}
	}
	ep := api.Endpoint{
		ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns, IP: ip.String(),
		HostIf: plumbing.HostIf, Ifindex: links.HostIfindex, PodMAC: links.PodMAC.String(), NodeMAC: links.HostMAC.String(),
		Cgroup: cgroupPath, CgroupID: cgroupID,
	}
	if err := c.DoContext(ctx, http.MethodPut, "/v1/endpoints/"+pod.Namespace+"/"+pod.Name, ep, nil); err != nil {
		return agentError("handing pod "+pod.String()+"'s endpoint to the agent", conf, err)
	}
	ok = true

	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: plumbing.HostIf, Mac: links.HostMAC.String()},
			{Name: args.IfName, Mac: links.PodMAC.String(), Sandbox: args.Netns},
		},
		IPs: []*current.IPConfig{{
			Interface: current.Int(1),
			Address:   net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(n.net.PodPrefixLen(), 32)},
			Gateway:   n.net.NodeIP.AsSlice(),
		}},
	}
	for _, dst := range n.net.PodRoutes() {
		res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}, GW: n.net.NodeIP.AsSlice()})
	}
	return types.PrintResult(res, conf.CNIVersion)
}

// podCgroup resolves the runtime's cgroupPath (absolute, or relative to
// the cgroup v2 root as runtimes pass it) and reads its id, the inode.
func podCgroup(p string) (string, uint64, error) {
	if p == "" {
		return "", 0, nil
	}
	root, err := cgroup.Root()
	if err != nil {
		return "", 0, types.NewError(types.ErrInternal, err.Error(), "")
	}
	if !strings.HasPrefix(p, root+"/") {
		p = filepath.Join(root, p)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return "", 0, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("runtimeConfig.cgroupPath %s: %v", p, err),
			"the runtime must create the pod's cgroup before ADD, or not pass cgroupPath")
	}
	return p, st.Ino, nil
}

// cmdDel undoes ADD. It is idempotent: a missing namespace, veth,
// reservation or endpoint is success. An agent that does not answer is
// success too: it forgets endpoints whose interface is gone when it
// starts, so blocking the pod's deletion on it would gain nothing.
func cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), addTimeout)
	defer cancel()
	c := api.NewClient(conf.AgentSocket)
	var agentErr error
	if pod, perr := parsePodArgs(args.Args); perr == nil {
		agentErr = c.DoContext(ctx, http.MethodDelete, "/v1/endpoints/"+pod.Namespace+"/"+pod.Name+"?containerID="+args.ContainerID, nil, nil)
	} else {
		agentErr = forgetByContainer(ctx, c, map[string]bool{args.ContainerID: true}, nil)
	}
	if agentErr != nil && !unreachable(agentErr) {
		// The address stays reserved until the agent forgot the endpoint:
		// the runtime retries DEL.
		return agentError("removing the endpoint from the agent", conf, agentErr)
	}
	if err := podnet.DetachPod(podnet.Pod{HostIf: HostIfName(args.ContainerID, args.IfName)}); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	store, err := addrstore.Open(conf.DataDir, conf.Name)
	if err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "check that "+conf.DataDir+" is writable")
	}
	if err := store.Release(args.ContainerID, args.IfName); err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
	return nil
}

// forgetByContainer removes the agent's endpoints of the given containers
// (remove says so) or of containers keep does not hold.
func forgetByContainer(ctx context.Context, c *api.Client, remove map[string]bool, keep func(api.Endpoint) bool) error {
	var eps []api.Endpoint
	if err := c.DoContext(ctx, http.MethodGet, "/v1/endpoints", nil, &eps); err != nil {
		return err
	}
	var errs []error
	for _, ep := range eps {
		if remove[ep.ContainerID] || (keep != nil && !keep(ep)) {
			errs = append(errs, c.DoContext(ctx, http.MethodDelete, "/v1/endpoints/"+ep.Pod+"?containerID="+ep.ContainerID, nil, nil))
		}
	}
	return errors.Join(errs...)
}

// cmdCheck verifies what ADD built: the veth, address and routes, the
// reservation, and that the agent has the endpoint for this container.
func cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	pod, err := parsePodArgs(args.Args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), agentTimeout)
	defer cancel()
	c := api.NewClient(conf.AgentSocket)
	n, err := getNode(ctx, c, conf)
	if err != nil {
		return err
	}
	store, err := addrstore.Open(conf.DataDir, conf.Name)
	if err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
	ip, ok, err := store.Get(args.ContainerID, args.IfName)
	if err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
	if !ok {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("container %s (%s) holds no address", args.ContainerID, args.IfName), "delete and re-create the pod's sandbox")
	}
	if err := checkPrevResult(conf, ip); err != nil {
		return err
	}
	plumbing := podnet.Pod{NetnsPath: args.Netns, IfName: args.IfName, HostIf: HostIfName(args.ContainerID, args.IfName), PodIP: ip}
	links, err := podnet.Verify(n.net, plumbing)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("pod %s: %v", pod, err), "delete and re-create the pod's sandbox")
	}
	var ep api.Endpoint
	if err := c.DoContext(ctx, http.MethodGet, "/v1/endpoints/"+pod.Namespace+"/"+pod.Name, nil, &ep); err != nil {
		var status *api.StatusError
		if errors.As(err, &status) && status.Code == http.StatusNotFound {
			return types.NewError(types.ErrInternal, status.Msg, "delete and re-create the pod's sandbox")
		}
		return agentError("asking the agent for pod "+pod.String()+"'s endpoint", conf, err)
	}
	if ep.ContainerID != args.ContainerID || ep.IP != ip.String() || ep.Ifindex != links.HostIfindex {
		return types.NewError(types.ErrInternal,
			fmt.Sprintf("the agent's endpoint of pod %s (container %s, %s, ifindex %d) is not this attachment (container %s, %s, ifindex %d)",
				pod, ep.ContainerID, ep.IP, ep.Ifindex, args.ContainerID, ip, links.HostIfindex),
			"delete and re-create the pod's sandbox")
	}
	return nil
}

// checkPrevResult compares ADD's result, as the runtime kept it, with the
// reservation.
func checkPrevResult(conf *NetConf, ip netip.Addr) error {
	if conf.RawPrevResult == nil {
		return nil
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return types.NewError(types.ErrDecodingFailure, "prevResult: "+err.Error(), "")
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "prevResult: "+err.Error(), "")
	}
	for _, c := range prev.IPs {
		if a, ok := netip.AddrFromSlice(c.Address.IP.To4()); ok && a == ip {
			return nil
		}
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("the ADD result does not list the reserved address %s", ip), "delete and re-create the pod's sandbox")
}

// cmdStatus answers whether an ADD could succeed now: the agent must
// answer, and the address store must be usable.
func cmdStatus(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), agentTimeout)
	defer cancel()
	if err := api.NewClient(conf.AgentSocket).DoContext(ctx, http.MethodGet, "/v1/healthz", nil, nil); err != nil {
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("the shunt agent at %s does not answer: %v", conf.AgentSocket, err),
			"start it (shuntd, or `shunt lab up`) or set agentSocket in the network configuration to its socket")
	}
	if _, err := addrstore.Open(conf.DataDir, conf.Name); err != nil {
		return types.NewError(ErrPluginNotAvailable, err.Error(), "check that "+conf.DataDir+" is writable")
	}
	return nil
}

// cmdGC removes what attachments not in cni.dev/valid-attachments left:
// their reservations, veths and the agent's endpoints.
func cmdGC(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	store, err := addrstore.Open(conf.DataDir, conf.Name)
	if err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
	freed, err := store.Retain(func(r addrstore.Reservation) bool {
		return valid[types.GCAttachment{ContainerID: r.ContainerID, IfName: r.IfName}]
	})
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, r := range freed {
		errs = append(errs, podnet.DetachPod(podnet.Pod{HostIf: HostIfName(r.ContainerID, r.IfName)}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), addTimeout)
	defer cancel()
	err = forgetByContainer(ctx, api.NewClient(conf.AgentSocket), nil, func(ep api.Endpoint) bool {
		return valid[types.GCAttachment{ContainerID: ep.ContainerID, IfName: ep.IfName}]
	})
	if err != nil && !unreachable(err) { // a stopped agent forgets them itself when it starts
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrTryAgainLater, "garbage collection left something behind: "+err.Error(), "the runtime's next GC retries")
	}
	return nil
}
