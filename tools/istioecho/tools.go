//go:build tools

// Package istioecho names the two programs of Istio's echo image that
// scripts/kube-build.sh builds from this module: go build of these
// packages, at the version go.mod pins.
package istioecho

import (
	_ "istio.io/istio/pkg/test/echo/cmd/client"
	_ "istio.io/istio/pkg/test/echo/cmd/server"
)
