package ui

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

var t0 = time.Date(2026, 11, 27, 2, 0, 0, 0, time.UTC)

func pod(ns, name string, labels ...string) flows.Endpoint {
	return flows.Endpoint{Pod: ns + "/" + name, Namespace: ns, IP: "10.0.0.1", Labels: labels}
}

func edgeByID(t *testing.T, s Snapshot, id string) Edge {
	t.Helper()
	for _, e := range s.Edges {
		if e.ID == id {
			return e
		}
	}
	var ids []string
	for _, e := range s.Edges {
		ids = append(ids, e.ID)
	}
	t.Fatalf("no edge %q; edges: %q", id, ids)
	return Edge{}
}

func TestAggregateServiceSplitAndVerdicts(t *testing.T) {
	a := NewAggregate(Limits{})
	frontend := pod("shop", "frontend", "app=frontend")
	svc := &flows.Service{Name: "default/reviews:9080", IP: "10.96.0.10", Port: 9080}
	// 900 requests to reviews-v1, 100 to reviews-v2 through the reviews Service.
	for i := range 1000 {
		backend := pod("default", "reviews-v1", "app=reviews", "version=v1")
		if i%10 == 9 {
			backend = pod("default", "reviews-v2", "app=reviews", "version=v2")
		}
		a.Add(&flows.Flow{Time: t0.Add(time.Duration(i) * time.Millisecond), Verdict: "FORWARDED", Protocol: "HTTP",
			Source: frontend, Destination: backend, Service: svc,
			HTTP: &flows.HTTP{Method: "GET", Path: "/", Status: 200, Route: "default/reviews"}})
	}
	// A TCP connection dropped by policy, the rule named.
	scraper := pod("monitoring", "scraper", "app=scraper")
	a.Add(&flows.Flow{Time: t0.Add(2 * time.Second), Verdict: "DROPPED", DropReason: "policy-denied", Protocol: "TCP",
		Source: scraper, Destination: frontend, Policy: "ShuntNetworkPolicy shop/no-monitoring-admin ingress[0] (deny)"})
	// An HTTP request refused by the proxy.
	a.Add(&flows.Flow{Time: t0.Add(2 * time.Second), Verdict: "DROPPED", DropReason: "policy-not-allowed", Protocol: "HTTP",
		Source: frontend, Destination: pod("default", "backend", "app=backend"), HTTP: &flows.HTTP{Method: "GET", Path: "/admin", Status: 403}})
	// To the world and to the node.
	a.Add(&flows.Flow{Time: t0, Verdict: "DROPPED", DropReason: "policy-not-allowed", Protocol: "UDP",
		Source: scraper, Destination: flows.Endpoint{IP: "8.8.8.8", Labels: []string{"reserved:world"}}})
	a.Add(&flows.Flow{Time: t0, Verdict: "FORWARDED", Protocol: "ICMP",
		Source: scraper, Destination: flows.Endpoint{IP: "192.168.1.1", Labels: []string{"reserved:host"}}})

	s := a.Snapshot(t0.Add(3 * time.Second))
	if s.Flows != 1004 {
		t.Errorf("flows = %d, want 1004", s.Flows)
	}
	in := edgeByID(t, s, "w:shop/frontend > svc:default/reviews")
	if in.Requests != 1000 || in.Forwarded != 1000 || in.Share != 0 || in.State != StateForwarded {
		t.Errorf("frontend > reviews: %+v", in)
	}
	v1 := edgeByID(t, s, "svc:default/reviews > w:default/reviews-v1")
	v2 := edgeByID(t, s, "svc:default/reviews > w:default/reviews-v2")
	if math.Abs(v1.Share-90) > 1e-9 || math.Abs(v2.Share-10) > 1e-9 || v1.Status[2] != 900 {
		t.Errorf("split: v1 %.2f%% (%d 2xx), v2 %.2f%%, want 90/10", v1.Share, v1.Status[2], v2.Share)
	}
	drop := edgeByID(t, s, "w:monitoring/scraper > w:shop/frontend")
	if drop.State != StateDropped || drop.Dropped != 1 {
		t.Errorf("scraper > frontend: %+v", drop)
	}
	fls, ok := a.EdgeFlows(drop.ID)
	if !ok || len(fls) != 1 || fls[0].Policy == "" || fls[0].DropReason != "policy-denied" {
		t.Errorf("scraper > frontend flows: %+v", fls)
	}
	denied := edgeByID(t, s, "w:shop/frontend > w:default/backend")
	if denied.State != StateHTTPDenied || denied.HTTPDenied != 1 || denied.Status[4] != 1 {
		t.Errorf("frontend > backend: %+v", denied)
	}
	if e := edgeByID(t, s, "w:monitoring/scraper > world"); e.State != StateDropped {
		t.Errorf("to the world: %+v", e)
	}
	if e := edgeByID(t, s, "w:monitoring/scraper > host"); e.State != StateForwarded {
		t.Errorf("to the node: %+v", e)
	}
	kinds := map[string]string{}
	for _, n := range s.Nodes {
		kinds[n.ID] = n.Kind
	}
	for id, kind := range map[string]string{"svc:default/reviews": KindService, "world": KindWorld, "host": KindHost, "w:default/reviews-v2": KindWorkload} {
		if kinds[id] != kind {
			t.Errorf("node %s: kind %q, want %q", id, kinds[id], kind)
		}
	}
}

