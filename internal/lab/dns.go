package lab

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// A pod's /etc/resolv.conf and /etc/hosts, as kubelet writes them
// (k8s.io/kubernetes pkg/kubelet/network/dns and kubelet_pods.go) and a
// runtime mounts them into each container (podexec.Bind).

// DNS is what the kubelet tells pods about name service: its
// --cluster-dns and --cluster-domain, and the node's resolv.conf
// (--resolv-conf).
type DNS struct {
	// Servers are the cluster DNS Service's addresses (kube-dns's
	// ClusterIP); none: pods of policy ClusterFirst get the node's
	// resolver, as a kubelet without --cluster-dns gives them.
	Servers []netip.Addr
	// Domain is the cluster's domain; DefaultClusterDomain when empty.
	Domain string
	// ResolvConf is the node's resolv.conf, what pods of policy Default
	// (and host-network pods of ClusterFirst) get; /etc/resolv.conf when
	// empty.
	ResolvConf string
}

// DefaultClusterDomain is kubelet's --cluster-domain in every cluster
// kubeadm makes, and the one the Kubernetes e2e suites expect.
const DefaultClusterDomain = "cluster.local"

// Kubelet's limits (pkg/apis/core/validation and pkg/kubelet/network/dns):
// glibc reads three nameservers; the search list is cut at 32 domains or
// 2048 characters.
const (
	maxDNSNameservers     = 3
	maxDNSSearchPaths     = 32
	maxDNSSearchListChars = 2048
)

func (d DNS) domain() string {
	if d.Domain == "" {
		return DefaultClusterDomain
	}
	return d.Domain
}

func (d DNS) resolvConfPath() string {
	if d.ResolvConf == "" {
		return "/etc/resolv.conf"
	}
	return d.ResolvConf
}

// resolverConfig is the content of a resolv.conf.
type resolverConfig struct {
	Servers, Searches, Options []string
}

// parseResolvConf reads a resolv.conf as kubelet does: every nameserver,
// the last search line (without "." and trailing dots), options merged
// (a later one replaces an earlier one of the same name).
func parseResolvConf(data string) (resolverConfig, error) {
	var rc resolverConfig
	for _, line := range strings.Split(data, "\n") {
		if line != "" && (line[0] == '#' || line[0] == ';') {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) < 2 {
				return rc, fmt.Errorf("resolv.conf: nameserver line without an address: %q", line)
			}
			rc.Servers = append(rc.Servers, f[1])
		case "search":
			rc.Searches = []string{}
			for _, s := range f[1:] {
				if s != "." {
					rc.Searches = append(rc.Searches, strings.TrimSuffix(s, "."))
				}
			}
		case "options":
			rc.Options = mergeOptions(rc.Options, f[1:])
		}
	}
	return rc, nil
}

// mergeOptions adds options to have, one of the same name (before ':')
// replacing the one it had in place.
func mergeOptions(have, add []string) []string {
	out := slices.Clone(have)
	for _, o := range add {
		name, _, _ := strings.Cut(o, ":")
		i := slices.IndexFunc(out, func(h string) bool { n, _, _ := strings.Cut(h, ":"); return n == name })
		if i >= 0 {
			out[i] = o
		} else {
			out = append(out, o)
		}
	}
	return out
}

