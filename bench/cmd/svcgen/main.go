// Command svcgen writes the same service table in three forms for the
// services benchmark: a kube-proxy iptables ruleset (iptables-restore
// input), a kube-proxy nftables ruleset (nft -f input) and Kubernetes YAML
// for shunt (Services + EndpointSlices). N filler services with 10 endpoints
// each come first; the measured service comes last, so rule walks pay for
// all N before reaching it.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

type service struct {
	name      string
	vip       netip.Addr
	ports     []int    // service ports
	targets   []int    // target port per service port
	endpoints []string // IPs
}

func main() {
	n := flag.Int("n", 0, "filler services before the measured one")
	format := flag.String("format", "yaml", "iptables, nft or yaml")
	vipBase := flag.String("vip-base", "10.216.0.0", "first address of the service range (a /16)")
	fillerBase := flag.String("filler-base", "10.217.0.0", "first address of the (unreachable) filler endpoints")
	measured := flag.String("measured", "", "comma-separated endpoint IPs of the measured service")
	ports := flag.String("ports", "11111:11111,8080:8080", "measured service ports as port:targetPort")
	update := flag.Bool("update", false, "yaml: only the last filler service's slice, with one endpoint changed")
	flag.Parse()
	if *measured == "" {
		fmt.Fprintln(os.Stderr, "svcgen: -measured IPs required")
		os.Exit(2)
	}
	svcs := table(*n, netip.MustParseAddr(*vipBase), netip.MustParseAddr(*fillerBase), strings.Split(*measured, ","), *ports)
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	defer w.Flush()
	switch *format {
	case "iptables":
		iptables(w, svcs)
	case "nft":
		nft(w, svcs)
	case "yaml":
		if *update {
			if *n == 0 {
				fmt.Fprintln(os.Stderr, "svcgen: -update needs -n > 0")
				os.Exit(2)
			}
			s := svcs[*n-1]
			s.endpoints[0] = "10.218.0.1"
			slice(w, s)
			return
		}
		yaml(w, svcs)
	default:
		fmt.Fprintln(os.Stderr, "svcgen: -format iptables|nft|yaml")
		os.Exit(2)
	}
}

func nth(base netip.Addr, i int) netip.Addr {
	a := base.As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func table(n int, vipBase, fillerBase netip.Addr, measured []string, portSpec string) []service {
	var out []service
	for i := 0; i < n; i++ {
		s := service{name: fmt.Sprintf("filler-%d", i), vip: nth(vipBase, i+2), ports: []int{80}, targets: []int{8080}}
		for j := 0; j < 10; j++ {
			s.endpoints = append(s.endpoints, nth(fillerBase, i*10+j+1).String())
		}
		out = append(out, s)
	}
	m := service{name: "measured", vip: nth(vipBase, n+2), endpoints: measured}
	for _, p := range strings.Split(portSpec, ",") {
		var port, target int
		fmt.Sscanf(p, "%d:%d", &port, &target)
		m.ports, m.targets = append(m.ports, port), append(m.targets, target)
	}
	return append(out, m)
}

// iptables follows kube-proxy's iptables mode: KUBE-SERVICES matches each
// service port, KUBE-SVC-* picks an endpoint with statistic --probability
// 1/k, 1/(k-1), ..., KUBE-SEP-* DNATs.
func iptables(w *bufio.Writer, svcs []service) {
	fmt.Fprintln(w, "*nat")
	fmt.Fprintln(w, ":KUBE-SERVICES - [0:0]")
	var rules []string
	for i, s := range svcs {
		for pi, port := range s.ports {
			svc := fmt.Sprintf("KUBE-SVC-%d-%d", i, pi)
			fmt.Fprintf(w, ":%s - [0:0]\n", svc)
			rules = append(rules, fmt.Sprintf("-A KUBE-SERVICES -d %s/32 -p tcp -m tcp --dport %d -j %s", s.vip, port, svc))
			for j, ep := range s.endpoints {
				sep := fmt.Sprintf("KUBE-SEP-%d-%d-%d", i, pi, j)
				fmt.Fprintf(w, ":%s - [0:0]\n", sep)
				left := len(s.endpoints) - j
				if left > 1 {
					rules = append(rules, fmt.Sprintf("-A %s -m statistic --mode random --probability %.11f -j %s", svc, 1/float64(left), sep))
				} else {
					rules = append(rules, fmt.Sprintf("-A %s -j %s", svc, sep))
				}
				rules = append(rules, fmt.Sprintf("-A %s -p tcp -m tcp -j DNAT --to-destination %s:%d", sep, ep, s.targets[pi]))
			}
		}
	}
	rules = append(rules, "-A OUTPUT -j KUBE-SERVICES")
	for _, r := range rules {
		fmt.Fprintln(w, r)
	}
	fmt.Fprintln(w, "COMMIT")
}

// nft follows kube-proxy's nftables mode: one verdict map on
// daddr . protocol . dport jumps to a per-service chain that picks an
// endpoint with numgen and DNATs in its endpoint chain.
func nft(w *bufio.Writer, svcs []service) {
	fmt.Fprintln(w, "table ip shunt-bench-kube-proxy {")
	var elems []string
	for i, s := range svcs {
		for pi, port := range s.ports {
			svc := fmt.Sprintf("svc-%d-%d", i, pi)
			elems = append(elems, fmt.Sprintf("%s . tcp . %d : goto %s", s.vip, port, svc))
			var vm []string
			for j, ep := range s.endpoints {
				sep := fmt.Sprintf("sep-%d-%d-%d", i, pi, j)
				fmt.Fprintf(w, "  chain %s { meta l4proto tcp dnat to %s:%d; }\n", sep, ep, s.targets[pi])
				vm = append(vm, fmt.Sprintf("%d : goto %s", j, sep))
			}
			fmt.Fprintf(w, "  chain %s { numgen random mod %d vmap { %s }; }\n", svc, len(s.endpoints), strings.Join(vm, ", "))
		}
	}
	fmt.Fprintln(w, "  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict;")
	fmt.Fprintf(w, "    elements = { %s }; }\n", strings.Join(elems, ",\n      "))
	fmt.Fprintln(w, "  chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }")
	fmt.Fprintln(w, "  chain output { type nat hook output priority -100; policy accept; jump services; }")
	fmt.Fprintln(w, "}")
}

// yaml writes selector-less Services with fixed ClusterIPs and their
// EndpointSlices, the form a cluster's API would hand shunt.
func yaml(w *bufio.Writer, svcs []service) {
	for _, s := range svcs {
		fmt.Fprintf(w, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s}\nspec:\n  clusterIP: %s\n  ports:\n", s.name, s.vip)
		for pi, port := range s.ports {
			fmt.Fprintf(w, "  - {name: p%d, port: %d, targetPort: %d}\n", pi, port, s.targets[pi])
		}
		slice(w, s)
	}
}

func slice(w *bufio.Writer, s service) {
	fmt.Fprintf(w, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-1\n  labels: {kubernetes.io/service-name: %s}\naddressType: IPv4\nports:\n", s.name, s.name)
	for pi := range s.ports {
		fmt.Fprintf(w, "- {name: p%d, port: %d}\n", pi, s.targets[pi])
	}
	fmt.Fprintln(w, "endpoints:")
	for _, ep := range s.endpoints {
		fmt.Fprintf(w, "- addresses: [%s]\n", ep)
	}
}