func TestAggregateStateFollowsRecentFlows(t *testing.T) {
	a := NewAggregate(Limits{})
	src, dst := pod("a", "c", "app=c"), pod("a", "s", "app=s")
	a.Add(&flows.Flow{Time: t0, Verdict: "DROPPED", DropReason: "policy-denied", Protocol: "TCP", Source: src, Destination: dst})
	a.Add(&flows.Flow{Time: t0.Add(time.Second), Verdict: "FORWARDED", Protocol: "TCP", Source: src, Destination: dst})
	if st := a.Snapshot(t0).Edges[0].State; st != StateDropped {
		t.Errorf("a drop 1 s before the last flow: state %s, want dropped", st)
	}
	a.Add(&flows.Flow{Time: t0.Add(RecentWindow + 2*time.Second), Verdict: "FORWARDED", Protocol: "TCP", Source: src, Destination: dst})
	if st := a.Snapshot(t0).Edges[0].State; st != StateForwarded {
		t.Errorf("a drop %s before the last flow: state %s, want forwarded", RecentWindow+2*time.Second, st)
	}
}

func TestAggregateConnectionEndJoinsItsStart(t *testing.T) {
	a := NewAggregate(Limits{})
	client, server := pod("a", "client", "app=client"), pod("a", "server", "app=server")
	a.Add(&flows.Flow{Time: t0, Verdict: "FORWARDED", Event: "new", Protocol: "TCP", Source: client, Destination: server})
	a.Add(&flows.Flow{Time: t0, Verdict: "FORWARDED", Event: "end", TCPFlags: "FIN|ACK", Protocol: "TCP", Source: server, Destination: client})
	if s := a.Snapshot(t0); len(s.Edges) != 1 || s.Edges[0].ID != "w:a/client > w:a/server" || s.Edges[0].Forwarded != 2 {
		t.Errorf("edges %+v, want client > server with both flows", s.Edges)
	}
}

// A connection recorded again from its answer (its conntrack entry lost)
// was opened by the answer's destination: its edge, even when the
// aggregate never saw the connection's start.
func TestAggregateAnswerJoinsItsOpener(t *testing.T) {
	a := NewAggregate(Limits{})
	client, server := pod("a", "client", "app=client"), pod("a", "server", "app=server")
	a.Add(&flows.Flow{Time: t0, Verdict: "FORWARDED", Event: "answer", TCPFlags: "ACK", Protocol: "TCP", Source: server, Destination: client})
	if s := a.Snapshot(t0); len(s.Edges) != 1 || s.Edges[0].ID != "w:a/client > w:a/server" {
		t.Errorf("edges %+v, want client > server", s.Edges)
	}
}

