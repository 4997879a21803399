package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/kubetest"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podnet"
)

// TestRealKubeProxyRulesFoundAndRemoved runs the real kube-proxy, in each of
// its Linux modes, in a network namespace of its own against a real control
// plane (which has the kubernetes Service, so per-Service rules exist), and
// checks: its rules are found and live; the agent's check refuses them by
// default, naming them; with removal, once kube-proxy is stopped, nothing of
// it is left while kubelet's chain, which kube-proxy also creates and never
// deletes, stays.
func TestRealKubeProxyRulesFoundAndRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and netfilter")
	}
	for _, bin := range []string{"iptables", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed: run scripts/setup.sh", bin)
		}
	}
	kc := kubetest.Start(t)
	// A Service with an endpoint, so kube-proxy writes per-Service rules.
	ctx := context.Background()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := kc.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.221.0.5"}}},
		Ports:       []discoveryv1.EndpointPort{{Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	if _, err := kc.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // each in its own namespace
			ns := fmt.Sprintf("kpt%05x-%s", rand.IntN(1<<20), mode[:3])
			if err := podnet.CreateNetns(ns, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { podnet.DeleteNetns(ns) })
			in := func(fn func() error) error { return netnsrun.Do(podnet.NetnsPath(ns), fn) }
			if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			// kube-proxy reaches the API server on the machine's loopback
			// through a relay on the namespace's own.
			relay, err := kc.RelayInto(podnet.NetnsPath(ns))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { relay.Close() })

			// Its Node, which kube-proxy waits for (30 s) before it starts.
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ns}}
			if _, err := kc.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			stop := kc.StartKubeProxy(t, ns, ns, mode, "10.221.0.0/16")
			var found Rules
			deadline := time.Now().Add(60 * time.Second)
			for !found.Live() || found.ServiceChains == 0 && mode == "iptables" {
				if time.Now().After(deadline) {
					t.Fatalf("kube-proxy's %s rules not found within 60 s: %s", mode, found)
				}
				time.Sleep(200 * time.Millisecond)
				if err := in(func() (err error) { found, err = Detect(); return err }); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("found: %s", found)
			switch mode {
			case "iptables":
				if !strings.Contains(strings.Join(found.Chains, ","), "ip nat KUBE-SERVICES") {
					t.Errorf("iptables mode: KUBE-SERVICES of the nat table not among %v", found.Chains)
				}
				if strings.Contains(strings.Join(found.Chains, ","), "KUBE-FIREWALL") {
					t.Errorf("kubelet's KUBE-FIREWALL counted as kube-proxy's: %v", found.Chains)
				}
			case "nftables":
				if !strings.Contains(strings.Join(found.Tables, ","), "ip kube-proxy") {
					t.Errorf("nftables mode: table ip kube-proxy not among %v", found.Tables)
				}
			}

			var checkErr error
			if err := in(func() error { _, checkErr = Check(false); return nil }); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(checkErr, ErrLive) || !strings.Contains(checkErr.Error(), "--remove-kube-proxy-rules") {
				t.Fatalf("check without removal: %v, want ErrLive naming --remove-kube-proxy-rules", checkErr)
			}

			stop()
			if err := in(func() error { _, err := Check(true); return err }); err != nil {
				t.Fatalf("check with removal: %v", err)
			}
			var after Rules
			if err := in(func() (err error) { after, err = Detect(); return err }); err != nil {
				t.Fatal(err)
			}
			if !after.Empty() {
				t.Fatalf("after removal: %s", after)
			}
			if mode == "iptables" {
				out, err := exec.Command("ip", "netns", "exec", ns, "iptables", "-t", "filter", "-S", "KUBE-FIREWALL").CombinedOutput()
				if err != nil {
					t.Errorf("kubelet's KUBE-FIREWALL chain went with kube-proxy's: %v\n%s", err, out)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
