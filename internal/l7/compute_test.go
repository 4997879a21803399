package l7

import (
	"strings"
	"testing"
)

func TestParseInboundRedirect(t *testing.T) {
	got, err := ParseInboundRedirect("8080:15006, 9090:15007")
	if err != nil || len(got) != 2 || got[0] != [2]uint16{8080, 15006} || got[1] != [2]uint16{9090, 15007} {
		t.Errorf("good value: %v, %v", got, err)
	}
	for bad, want := range map[string]string{
		"8080":       "want PORT:PROXYPORT",
		"8080:8080":  "loop",
		"0:15006":    "not a port",
		"8080:70000": "not a port",
		"80:1,80:2":  "twice",
		"http:15006": "not a port",
	} {
		if _, err := ParseInboundRedirect(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", bad, err, want)
		}
	}
}
