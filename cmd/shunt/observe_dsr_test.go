package main

import (
	"strings"
	"testing"

	"github.com/shuntnet/shunt/internal/flows"
)

// A flow the ingress node sent by DSR says so in observe's text.
func TestSummaryNamesDSR(t *testing.T) {
	got := summary(flows.Flow{Reason: "dsr-encap", Service: &flows.Service{Name: "default/web", IP: "192.168.123.1", Port: 30080, Kind: "nodeport"}})
	if !strings.Contains(got, "DSR") || !strings.Contains(got, "(nodeport)") {
		t.Errorf("summary %q: want DSR named beside the NodePort", got)
	}
	if got := summary(flows.Flow{Reason: "forwarded"}); strings.Contains(got, "DSR") {
		t.Errorf("summary of a forwarded flow %q names DSR", got)
	}
}
