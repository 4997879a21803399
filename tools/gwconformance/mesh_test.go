// Package gwconformance runs the Gateway API conformance suite's mesh
// tests (GAMMA: HTTPRoutes and GRPCRoutes whose parent is a Service)
// against the cluster of $KUBECONFIG or --kubeconfig, as the suite's own
// TestConformance does,
// with the features shunt claims. test/conformance --suite gateway-mesh
// brings a lab cluster up and runs the test binary of this package.
package gwconformance

import (
	"os"
	"slices"
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/gateway-api/conformance/tests"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
	"sigs.k8s.io/yaml"
)

// MeshFeatures are what shunt claims, unless --supported-features says
// otherwise: the core of the MESH-HTTP profile (Mesh, HTTPRoute) and of the
// MESH-GRPC profile (Mesh, GRPCRoute), every extended mesh feature, and the
// HTTPRoute features its mesh tests also need (response headers, parentRef
// ports, redirect status codes).
var MeshFeatures = []features.FeatureName{
	features.SupportMesh,
	features.SupportHTTPRoute,
	features.SupportGRPCRoute,
	features.SupportMeshClusterIPMatching,
	features.SupportMeshConsumerRoute,
	features.SupportMeshHTTPRouteRewritePath,
	features.SupportMeshHTTPRouteSchemeRedirect,
	features.SupportMeshHTTPRouteRedirectPort,
	features.SupportMeshHTTPRouteRedirectPath,
	features.SupportMeshHTTPRouteBackendRequestHeaderModification,
	features.SupportMeshHTTPRouteQueryParamMatching,
	features.SupportMeshHTTPRouteNamedRouteRule,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteParentRefPort,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
}

func TestMeshConformance(t *testing.T) {
	opts := conformance.DefaultOptions(t)
	if len(opts.SupportedFeatures) == 0 && !opts.EnableAllSupportedFeatures {
		opts.SupportedFeatures = MeshFeatures
	}
	if len(opts.ConformanceProfiles) == 0 {
		opts.ConformanceProfiles = []suite.ConformanceProfileName{suite.MeshHTTPConformanceProfileName, suite.MeshGRPCConformanceProfileName}
	}
	if opts.Implementation.Organization == "" {
		opts.Implementation = confv1.Implementation{
			Organization: "shuntnet", Project: "shunt", URL: "https://github.com/shuntnet/shunt",
			Version: "dev", Contact: []string{"https://github.com/shuntnet/shunt/issues"},
		}
	}
	// Mesh tests only: the others need a Gateway, which shunt does not
	// implement yet, and would each be reported as skipped.
	var mesh []suite.ConformanceTest
	for _, ct := range tests.ConformanceTests {
		if slices.Contains(ct.Features, features.SupportMesh) {
			mesh = append(mesh, ct)
		}
	}
	t.Logf("%d mesh tests; supported features %v", len(mesh), opts.SupportedFeatures)
	cSuite, err := suite.NewConformanceTestSuite(opts)
	if err != nil {
		t.Fatalf("creating the conformance suite: %v", err)
	}
	if opts.ReportOutputPath != "" {
		t.Cleanup(func() {
			report, err := cSuite.Report()
			if err != nil {
				t.Errorf("the conformance report: %v", err)
				return
			}
			// The suite's own form (its writeReport is not exported).
			data, err := yaml.Marshal(report)
			if err == nil {
				err = os.WriteFile(opts.ReportOutputPath, data, 0o644)
			}
			if err != nil {
				t.Errorf("writing the conformance report: %v", err)
			}
		})
	}
	cSuite.Setup(t, mesh)
	if err := cSuite.Run(t, mesh); err != nil {
		t.Fatal(err)
	}
}
