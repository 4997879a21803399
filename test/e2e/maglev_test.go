package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMaglevLab: a lab of two nodes, four backends (two on each), reached
// from the external host. The same client tuple picks the same backend
// whichever node it enters: the NodePort on node-1 and on node-2, and the
// load balancer address before and after its route moves from node-1 to
// node-2 (a new connection of the same tuple each time: an established
// one does not survive the move without DSR, as the backend saw another
// source). Both nodes hold byte-identical tables (`map dump`'s digest),
// each backend a quarter of them.
func TestMaglevLab(t *testing.T) {
	l := newLabNodes(t, 2, []string{"--routing", "native", "--lb-pool", "192.168.124.0/28"}, "testdata/maglev.yaml")
	node1, node2 := "192.168.123.1", "192.168.123.2"
	lbIP := loadBalancerAddress(t, l, "web")
	if lbIP == "" {
		t.Fatal("Service web has no load balancer address")
	}

	// get asks the backend's name through url from the source port.
	get := func(url string, port int) func() (string, string) {
		return func() (string, string) {
			out, code := l.shunt("lab", "exec", "--external", "--", filepath.Join(binDir, "shunt"), "lab", "http-get",
				"--timeout", "2s", "--source-port", fmt.Sprint(port), url)
			status, body, _ := strings.Cut(out, "\n")
			if code != 0 || status != "200" {
				return "", out
			}
			return strings.TrimSpace(body), ""
		}
	}
	// The agents program the four backends a moment after `lab up`.
	for _, node := range []string{node1, node2} {
		eventually(t, "the tables of "+node+" name four backends", "4", func() (string, string) {
			tables := mapDump(t, l, node)
			if len(tables) == 0 {
				return "0", "no table"
			}
			return fmt.Sprint(strings.Count(tables[0]["backends"].(string), "%")), fmt.Sprint(tables)
		})
	}

	seen := map[string]int{}
	for port := 41000; port < 41016; port++ {
		first, detail := get(fmt.Sprintf("http://%s:30080/", node1), port)()
		if first == "" {
			t.Fatalf("NodePort on node-1 from port %d: %s", port, detail)
		}
		second, detail := get(fmt.Sprintf("http://%s:30080/", node2), port)()
		if second != first {
			t.Errorf("client port %d: %s through node-1, %q through node-2 (%s); want the same backend", port, first, second, detail)
		}
		seen[first]++
	}
	t.Logf("16 client ports through both nodes: %v", seen)
	if len(seen) < 2 {
		t.Errorf("16 client ports all went to %v: want them spread over the four backends", seen)
	}

	// The load balancer address: through node-1, then the route moves to
	// node-2 and the same tuples connect again (TIME_WAIT tuples reused
	// a second later: tcp_tw_reuse in the external host's namespace).
	l.mustShunt("lab", "exec", "--external", "--", "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1")
	before := map[int]string{}
	for port := 42000; port < 42008; port++ {
		if before[port], _ = get(fmt.Sprintf("http://%s:8000/", lbIP), port)(); before[port] == "" {
			t.Fatalf("load balancer address through node-1 from port %d: no answer", port)
		}
	}
	l.mustShunt("lab", "exec", "--external", "--", "ip", "route", "replace", lbIP, "via", node2)
	time.Sleep(1100 * time.Millisecond)
	for port := 42000; port < 42008; port++ {
		if after, detail := get(fmt.Sprintf("http://%s:8000/", lbIP), port)(); after != before[port] {
			t.Errorf("client port %d: %s through node-1, %q through node-2 (%s); want the same backend", port, before[port], after, detail)
		}
	}
	// Node-2's own flows name it as the ingress node of the load balancer
	// address.
	eventually(t, "node-2's flows naming the load balancer frontend", "yes", func() (string, string) {
		flows := l.mustShunt("observe", "--node", "node-2", "--last", "2000", "-o", "json")
		if strings.Contains(flows, `"kind":"lb"`) && strings.Contains(flows, `"node":"node-2"`) {
			return "yes", ""
		}
		return "no", fmt.Sprintf("%d lines", strings.Count(flows, "\n"))
	})

	// Both nodes hold the same tables.
	t1, t2 := mapDump(t, l, node1), mapDump(t, l, node2)
	digests := func(rows []map[string]any) map[string]string {
		out := map[string]string{}
		for _, r := range rows {
			if f, ok := r["frontend"].(string); ok && strings.HasPrefix(f, lbIP) {
				out["lb"] = r["digest"].(string)
			}
			if f, ok := r["frontend"].(string); ok && strings.HasSuffix(f, ":30080/TCP") {
				out["nodeport"] = r["digest"].(string)
			}
		}
		return out
	}
	d1, d2 := digests(t1), digests(t2)
	if d1["lb"] == "" || d1["lb"] != d2["lb"] || d1["nodeport"] != d1["lb"] || d2["nodeport"] != d2["lb"] {
		t.Errorf("table digests node-1 %v, node-2 %v: want one table, the same on both nodes\n%v\n%v", d1, d2, t1, t2)
	}
	for _, r := range t1 {
		if b := r["backends"].(string); strings.Count(b, "25.0%") != 4 {
			t.Errorf("node-1's table of %v: %s, want four backends of 25.0%% each", r["frontend"], b)
		}
	}
}

// mapDump is shunt_maglev's rows on the node whose underlay address is
// node.
func mapDump(t *testing.T, l *lab, node string) []map[string]any {
	t.Helper()
	nl := l
	if node != "192.168.123.1" {
		nl = l.node(2)
	}
	out := nl.mustShunt("map", "dump", "shunt_maglev", "-o", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("map dump shunt_maglev -o json: %v\n%s", err, out)
	}
	return rows
}
