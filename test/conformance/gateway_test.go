package main

import (
	"strings"
	"testing"
)

// A test2json stream as the mesh suite's binary writes it: parallel
// subtests of a conformance test, a testify failure, a skip.
const meshStream = `{"Action":"run","Test":"TestMeshConformance"}
{"Action":"run","Test":"TestMeshConformance/MeshBasic"}
{"Action":"output","Test":"TestMeshConformance/MeshBasic","Output":"    conformance.go:77: Running MeshBasic\n"}
{"Action":"pass","Test":"TestMeshConformance/MeshBasic","Elapsed":1.5}
{"Action":"run","Test":"TestMeshConformance/MeshGRPCRouteWeight"}
{"Action":"output","Test":"TestMeshConformance/MeshGRPCRouteWeight","Output":"    conformance.go:56: Skipping MeshGRPCRouteWeight: suite does not support GRPCRoute\n"}
{"Action":"skip","Test":"TestMeshConformance/MeshGRPCRouteWeight","Elapsed":0}
{"Action":"run","Test":"TestMeshConformance/MeshHTTPRoute303Redirect"}
{"Action":"run","Test":"TestMeshConformance/MeshHTTPRoute303Redirect/0_request"}
{"Action":"output","Test":"TestMeshConformance/MeshHTTPRoute303Redirect/0_request","Output":"    pod.go:72: 2026-11-27T08:42:24.539145462Z: Response expectation failed for request: [client http://echo/redirect --method=GET]  not ready yet: wanted status code to be one of [303], got 500 (after 28.25762376s)\n"}
{"Action":"output","Test":"TestMeshConformance/MeshHTTPRoute303Redirect/0_request","Output":"        \tError Trace:\thttp.go:1\n        \tError:      \tShould be true\n"}
{"Action":"fail","Test":"TestMeshConformance/MeshHTTPRoute303Redirect/0_request","Elapsed":30}
{"Action":"fail","Test":"TestMeshConformance/MeshHTTPRoute303Redirect","Elapsed":0.05}
{"Action":"run","Test":"TestMeshConformance/MeshPorts"}
{"Action":"output","Test":"TestMeshConformance/MeshPorts","Output":"    pod.go:74: request failed: exec: \"client\": executable file not found in $PATH\n"}
{"Action":"fail","Test":"TestMeshConformance/MeshPorts","Elapsed":60}
{"Action":"run","Test":"TestMeshConformance/MeshTrafficSplit"}
{"Action":"fail","Test":"TestMeshConformance","Elapsed":100}
`

func TestParseTest2JSON(t *testing.T) {
	results, err := parseTest2JSON(strings.NewReader(meshStream), gatewayTestPrefix)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]result{
		"MeshBasic":           {Name: "MeshBasic", Outcome: "passed", Seconds: 1.5},
		"MeshGRPCRouteWeight": {Name: "MeshGRPCRouteWeight", Outcome: "skipped", Reason: "Skipping MeshGRPCRouteWeight: suite does not support GRPCRoute"},
		"MeshHTTPRoute303Redirect": {Name: "MeshHTTPRoute303Redirect", Outcome: "failed", Seconds: 30,
			Reason: "http://echo/redirect --method=GET: wanted status code to be one of [303], got 500"},
		"MeshPorts": {Name: "MeshPorts", Outcome: "failed", Seconds: 60,
			Reason: `pod.go:74: request failed: exec: "client": executable file not found in $PATH`,
			Cause:  "the echo image's client, which the suite execs, is not on the container's PATH"},
		"MeshTrafficSplit": {Name: "MeshTrafficSplit", Outcome: "failed", Reason: "did not finish (the suite's time limit, or it was stopped)"},
	}
	if len(results) != len(want) {
		t.Fatalf("%d results, want %d: %+v", len(results), len(want), results)
	}
	for _, r := range results {
		if r != want[r.Name] {
			t.Errorf("%s: %+v, want %+v", r.Name, r, want[r.Name])
		}
	}
}