// podResolverConfig is the resolv.conf kubelet gives pod (its dnsPolicy
// and dnsConfig), given the node's.
func podResolverConfig(pod *corev1.Pod, dns DNS, node resolverConfig) resolverConfig {
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst // the API server's default
	}
	cluster := false
	switch policy {
	case corev1.DNSClusterFirstWithHostNet:
		cluster = true
	case corev1.DNSClusterFirst:
		// A host-network pod asks for the node's resolver unless it says
		// ClusterFirstWithHostNet.
		cluster = !pod.Spec.HostNetwork
	}
	var rc resolverConfig
	switch {
	case policy == corev1.DNSNone:
	case cluster && len(dns.Servers) > 0:
		for _, s := range dns.Servers {
			rc.Servers = append(rc.Servers, s.String())
		}
		d := dns.domain()
		rc.Searches = dedupe(append([]string{pod.Namespace + ".svc." + d, "svc." + d, d}, node.Searches...))
		rc.Options = []string{"ndots:5"}
	default:
		// Default; or ClusterFirst with no cluster DNS, where kubelet
		// falls back to it (and warns).
		rc = resolverConfig{Servers: slices.Clone(node.Servers), Searches: slices.Clone(node.Searches), Options: slices.Clone(node.Options)}
	}
	if c := pod.Spec.DNSConfig; c != nil {
		rc.Servers = dedupe(append(rc.Servers, c.Nameservers...))
		rc.Searches = dedupe(append(rc.Searches, c.Searches...))
		var add []string
		for _, o := range c.Options {
			if o.Value != nil && *o.Value != "" {
				add = append(add, o.Name+":"+*o.Value)
			} else {
				add = append(add, o.Name)
			}
		}
		rc.Options = mergeOptions(rc.Options, add)
	}
	return rc.fitLimits()
}

// fitLimits cuts the nameservers and the search list to what kubelet
// passes on (the API server refuses a dnsConfig past them; the node's
// resolv.conf may hold more).
func (rc resolverConfig) fitLimits() resolverConfig {
	if len(rc.Servers) > maxDNSNameservers {
		rc.Servers = rc.Servers[:maxDNSNameservers]
	}
	if len(rc.Searches) > maxDNSSearchPaths {
		rc.Searches = rc.Searches[:maxDNSSearchPaths]
	}
	for len(strings.Join(rc.Searches, " ")) > maxDNSSearchListChars {
		rc.Searches = rc.Searches[:len(rc.Searches)-1]
	}
	return rc
}

func dedupe(list []string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// String is the file, as containerd writes it from kubelet's DNSConfig.
func (rc resolverConfig) String() string {
	var b strings.Builder
	if len(rc.Searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(rc.Searches, " "))
	}
	for _, s := range rc.Servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(rc.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(rc.Options, " "))
	}
	return b.String()
}

// podResolvConf is the pod's /etc/resolv.conf.
func podResolvConf(pod *corev1.Pod, dns DNS) (string, error) {
	var node resolverConfig
	data, err := os.ReadFile(dns.resolvConfPath())
	switch {
	case err == nil:
		if node, err = parseResolvConf(string(data)); err != nil {
			return "", fmt.Errorf("%s: %w", dns.resolvConfPath(), err)
		}
	case !os.IsNotExist(err):
		return "", fmt.Errorf("reading the node's resolv.conf: %w", err)
	}
	return podResolverConfig(pod, dns, node).String(), nil
}

// podHosts is the pod's /etc/hosts as kubelet writes it: localhost, the
// pod's address under its host name (and its fully qualified name when it
// has a subdomain), then its hostAliases; a host-network pod gets the
// node's file with its hostAliases.
func podHosts(pod *corev1.Pod, podIP string, dns DNS, nodeHosts string) string {
	var b strings.Builder
	if pod.Spec.HostNetwork {
		b.WriteString("# Kubernetes-managed hosts file (host network).\n")
		b.WriteString(nodeHosts)
	} else {
		b.WriteString("# Kubernetes-managed hosts file.\n")
		b.WriteString("127.0.0.1\tlocalhost\n")
		b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
		b.WriteString("fe00::0\tip6-localnet\n")
		b.WriteString("fe00::0\tip6-mcastprefix\n")
		b.WriteString("fe00::1\tip6-allnodes\n")
		b.WriteString("fe00::2\tip6-allrouters\n")
		host := podHostname(pod)
		if podIP != "" {
			if sub := pod.Spec.Subdomain; sub != "" {
				fmt.Fprintf(&b, "%s\t%s.%s.%s.svc.%s\t%s\n", podIP, host, sub, pod.Namespace, dns.domain(), host)
			} else {
				fmt.Fprintf(&b, "%s\t%s\n", podIP, host)
			}
		}
	}
	if len(pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			for _, h := range a.Hostnames {
				fmt.Fprintf(&b, "%s\t%s\n", a.IP, h)
			}
		}
	}
	return b.String()
}
