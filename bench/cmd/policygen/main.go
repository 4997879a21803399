// Command policygen writes the same ingress policy in two forms for the
// policy benchmark: a Kubernetes NetworkPolicy for shunt (YAML) and an
// iptables ruleset (iptables-restore input, filter table) in the style of
// iptables-based CNIs, meant for the server pod's own network namespace.
//
// The policy selects app=server and allows TCP 11111 and 8080 from R filler
// peers (distinct /32s in 172.20.0.0/16, none of them the client) and, last,
// from the client (podSelector app=client in YAML, its /32 in iptables), so
// rule walks pay for all R before reaching the measured peer.
//
//	policygen -r R -format yaml|iptables -client CLIENT_IP [-server-chain NAME]
//
// The iptables form accepts RELATED,ESTABLISHED first, then INPUT jumps to
// the per-pod chain: one rule per (peer, port), the client's last, then DROP.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net/netip"
	"os"
)

var ports = []int{11111, 8080}

func main() {
	r := flag.Int("r", 0, "filler ingress rules before the client's")
	format := flag.String("format", "yaml", "yaml or iptables")
	client := flag.String("client", "", "the client pod's IP (iptables; yaml fillers avoid it too)")
	chain := flag.String("server-chain", "SHUNT-BENCH-POD-server", "iptables: the per-pod chain's name")
	flag.Parse()
	if *r < 0 || *r > 65000 {
		fail("-r must be between 0 and 65000")
	}
	var clientIP netip.Addr
	if *client != "" {
		a, err := netip.ParseAddr(*client)
		if err != nil || !a.Is4() {
			fail("-client: not an IPv4 address: " + *client)
		}
		clientIP = a
	} else if *format == "iptables" {
		fail("-client IP required for -format iptables")
	}
	fillers := fillerIPs(*r, clientIP)
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	defer w.Flush()
	switch *format {
	case "yaml":
		yaml(w, fillers)
	case "iptables":
		iptables(w, fillers, clientIP, *chain)
	default:
		fail("-format yaml|iptables")
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "policygen:", msg)
	os.Exit(2)
}

// fillerIPs returns r distinct addresses from 172.20.0.1 on, skipping the
// client's.
func fillerIPs(r int, client netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, r)
	for a := netip.AddrFrom4([4]byte{172, 20, 0, 1}); len(out) < r; a = a.Next() {
		if a != client {
			out = append(out, a)
		}
	}
	return out
}

// yaml writes one NetworkPolicy, bench-ingress, with one ingress rule per
// filler and the client's rule last.
func yaml(w *bufio.Writer, fillers []netip.Addr) {
	fmt.Fprint(w, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: bench-ingress, namespace: default}\nspec:\n")
	fmt.Fprint(w, "  podSelector: {matchLabels: {app: server}}\n  policyTypes: [Ingress]\n  ingress:\n")
	portList := ""
	for i, p := range ports {
		if i > 0 {
			portList += ", "
		}
		portList += fmt.Sprintf("{protocol: TCP, port: %d}", p)
	}
	for _, a := range fillers {
		fmt.Fprintf(w, "  - from: [{ipBlock: {cidr: %s/32}}]\n    ports: [%s]\n", a, portList)
	}
	fmt.Fprintf(w, "  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [%s]\n", portList)
}

// iptables writes the filter table as an iptables CNI lays out a pod's
// ingress: established traffic first, then the pod's chain, walked rule by
// rule for every new connection.
func iptables(w *bufio.Writer, fillers []netip.Addr, client netip.Addr, chain string) {
	fmt.Fprintln(w, "*filter")
	fmt.Fprintln(w, ":INPUT ACCEPT [0:0]")
	fmt.Fprintln(w, ":FORWARD ACCEPT [0:0]")
	fmt.Fprintln(w, ":OUTPUT ACCEPT [0:0]")
	fmt.Fprintf(w, ":%s - [0:0]\n", chain)
	fmt.Fprintln(w, "-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
	fmt.Fprintf(w, "-A INPUT -j %s\n", chain)
	for _, a := range append(fillers, client) {
		for _, p := range ports {
			fmt.Fprintf(w, "-A %s -s %s/32 -p tcp -m tcp --dport %d -j ACCEPT\n", chain, a, p)
		}
	}
	fmt.Fprintf(w, "-A %s -j DROP\n", chain)
	fmt.Fprintln(w, "COMMIT")
}
