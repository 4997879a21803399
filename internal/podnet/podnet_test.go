package podnet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestPodPlumbing builds a node and two pods in each mode's shape and checks
// addresses, routes and reachability with ping (no BPF: routed and bridge).
func TestPodPlumbing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces and interfaces")
	}
	for _, bridge := range []bool{false, true} {
		t.Run(fmt.Sprintf("bridge=%v", bridge), func(t *testing.T) {
			id := rand.IntN(1 << 20)
			cidr := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 200+rand.IntN(50), rand.IntN(250)))
			node := Node{Bridge: bridge, PodCIDR: cidr, NodeIP: cidr.Addr().Next(), HostIf: fmt.Sprintf("pnt%05x", id)}
			pods := []Pod{
				{Netns: fmt.Sprintf("podnet-test-%05x-a", id), HostIf: fmt.Sprintf("pnta%05x", id), PodIP: node.NodeIP.Next()},
				{Netns: fmt.Sprintf("podnet-test-%05x-b", id), HostIf: fmt.Sprintf("pntb%05x", id), PodIP: node.NodeIP.Next().Next()},
			}
			t.Cleanup(func() {
				for _, p := range pods {
					if err := TeardownPod(p); err != nil {
						t.Error(err)
					}
				}
				if err := TeardownNode(node); err != nil {
					t.Error(err)
				}
			})
			if err := SetupNode(node); err != nil {
				t.Fatal(err)
			}
			for _, p := range pods {
				if _, err := SetupPod(node, p); err != nil {
					t.Fatal(err)
				}
				// Idempotent: a second setup only inspects.
				if _, err := SetupPod(node, p); err != nil {
					t.Fatal(err)
				}
				if _, err := Verify(node, p); err != nil {
					t.Errorf("verify after setup: %v", err)
				}
				assertNoIPv6(t, p.HostIf)
			}
			ping := func(ns string, ip netip.Addr) {
				t.Helper()
				out, err := exec.Command("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", ip.String()).CombinedOutput()
				if err != nil {
					t.Errorf("ping %s from %s: %v\n%s", ip, ns, err, out)
				}
			}
			ping(pods[0].Netns, pods[1].PodIP) // pod -> pod via the host
			ping(pods[0].Netns, node.NodeIP)   // pod -> node
			if out, err := exec.Command("ping", "-c", "1", "-W", "2", pods[1].PodIP.String()).CombinedOutput(); err != nil {
				t.Errorf("node -> pod: %v\n%s", err, out)
			}
		})
	}
}

// assertNoIPv6: a pod's host veth has IPv6 off and no address, so nothing
// of the node answers a pod over IPv6 (policy is IPv4 only).
func assertNoIPv6(t *testing.T, hostIf string) {
	t.Helper()
	if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + hostIf + "/disable_ipv6"); err == nil && string(b) != "1\n" {
		t.Errorf("%s: disable_ipv6 is %q, want 1", hostIf, b)
	}
	l, err := netlink.LinkByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}
	if addrs, err := netlink.AddrList(l, netlink.FAMILY_V6); err != nil || len(addrs) > 0 {
		t.Errorf("%s has IPv6 addresses %v (err %v): a pod could reach the node's services over IPv6", hostIf, addrs, err)
	}
}

// TestAttachDetach plumbs a pod into a namespace someone else created, as
// a CNI ADD does, under another interface name; Verify notices what DEL
// removed and DEL twice is fine.
func TestAttachDetach(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces and interfaces")
	}
	id := rand.IntN(1 << 20)
	cidr := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 200+rand.IntN(50), rand.IntN(250)))
	node := Node{PodCIDR: cidr, NodeIP: cidr.Addr().Next(), HostIf: fmt.Sprintf("pnt%05x", id),
		ServiceCIDR: netip.MustParsePrefix("10.96.0.0/16")}
	nsName := fmt.Sprintf("podnet-test-%05x-c", id)
	pod := Pod{NetnsPath: NetnsPath(nsName), IfName: "net1", HostIf: fmt.Sprintf("pntc%05x", id), PodIP: node.NodeIP.Next()}
	t.Cleanup(func() {
		if err := errors.Join(DetachPod(pod), DeleteNetns(nsName), TeardownNode(node)); err != nil {
			t.Error(err)
		}
	})
	if err := SetupNode(node); err != nil {
		t.Fatal(err)
	}
	if err := CreateNetns(nsName, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := AttachPod(node, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(node, pod); err != nil {
		t.Fatalf("verify after attach: %v", err)
	}
	other := pod
	other.PodIP = pod.PodIP.Next()
	if _, err := Verify(node, other); err == nil {
		t.Error("verify with another address passed")
	}
	for range 2 {
		if err := DetachPod(pod); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Verify(node, pod); err == nil {
		t.Error("verify after detach passed")
	}
	if _, err := os.Stat(NetnsPath(nsName)); err != nil {
		t.Errorf("detach removed the namespace it does not own: %v", err)
	}
}
