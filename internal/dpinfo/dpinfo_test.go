package dpinfo

import (
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{ReasonForwarded.String(), "forwarded"},
		{ReasonCTFull.String(), "ct-full"},
		{ReasonProxyIdentity.String(), "proxy-identity"},
		{ReasonAccelCongested.String(), "accel-congested"},
		{ReasonNodePortReply.String(), "nodeport-reply"},
		{ReasonLBSourceDenied.String(), "lb-source-denied"},
		{ReasonProxySteered.String(), "proxy-steered"},
		{ReasonProxySteerFailed.String(), "proxy-steer-failed"},
		{ReasonDSRTooBig.String(), "dsr-too-big"},
		{ReasonDSRGSODecap.String(), "dsr-gso-decap"},
		{ReasonProxyUpstreamReply.String(), "proxy-upstream-reply"},
		{ReasonDSRUnknownNode.String(), "dsr-unknown-node"},
		{ReasonNATEntryLost.String(), "nat-entry-lost"},
		{ReasonNodePortEntryMissing.String(), "nodeport-entry-missing"},
		{ReasonAccelUntracked.String(), "accel-untracked"},
		{ReasonIdentityCarried.String(), "identity-carried"},
		{ReasonMax.String(), "59"},
		{DirFromPod.String(), "from-pod"},
		{DirToOverlay.String(), "to-overlay"},
		{DirMax.String(), "12"},
		{ProtoName(6), "TCP"},
		{ProtoName(0), "any"},
		{ProtoName(99), "99"},
	} {
		if c.got != c.want {
			t.Errorf("name %q, want %q", c.got, c.want)
		}
	}
	seen := map[string]Reason{}
	for r := range ReasonMax {
		if other, dup := seen[r.String()]; dup {
			t.Errorf("reasons %d and %d are both %q", other, r, r.String())
		}
		seen[r.String()] = r
	}
}

func TestInsertFailed(t *testing.T) {
	for reason, want := range map[string]bool{"ct-full": true, "masq-insert-failed": true, "ct-promote-failed": true,
		"forwarded": false, "policy-denied": false, "": false, "no-such-reason": false} {
		if InsertFailed(reason) != want {
			t.Errorf("InsertFailed(%q) = %v, want %v", reason, !want, want)
		}
	}
}

func TestSocketHook(t *testing.T) {
	for dir, want := range map[string]bool{"connect": true, "sendmsg": true, "recvmsg": true, "getpeername": true,
		"getsockopt": true, "sockmsg": true, "from-pod": false, "to-pod": false, "from-overlay": false,
		"to-overlay": false, "to-uplink": false, "from-uplink": false} {
		if got := (Counter{Direction: dir}).SocketHook(); got != want {
			t.Errorf("direction %s: socket hook %v, want %v", dir, got, want)
		}
	}
}

func TestMapPressure(t *testing.T) {
	for _, c := range []struct {
		m    MapInfo
		want string
	}{
		{MapInfo{Name: "shunt_ct", Type: "LRUHash", Entries: 95, Capacity: 100, WhenFull: "x"}, "map shunt_ct is 95% full (95 of 100): x"},
		{MapInfo{Name: "shunt_ct", Type: "LRUHash", Entries: 89, Capacity: 100}, ""},
		{MapInfo{Name: "shunt_metrics", Type: TypePerCPUArray, Entries: 512, Capacity: 512}, ""},
		{MapInfo{Name: "shunt_flows", Type: "RingBuf", Entries: -1, Capacity: 4096}, ""},
	} {
		if got := c.m.Pressure(); got != c.want {
			t.Errorf("%+v: pressure %q, want %q", c.m, got, c.want)
		}
	}
}

// TestPortRange: what --masquerade-ports accepts, and the overlap check.
func TestPortRange(t *testing.T) {
	for s, ok := range map[string]bool{"61000-65535": true, "1-1": true, "0-10": false, "10-1": false, "x": false, "1-70000": false} {
		if _, err := ParsePortRange(s); (err == nil) != ok {
			t.Errorf("ParsePortRange(%q): %v, want ok %v", s, err, ok)
		}
	}
	if !(PortRange{32768, 60999}).Overlaps(PortRange{60999, 61000}) || DefaultMasqPorts.Overlaps(PortRange{32768, 60999}) {
		t.Error("Overlaps is wrong at the edges")
	}
}

func TestDifferingByMap(t *testing.T) {
	r := DriftReport{Entries: []DriftEntry{{Map: "shunt_services"}, {Map: "shunt_backends"}, {Map: "shunt_services"}}}
	got := strings.Join(r.DifferingByMap(), ", ")
	if want := "shunt_backends 1, shunt_services 2"; got != want {
		t.Fatalf("DifferingByMap = %q, want %q", got, want)
	}
	if (DriftReport{}).Differs() || !r.Differs() {
		t.Fatal("Differs: an empty report differs or a full one does not")
	}
}

func TestParseNodePortMode(t *testing.T) {
	for s, want := range map[string]NodePortMode{"": NodePortSNAT, "snat": NodePortSNAT, "dsr": NodePortDSR, "hybrid": NodePortHybrid} {
		if got, err := ParseNodePortMode(s); err != nil || got != want {
			t.Errorf("ParseNodePortMode(%q) = %q, %v; want %q", s, got, err, want)
		}
	}
	if _, err := ParseNodePortMode("DSR"); err == nil || !strings.Contains(err.Error(), "snat, dsr") {
		t.Errorf("ParseNodePortMode(DSR): %v, want refused naming the modes", err)
	}
	if NodePortSNAT.UsesDSR() || !NodePortDSR.UsesDSR() || !NodePortHybrid.UsesDSR() {
		t.Error("UsesDSR wrong")
	}
}

func TestParseForwardingMode(t *testing.T) {
	for s, want := range map[string]NodePortMode{"": "", "snat": NodePortSNAT, "dsr": NodePortDSR} {
		if got, err := ParseForwardingMode(s); err != nil || got != want {
			t.Errorf("ParseForwardingMode(%q) = %q, %v; want %q", s, got, err, want)
		}
	}
	// hybrid is a node's mode only: a Service's flows are one or the other.
	for _, s := range []string{"hybrid", "DSR", " dsr"} {
		if got, err := ParseForwardingMode(s); err == nil || got != "" || !strings.Contains(err.Error(), ForwardingModeAnnotation) {
			t.Errorf("ParseForwardingMode(%q) = %q, %v; want refused naming the annotation", s, got, err)
		}
	}
}
