package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestForwardingModeLab: on a lab of two nodes with native routing and
// the node-wide --nodeport-mode snat (the default), two NodePort Services
// of the same backends on node-2, entered through node-1 from the
// external host: the one annotated shunt.io/forwarding-mode: dsr goes by
// DSR (the backend sees the client's address; during a 4 MB download
// node-1's uplink sends little more than the client's ACKs, node-2's the
// 4 MB), the other by SNAT (the backend sees node-1's address; node-1's
// uplink carries the download). The lab refuses a value other than snat
// or dsr, naming file, object and field.
func TestForwardingModeLab(t *testing.T) {
	l := newLabNodes(t, 2, []string{"--routing", "native"}, "testdata/fwdmode.yaml")
	ext := labExternal(t, l)
	node1, node2 := "192.168.123.1", "192.168.123.2"
	ns1, ns2 := l.instance+"-node1", l.instance+"-node2"
	if out := l.mustShunt("status", "--node", "node-1"); !strings.Contains(out, "NodePorts from outside: snat") {
		t.Errorf("status of node-1 does not name its NodePort mode (snat, the default):\n%s", out)
	}
	node1PodNet := strings.TrimSuffix(l.node(1).status().PodCIDR, "0/24") + "1"
	eventually(t, "the SNAT Service through node-1: the backend sees node-1", node1PodNet, remoteFromOutside(l, fmt.Sprintf("http://%s:30080/remote", node1)))
	eventually(t, "the DSR Service through node-1: the backend sees the client", ext.addr, remoteFromOutside(l, fmt.Sprintf("http://%s:30081/remote", node1)))

	// download is what node-1's and node-2's uplinks sent during a 4 MB
	// download (iperf3 -R: the server on node-2 sends) through node-1's
	// nodePort.
	const size = 4 << 20
	download := func(nodePort int) (tx1, tx2 uint64) {
		t.Helper()
		b1, b2 := uplinkBytes(t, ns1, node1).TX.Bytes, uplinkBytes(t, ns2, node2).TX.Bytes
		var out string
		var code int
		for i := 0; i < 20; i++ { // iperf3 needs a moment to listen, and takes one test at a time
			out, code = l.shunt("lab", "exec", "--external", "--", "iperf3", "-c", node1, "-p", fmt.Sprint(nodePort), "-R", "-n", fmt.Sprint(size))
			if code == 0 {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if code != 0 {
			t.Fatalf("iperf3 -R through node-1's nodePort %d: %s", nodePort, out)
		}
		return uplinkBytes(t, ns1, node1).TX.Bytes - b1, uplinkBytes(t, ns2, node2).TX.Bytes - b2
	}
	encapBefore := l.metric("shunt_datapath_packets_total", `reason="dsr-encap"`)
	d1, d2 := download(30202)
	t.Logf("DSR Service: a %d-byte download through node-1: node-1's uplink sent %d bytes, node-2's %d", size, d1, d2)
	if d1 > size/4 || d2 < size {
		t.Errorf("DSR Service: node-1's uplink sent %d bytes and node-2's %d during a %d-byte download entering through node-1: "+
			"want the download to leave from node-2, node-1 sending little more than ACKs", d1, d2, size)
	}
	if n := l.metric("shunt_datapath_packets_total", `reason="dsr-encap"`); n <= encapBefore {
		t.Error("node-1 counted no dsr-encap for the DSR Service's flow")
	}
	s1, s2 := download(30201)
	t.Logf("SNAT Service: a %d-byte download through node-1: node-1's uplink sent %d bytes, node-2's %d", size, s1, s2)
	if s1 < size {
		t.Errorf("SNAT Service: node-1's uplink sent %d bytes during a %d-byte download entering through node-1: want all of it (the replies come back through node-1)", s1, size)
	}
	var snatReply, dsrEntry bool
	for _, r := range nodePortNAT(t, l) {
		snatReply = snatReply || (r["direction"] == "reply" && r["protocol"] == "TCP")
		dsrEntry = dsrEntry || r["direction"] == "to-backend-dsr"
	}
	if !snatReply || !dsrEntry {
		t.Errorf("node-1's shunt_nodeport_nat: a TCP reply entry %v (the SNAT Service's), a DSR entry %v (the DSR Service's); want both", snatReply, dsrEntry)
	}

	// A value shunt does not know: refused whole, with file, object and
	// field.
	bad := filepath.Join(t.TempDir(), "hybrid.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: odd, annotations: {shunt.io/forwarding-mode: hybrid}}\n"+
		"spec: {type: NodePort, selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "hybrid.yaml#1: Service default/odd: metadata.annotations[shunt.io/forwarding-mode]: annotation shunt.io/forwarding-mode: \"hybrid\": give snat or dsr"
	if out, code := l.shunt("apply", "-f", bad); code == 0 || !strings.Contains(out, want) {
		t.Errorf("apply of a Service with forwarding mode hybrid: exit %d:\n%s\nwant it refused: %q", code, out, want)
	}
}

// TestForwardingModeOverlayLab: with the VXLAN overlay a Service annotated
// shunt.io/forwarding-mode: dsr goes by DSR too (IPIP over the underlay,
// beside the overlay): the backend on node-2 sees the client's own address
// through node-1's nodePort, node-1 counts dsr-encap, and `shunt status`
// names no fallback.
func TestForwardingModeOverlayLab(t *testing.T) {
	l := newLabNodes(t, 2, []string{"--routing", "tunnel"}, "testdata/fwdmode.yaml")
	ext := labExternal(t, l)
	node1 := "192.168.123.1"
	encapBefore := l.metric("shunt_datapath_packets_total", `reason="dsr-encap"`)
	eventually(t, "the DSR Service through node-1 with the overlay: the backend sees the client", ext.addr,
		remoteFromOutside(l, fmt.Sprintf("http://%s:30081/remote", node1)))
	if n := l.metric("shunt_datapath_packets_total", `reason="dsr-encap"`); n <= encapBefore {
		t.Error("node-1 counted no dsr-encap for the DSR Service's flow with the overlay")
	}
	if out := l.mustShunt("status", "--node", "node-1"); strings.Contains(out, "forwarding-mode") {
		t.Errorf("status of node-1 names a forwarding-mode problem with the overlay, where DSR works:\n%s", out)
	}
}
