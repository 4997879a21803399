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

// Events a packet's direction could mislead on say what they are: an
// answer picked up after a lost entry, an ICMP error about a connection.
func TestSummaryNamesAnswersAndICMPErrors(t *testing.T) {
	for _, c := range []struct {
		fl   flows.Flow
		want string
	}{
		{flows.Flow{Event: "answer", TCPFlags: "ACK"}, "connection recorded again from its answer (opened by the destination), ACK"},
		{flows.Flow{Event: "icmp-error", ICMPError: "port-unreachable"}, "ICMP error port-unreachable about a tracked connection"},
		{flows.Flow{Event: "icmp-error"}, "ICMP error about a tracked connection"},
		{flows.Flow{Event: "http", Reason: flows.ReasonMirrored, HTTP: &flows.HTTP{Method: "GET", Path: "/a", Protocol: "HTTP/1.1", Status: 200,
			Route: "default/r", BackendPod: "default/shadow"}},
			"a copy (RequestMirror), its answer thrown away, GET /a HTTP/1.1 -> 200 in 0s, route default/r, backend default/shadow"},
	} {
		if got := summary(c.fl); got != c.want {
			t.Errorf("summary(%+v) = %q, want %q", c.fl, got, c.want)
		}
	}
}
