package manifest

// The CRDs of shunt's own kinds, generated from the Go types' kubebuilder
// markers (deploy/crds/shunt.io_*.yaml), and the Gateway API's HTTPRoute,
// GRPCRoute and ReferenceGrant CRDs copied from the module version go.mod pins: `make generate` rewrites
// them and CI fails when the committed ones differ.
//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 crd:crdVersions=v1 paths=. output:crd:dir=../../deploy/crds
//go:generate sh -c "cp \"$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml\" ../../deploy/crds/ && chmod 644 ../../deploy/crds/gateway.networking.k8s.io_httproutes.yaml"
//go:generate sh -c "cp \"$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)/config/crd/standard/gateway.networking.k8s.io_grpcroutes.yaml\" ../../deploy/crds/ && chmod 644 ../../deploy/crds/gateway.networking.k8s.io_grpcroutes.yaml"
//go:generate sh -c "cp \"$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)/config/crd/standard/gateway.networking.k8s.io_referencegrants.yaml\" ../../deploy/crds/ && chmod 644 ../../deploy/crds/gateway.networking.k8s.io_referencegrants.yaml"
