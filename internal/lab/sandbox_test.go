package lab

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/shuntnet/shunt/internal/podnet"
)

// sandbox builds one pod's sandbox as shunt-cni does (a named network
// namespace, a veth with the pod's address) and the kubelet's record of
// it; both go when the test ends.
func sandbox(tb testing.TB) (*kubelet, *PodRecord, podnet.Node, podnet.Pod) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to create network namespaces and interfaces")
	}
	id := rand.IntN(1 << 20)
	cidr := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 200+rand.IntN(50), rand.IntN(250)))
	node := podnet.Node{PodCIDR: cidr, NodeIP: cidr.Addr().Next(), HostIf: fmt.Sprintf("lsn%05x", id)}
	pod := podnet.Pod{Netns: fmt.Sprintf("lab-sandbox-%05x", id), HostIf: fmt.Sprintf("lsp%05x", id), PodIP: node.NodeIP.Next()}
	tb.Cleanup(func() {
		if err := podnet.TeardownPod(pod); err != nil {
			tb.Error(err)
		}
		if err := podnet.TeardownNode(node); err != nil {
			tb.Error(err)
		}
	})
	if err := podnet.SetupNode(node); err != nil {
		tb.Fatal(err)
	}
	if _, err := podnet.SetupPod(node, pod); err != nil {
		tb.Fatal(err)
	}
	rec := &PodRecord{Namespace: "default", Name: "web", ContainerID: "c1", IP: pod.PodIP.String(), Netns: pod.Netns, HostIf: pod.HostIf}
	return &kubelet{cfg: Config{Log: slog.New(slog.DiscardHandler)}}, rec, node, pod
}

// The kubelet's pass over its pods (every second on an idle node) notices
// a sandbox that lost its veth or its network namespace, and rebuilds it;
// one that is in place costs next to nothing.
func TestSandboxGone(t *testing.T) {
	k, rec, node, pod := sandbox(t)
	ctx := context.Background()
	if !k.healthy(ctx, rec, false) {
		t.Fatal("a sandbox just built is not healthy")
	}
	allocs := testing.AllocsPerRun(100, func() { k.healthy(ctx, rec, false) })
	t.Logf("allocations per healthy pod per pass: %.0f", allocs)
	if allocs > 4 { // a statfs and an ioctl; netlink lookups took 124
		t.Errorf("checking a healthy sandbox allocates %.0f times, want at most 4", allocs)
	}

	// The veth goes (either end takes the other along).
	l, err := netlink.LinkByName(pod.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	if k.healthy(ctx, rec, false) {
		t.Error("a sandbox without its veth is healthy")
	}
	if _, err := podnet.SetupPod(node, pod); err != nil {
		t.Fatal(err)
	}
	if !k.healthy(ctx, rec, false) {
		t.Fatal("a rebuilt sandbox is not healthy")
	}

	// The namespace is deleted while something still holds it: its veth
	// lives on, the pod's path is gone.
	held, err := netns.GetFromPath(podnet.NetnsPath(pod.Netns))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := netns.DeleteNamed(pod.Netns); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(pod.HostIf); err != nil {
		t.Fatalf("the veth went with the namespace's name: %v", err)
	}
	if k.healthy(ctx, rec, false) {
		t.Error("a sandbox whose namespace was deleted is healthy")
	}

	// The namespace's file is there, but no namespace is mounted on it.
	if err := os.WriteFile(podnet.NetnsPath(pod.Netns), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if k.healthy(ctx, rec, false) {
		t.Error("a sandbox whose namespace file is not a namespace is healthy")
	}
	os.Remove(podnet.NetnsPath(pod.Netns))
}

// BenchmarkSandboxHealthy is the cost of the kubelet's check of one pod
// whose sandbox is in place: what an idle node pays per pod every second.
func BenchmarkSandboxHealthy(b *testing.B) {
	k, rec, _, _ := sandbox(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if !k.healthy(ctx, rec, false) {
			b.Fatal("not healthy")
		}
	}
}
