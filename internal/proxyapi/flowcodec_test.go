package proxyapi

import (
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

func TestFlowBatchesRoundTrip(t *testing.T) {
	full := flows.Flow{
		Time: time.Unix(1700000000, 123456789), Node: "n1", Verdict: "DROPPED", DropReason: "policy-denied", Reason: "policy-denied",
		Event: "http", Point: "proxy", Protocol: "HTTP", TCPFlags: "SYN", ICMPError: "port-unreachable", Interface: "eth0", Policy: "rule", RuleID: 7, Length: 60,
		Bytes: 1 << 40, Messages: 3,
		Source:      flows.Endpoint{Pod: "default/a", Namespace: "default", IP: "10.0.0.1", Port: 40000, Identity: 1001, Labels: []string{"app=a", "x=y"}},
		Destination: flows.Endpoint{IP: "10.0.0.2", Port: 80, Labels: []string{}},
		Service:     &flows.Service{Name: "default/web:80", IP: "10.96.0.1", Port: 80},
		HTTP: &flows.HTTP{Method: "GET", Path: "/" + strings.Repeat("p", 300), Host: "web", Protocol: "HTTP/1.1", Status: 403,
			LatencyMicros: 1234, Route: "default/web", Backend: "10.0.0.2:80", BackendPod: "default/b", Error: "no rule allows GET /"},
	}
	bare := flows.Flow{Time: time.Unix(0, 1), Verdict: "FORWARDED"}
	var buf bytes.Buffer
	enc := NewFlowEncoder(&buf)
	batches := [][]flows.Flow{{full, bare}, {full}, {}, {bare, full, full}}
	for _, b := range batches {
		if err := enc.Encode(b); err != nil {
			t.Fatal(err)
		}
	}
	dec := NewFlowDecoder(&buf)
	for i, want := range batches {
		var got []flows.Flow
		if err := dec.Decode(func(f flows.Flow) { got = append(got, f) }); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if len(got) != len(want) {
			t.Fatalf("batch %d: %d records, want %d", i, len(got), len(want))
		}
		for j := range want {
			if !reflect.DeepEqual(got[j], want[j]) {
				t.Errorf("batch %d record %d:\n got %+v\nwant %+v", i, j, got[j], want[j])
			}
		}
	}
	if err := dec.Decode(func(flows.Flow) {}); err != io.EOF {
		t.Errorf("after the last batch: %v, want EOF", err)
	}
	// Later batches mostly refer to the dictionary.
	short := full
	short.HTTP = &flows.HTTP{Method: "GET", Path: "/reviews/1", Protocol: "HTTP/1.1", Status: 200, Route: "default/web", Backend: "10.0.0.2:80"}
	var one, two bytes.Buffer
	e := NewFlowEncoder(&one)
	e.Encode([]flows.Flow{short})
	e.w = &two
	e.Encode([]flows.Flow{short})
	if two.Len()*3 > one.Len() {
		t.Errorf("a repeated record takes %d bytes, the first %d: the dictionary does not work", two.Len(), one.Len())
	}
}

// FuzzDecodeFlowBatch: a malformed stream is an error, never a panic.
func FuzzDecodeFlowBatch(f *testing.F) {
	var buf bytes.Buffer
	NewFlowEncoder(&buf).Encode([]flows.Flow{{Verdict: "FORWARDED", HTTP: &flows.HTTP{Method: "GET"}, Service: &flows.Service{}}})
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		dec := NewFlowDecoder(bytes.NewReader(data))
		for dec.Decode(func(flows.Flow) {}) == nil {
		}
	})
}