func TestAggregateBounded(t *testing.T) {
	a := NewAggregate(Limits{MaxNodes: 50, MaxEdges: 20, RingSize: 5})
	for i := range 10000 {
		a.Add(&flows.Flow{Time: t0.Add(time.Duration(i)), Verdict: "FORWARDED", Protocol: "TCP",
			Source: pod("ns", fmt.Sprintf("c%d", i%100)), Destination: pod("ns", "server")})
	}
	s := a.Snapshot(t0)
	if len(s.Edges) != 20 || len(s.Nodes) > 50 {
		t.Fatalf("%d edges, %d nodes: want 20 edges, at most 50 nodes", len(s.Edges), len(s.Nodes))
	}
	var counted uint64
	for _, e := range s.Edges {
		counted += e.Forwarded
		if fls, _ := a.EdgeFlows(e.ID); len(fls) != 5 {
			t.Fatalf("edge %s keeps %d flows, want its ring of 5", e.ID, len(fls))
		}
	}
	if counted+s.Overflow != 10000 {
		t.Errorf("counted %d + overflow %d != 10000 flows", counted, s.Overflow)
	}
	// Newest first.
	fls, _ := a.EdgeFlows(s.Edges[0].ID)
	for i := 1; i < len(fls); i++ {
		if !fls[i].Time.Before(fls[i-1].Time) {
			t.Fatalf("edge flows not newest first: %v then %v", fls[i-1].Time, fls[i].Time)
		}
	}
}

func TestWorkloadNames(t *testing.T) {
	for pod, want := range map[string]string{
		"web-7d4b9c8f6d-x2k9p": "web", // Deployment
		"fluentd-8hx2q":        "fluentd",
		"db-0":                 "db", // StatefulSet
		"backend-v1":           "backend-v1",
		"nginx-proxy":          "nginx-proxy",
		"frontend":             "frontend",
	} {
		if got := ownerName(pod); got != want {
			t.Errorf("ownerName(%q) = %q, want %q", pod, got, want)
		}
	}
	if got := appName([]string{"app=reviews", "version=v2", "x=y"}); got != "reviews-v2" {
		t.Errorf("appName = %q, want reviews-v2", got)
	}
	// A pod seen first with labels keeps its workload when a flow names it without.
	a := NewAggregate(Limits{})
	a.Add(&flows.Flow{Verdict: "FORWARDED", Source: pod("ns", "web-7d4b9c8f6d-x2k9p", "app=shop"), Destination: pod("ns", "db-0")})
	a.Add(&flows.Flow{Verdict: "FORWARDED", Source: pod("ns", "web-7d4b9c8f6d-x2k9p"), Destination: pod("ns", "db-0")})
	if s := a.Snapshot(t0); len(s.Edges) != 1 || s.Edges[0].ID != "w:ns/shop > w:ns/db" || s.Edges[0].Forwarded != 2 {
		t.Errorf("edges %+v", s.Edges)
	}
}

// TestAggregateRecordedDemo folds flows recorded from the demo's lab
// (`shunt observe -o json` after examples/demo, policy and l7: 100
// requests split by the reviews route, an HTTP request the backend's
// policy refused, a connection a deny rule dropped).
func TestAggregateRecordedDemo(t *testing.T) {
	data, err := os.ReadFile("testdata/demo-flows.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	a := NewAggregate(Limits{})
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var fl flows.Flow
		if err := json.Unmarshal([]byte(line), &fl); err != nil {
			t.Fatal(err)
		}
		a.Add(&fl)
	}
	s := a.Snapshot(time.Now())
	for id, want := range map[string]string{
		"w:default/frontend > svc:default/reviews":   StateForwarded,
		"svc:default/reviews > w:default/reviews-v1": StateForwarded,
		"svc:default/reviews > w:default/reviews-v2": StateForwarded,
		"w:default/frontend > svc:default/backend":   StateHTTPDenied,
		"w:monitoring/scraper > w:shop/frontend":     StateDropped,
		"w:default/frontend > host":                  StateForwarded, // to the node proxy
		"w:default/frontend > w:default/reviews-v1":  StateForwarded, // the proxy's upstream connection, with the client's identity
	} {
		if e := edgeByID(t, s, id); e.State != want {
			t.Errorf("%s: state %s, want %s", id, e.State, want)
		}
	}
	if e := edgeByID(t, s, "svc:default/reviews > w:default/reviews-v1"); math.Abs(e.Share-90) > 0.01 {
		t.Errorf("reviews-v1 has %.1f%% of the requests, want 90", e.Share)
	}
	for _, n := range s.Nodes {
		if n.Kind == KindWorld {
			t.Errorf("a node for the world, the demo never left the lab: %+v", n)
		}
	}
	fls, _ := a.EdgeFlows("w:monitoring/scraper > w:shop/frontend")
	if len(fls) == 0 || !strings.Contains(fls[0].Policy, "no-monitoring-admin") {
		t.Errorf("the drop's flows do not name the deny rule: %+v", fls)
	}
}
