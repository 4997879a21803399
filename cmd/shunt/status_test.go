package main

import (
	"testing"

	"github.com/shuntnet/shunt/internal/api"
)

// TestServicesLine: the status's services line names the NodePort mode
// when the node serves clients from outside, and only then.
func TestServicesLine(t *testing.T) {
	for _, c := range []struct {
		mode, want string
	}{
		{"", "10.96.0.0/12"},
		{"snat", "10.96.0.0/12; NodePorts from outside: snat (replies back through this node)"},
		{"dsr", "10.96.0.0/12; NodePorts from outside: dsr (replies straight from the backend's node)"},
		{"hybrid", "10.96.0.0/12; NodePorts from outside: hybrid (DSR for TCP, SNAT for UDP)"},
		{"future", "10.96.0.0/12; NodePorts from outside: future"},
	} {
		if got := servicesLine(api.Status{ServiceCIDR: "10.96.0.0/12", NodePortMode: c.mode}); got != c.want {
			t.Errorf("mode %q: %q, want %q", c.mode, got, c.want)
		}
	}
}
