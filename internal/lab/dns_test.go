package lab

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const nodeResolvConf = `# written by the node's DHCP client
nameserver 192.0.2.53
nameserver 192.0.2.54
search corp.example. lab.example
options edns0 ndots:2
options timeout:1
`

// The resolv.conf of each dnsPolicy, as kubelet writes it (k8s.io/kubernetes
// pkg/kubelet/network/dns: ClusterFirst's search list is the namespace's,
// the cluster's, then the node's; options ndots:5; dnsConfig merged in).
func TestPodResolvConfPerPolicy(t *testing.T) {
	node, err := parseResolvConf(nodeResolvConf)
	if err != nil {
		t.Fatal(err)
	}
	if want := "search corp.example lab.example\nnameserver 192.0.2.53\nnameserver 192.0.2.54\noptions edns0 ndots:2 timeout:1\n"; node.String() != want {
		t.Fatalf("node resolv.conf read as\n%s\nwant\n%s", node, want)
	}
	dns := DNS{Servers: []netip.Addr{netip.MustParseAddr("10.96.0.10")}}
	pod := func(policy corev1.DNSPolicy, hostNet bool, cfg *corev1.PodDNSConfig) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
			Spec: corev1.PodSpec{DNSPolicy: policy, HostNetwork: hostNet, DNSConfig: cfg}}
	}
	nodeFile := node.String()
	clusterFile := "search shop.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example\nnameserver 10.96.0.10\noptions ndots:5\n"
	two := "2"
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		dns  DNS
		want string
	}{
		{"ClusterFirst", pod(corev1.DNSClusterFirst, false, nil), dns, clusterFile},
		{"no policy is ClusterFirst", pod("", false, nil), dns, clusterFile},
		{"ClusterFirst on the host network is Default", pod(corev1.DNSClusterFirst, true, nil), dns, nodeFile},
		{"ClusterFirstWithHostNet", pod(corev1.DNSClusterFirstWithHostNet, true, nil), dns, clusterFile},
		{"Default", pod(corev1.DNSDefault, false, nil), dns, nodeFile},
		{"ClusterFirst without cluster DNS falls back to Default", pod(corev1.DNSClusterFirst, false, nil), DNS{}, nodeFile},
		{"other cluster domain", pod(corev1.DNSClusterFirst, false, nil), DNS{Servers: dns.Servers, Domain: "k8s.test"},
			"search shop.svc.k8s.test svc.k8s.test k8s.test corp.example lab.example\nnameserver 10.96.0.10\noptions ndots:5\n"},
		{"None with dnsConfig", pod(corev1.DNSNone, false, &corev1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1"}, Searches: []string{"resolv.conf.local"},
			Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: &two}, {Name: "edns0"}},
		}), dns, "search resolv.conf.local\nnameserver 1.1.1.1\noptions ndots:2 edns0\n"},
		{"None without dnsConfig", pod(corev1.DNSNone, false, nil), dns, ""},
		{"ClusterFirst with dnsConfig merged", pod(corev1.DNSClusterFirst, false, &corev1.PodDNSConfig{
			Nameservers: []string{"10.96.0.10", "192.0.2.1"}, Searches: []string{"cluster.local", "extra.example"},
			Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: &two}, {Name: "single-request"}},
		}), dns, "search shop.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example extra.example\n" +
			"nameserver 10.96.0.10\nnameserver 192.0.2.1\noptions ndots:2 single-request\n"},
		{"at most three nameservers", pod(corev1.DNSDefault, false, &corev1.PodDNSConfig{Nameservers: []string{"192.0.2.1", "192.0.2.2"}}), dns,
			"search corp.example lab.example\nnameserver 192.0.2.53\nnameserver 192.0.2.54\nnameserver 192.0.2.1\noptions edns0 ndots:2 timeout:1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := podResolverConfig(tc.pod, tc.dns, node).String(); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// podResolvConf reads the node's file from DNS.ResolvConf; a node without
// one gives pods of policy Default an empty file, as kubelet.
func TestPodResolvConfReadsTheNodes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte(nodeResolvConf), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "b"}, Spec: corev1.PodSpec{DNSPolicy: corev1.DNSDefault}}
	got, err := podResolvConf(pod, DNS{ResolvConf: path})
	if err != nil || !strings.Contains(got, "nameserver 192.0.2.53\n") {
		t.Errorf("got %q, %v; want the node's nameservers", got, err)
	}
	got, err = podResolvConf(pod, DNS{ResolvConf: path + ".missing"})
	if err != nil || got != "" {
		t.Errorf("without a node file: got %q, %v; want an empty file", got, err)
	}
}

// /etc/hosts as kubelet writes it: the pod's name, its FQDN with a
// subdomain, hostAliases; a host-network pod the node's file.
func TestPodHosts(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0"}, Spec: corev1.PodSpec{
		Hostname: "web", Subdomain: "backends",
		HostAliases: []corev1.HostAlias{{IP: "192.0.2.7", Hostnames: []string{"foo.local", "bar.local"}}},
	}}
	got := podHosts(p, "10.244.0.5", DNS{}, "")
	want := "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n" +
		"10.244.0.5\tweb.backends.shop.svc.cluster.local\tweb\n" +
		"\n# Entries added by HostAliases.\n192.0.2.7\tfoo.local\n192.0.2.7\tbar.local\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0"}}
	if got := podHosts(plain, "10.244.0.5", DNS{}, ""); !strings.HasSuffix(got, "fe00::2\tip6-allrouters\n10.244.0.5\tweb-0\n") {
		t.Errorf("without a subdomain: got\n%s", got)
	}
	host := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "agent"}, Spec: corev1.PodSpec{HostNetwork: true}}
	if got := podHosts(host, "192.0.2.10", DNS{}, "127.0.0.1\tlocalhost\n192.0.2.10\tnode1\n"); got != "# Kubernetes-managed hosts file (host network).\n127.0.0.1\tlocalhost\n192.0.2.10\tnode1\n" {
		t.Errorf("host network: got\n%s", got)
	}
}
