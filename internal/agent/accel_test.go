package agent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/datapath"
)

// The kernel's reason, as datapath.AccelKernel.NoBackpressure gives it on
// Linux 6.1 (scripts/kernel-vm.sh).
var noBackpressure = datapath.AccelKernel{FIONREADCounts: true}.NoBackpressure()

// TestAccelAtStart: acceleration asked for at start stays off on a kernel
// without backpressure unless the flag accepts ENOMEM, and says what turns
// it on; elsewhere the agent starts with what it was asked.
func TestAccelAtStart(t *testing.T) {
	if noBackpressure == "" {
		t.Fatal("AccelKernel without Backpressure gives no reason")
	}
	on := datapath.AccelConfig{On: true, NodeProcesses: true}
	for _, c := range []struct {
		name    string
		cfg     Config
		unsafe  string
		want    datapath.AccelConfig
		refused bool
	}{
		{"backpressure, asked", Config{SocketAccel: true, AccelNode: true}, "", on, false},
		{"backpressure, not asked", Config{}, "", datapath.AccelConfig{}, false},
		{"none, asked", Config{SocketAccel: true, AccelNode: true}, noBackpressure, datapath.AccelConfig{}, true},
		{"none, asked, accepted", Config{SocketAccel: true, AccelNode: true, AccelWithoutBackpressure: true}, noBackpressure, on, false},
		{"none, not asked", Config{AccelWithoutBackpressure: true}, noBackpressure, datapath.AccelConfig{}, false},
	} {
		got, refused := accelAtStart(c.cfg, c.unsafe)
		if got != c.want || (refused != "") != c.refused {
			t.Errorf("%s: %+v refused %q, want %+v refused %v", c.name, got, refused, c.want, c.refused)
		}
		if refused != "" && (!strings.Contains(refused, "ENOMEM") || !strings.Contains(refused, "--accelerate-without-backpressure")) {
			t.Errorf("%s: %q does not say what happens and what turns it on", c.name, refused)
		}
	}
}

// TestAccelOnRefused: `shunt accel on` on a kernel without backpressure is
// refused with 409, the reason and the flag that accepts it, before the
// datapath is touched (this Agent has none).
func TestAccelOnRefused(t *testing.T) {
	a := &Agent{accelUnsafe: noBackpressure}
	for _, q := range []string{"on=true", "on=true&nodeProcesses=true", "on=true&withoutBackpressure=false"} {
		rec := httptest.NewRecorder()
		a.handleAccel(rec, httptest.NewRequest(http.MethodPost, "/v1/accel?"+q, nil))
		body := rec.Body.String()
		if rec.Code != http.StatusConflict || !strings.Contains(body, "msg_tot_len") || !strings.Contains(body, "--without-backpressure") {
			t.Errorf("%s: %d %s, want 409 with the reason and --without-backpressure", q, rec.Code, body)
		}
	}
}
