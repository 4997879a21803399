# shunt — the two commands of the README:
#   make demo   build everything and run the lab demo
#   make test   run the whole test suite (what CI runs)
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := bin

.PHONY: all setup build generate check-generated kube image chart test-tools demo demo-down test test-kernel-6.1 test-kernel-6.1-all test-unit fuzz bench clean conformance

all: build

setup:
	@scripts/setup.sh

# Generated Go and BPF objects are committed, so building needs no clang.
build:
	$(GO) build -o $(BIN)/ ./cmd/shunt ./cmd/shuntd ./cmd/shunt-proxy ./cmd/shunt-cni

generate:
	$(GO) generate ./...

# CI regenerates the BPF objects and fails when the committed ones differ.
check-generated: generate
	@git diff --exit-code --stat -- internal/ deploy/ || { echo "generated files are stale: run 'make generate' and commit" >&2; exit 1; }

# kube-apiserver, kube-controller-manager, kube-proxy and kubectl at the
# release pinned in tools/kube/go.mod, for the tests that run a real control
# plane: built once per version (15-20 minutes cold on 2 cores, niced), then
# this returns at once. Then kube-scheduler, agnhost and e2e.test, for the
# conformance subset of make test (test/conformance; e2e.test took 611 s
# with the Go build cache of the others warm), and coredns, the cluster DNS
# (tools/coredns: 376 s on 2 loaded cores with client-go's build cache warm),
# and Istio's echo app for the Gateway API mesh subset (tools/istioecho).
kube:
	@scripts/kube-build.sh >/dev/null
	@scripts/kube-build.sh kube-scheduler agnhost e2e.test coredns istio-echo >/dev/null

# The container image, without a container daemon (tools/image, a module of
# its own): $(BIN)/image/oci (OCI layout) and $(BIN)/image/shunt.tar
# (docker load -i); prints the digest, the same for the same commit.
image:
	cd tools/image && GOWORK=off $(GO) run . -repo ../.. -out ../../$(BIN)/image

# The Helm chart as an archive ($(BIN)/shunt-VERSION.tgz, crds/ resolved),
# for helm install from a file or helm push to an OCI registry.
chart:
	cd tools/helm && GOWORK=off $(GO) run . package -out ../../$(BIN) ../../deploy/helm/shunt

# The tools modules' tests: the image builds reproducibly, the Helm chart
# lints and renders (tools/helm, the Helm Go module, kept out of go.mod).
test-tools:
	cd tools/image && GOWORK=off $(GO) vet ./... && GOWORK=off $(GO) test -count=1 ./...
	cd tools/helm && GOWORK=off $(GO) vet ./... && GOWORK=off $(GO) test -count=1 ./...
	cd tools/gwconformance && GOWORK=off $(GO) vet ./...

demo: setup build
	@scripts/demo.sh

demo-down: build
	$(BIN)/shunt lab down
	$(BIN)/shunt --instance nodes lab down

# The whole suite: unit tests everywhere, BPF_PROG_TEST_RUN tests, and the
# end-to-end lab tests (root needed; they skip with a reason without it;
# test/deploy installs the chart with the image on lab nodes, hence image),
# then every benchmark in smoke mode (bench/smoke_test.go) on its own, so its
# timings and address ranges never meet the e2e tests' on the 2 cores.
# The end-to-end tests run again with every kernel fallback forced (the
# paths a Linux 5.15-6.9 kernel takes: tc clsact, sk_msg by
# BPF_PROG_ATTACH, sock_diag destroy, no bpf_set_retval; docs/kernels.md):
# forwarding, services, UDP socket destroy, policy, acceleration, the L7
# proxy, two nodes, restarts and uninstall (~3 minutes).
# test/e2e takes ~22 minutes on a quiet 2-core machine; its 45-minute
# timeout leaves room for a busy one (at 30 it once ran out while other
# builds shared the cores), well inside CI's 90.
# At the end, scripts/leftovers.sh lists what the run left on the machine
# (namespaces, interfaces, pins, cgroups, files in /tmp): a report, not a
# failure.
FALLBACK_E2E := ^(TestKernelFallbackTC|TestSkMsgAttachAcrossRestarts|TestPodToPodAllModes|TestServiceClusterIP|TestConnectedUDPSocketLeavesDeletedBackend|TestSocketAccelerationKeepsPolicy|TestL7ProxyPolicyRoutesAndFlows|TestCrossNodeOverlay|TestNetworkPolicyMatrix|TestUninstallAfterCrash)$$
test: setup build check-generated kube image
	scripts/leftovers.sh snapshot $(BIN)/leftovers.snapshot
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 45m $$($(GO) list ./... | grep -vx 'github.com/shuntnet/shunt/bench')
	SHUNT_KERNEL_FALLBACKS=all $(GO) test -count=1 -timeout 15m -run '$(FALLBACK_E2E)' ./test/e2e/
	$(GO) test -count=1 -timeout 15m ./bench/
	$(MAKE) test-kernel-6.1
	$(MAKE) test-tools
	scripts/fuzz.sh 20000x
	scripts/leftovers.sh report $(BIN)/leftovers.snapshot

# Debian 12's Linux 6.1 (scripts/kernel-vm.sh boots it, emulated, with
# this machine's files): every program of the objects loads on its verifier
# with every part of the uplink program on, and BPF_PROG_TEST_RUN and
# socket tests run there (about two minutes): the ones that found what
# 6.18 hides (docs/kernels.md). The 6.18 verifier took programs 6.1's
# refused (its stack counted in 16-byte frames, not 32; bounds of spilled
# copies kept): TestStackFitsOlderVerifiers checks the first on this
# machine. A map update's error reached 6.1's programs as a positive
# number (TestTCInsertFailures, TestSocketHookInsertFailures); FIONREAD
# does not count redirected bytes there (TestAccelFIONREADProbe).
# test-kernel-6.1-all runs the whole datapath package there (about 30
# minutes; not part of make test).
KERNEL_61_TESTS := ^(TestCarriedIdentity|TestTCInsertFailures|TestSocketHookInsertFailures|TestAccelFIONREADProbe)$$
# ... and an agent's lab (the e2e test binary with make build's binaries):
# what the agent decides from the kernel it runs on.
KERNEL_61_E2E := ^TestAccelAsTheKernelAllows$$
test-kernel-6.1: setup build
	$(GO) test -c -o $(BIN)/datapath.test ./internal/datapath/
	cd internal/datapath && ../../scripts/kernel-vm.sh --timeout 900 -- sh -c "$(abspath $(BIN))/datapath.test -test.v -test.run '^TestUplinkLoadsWithEveryPartOn$$/^(snat|hybrid)$$/dsr-no-gso-decap/decap-in-device=false' && $(abspath $(BIN))/datapath.test -test.v -test.run '$(KERNEL_61_TESTS)'"
	$(GO) test -c -o $(BIN)/e2e.test ./test/e2e/
	cd test/e2e && SHUNT_E2E_BIN=$(abspath $(BIN)) SHUNT_AGENT_START_TIMEOUT=300s KERNEL_VM_ENV="SHUNT_E2E_BIN SHUNT_AGENT_START_TIMEOUT" \
		../../scripts/kernel-vm.sh --timeout 600 -- $(abspath $(BIN))/e2e.test -test.v -test.run '$(KERNEL_61_E2E)'

test-kernel-6.1-all: setup
	$(GO) test -c -o $(BIN)/datapath.test ./internal/datapath/
	cd internal/datapath && ../../scripts/kernel-vm.sh --timeout 3600 -- $(abspath $(BIN))/datapath.test -test.v -test.timeout 3500s

# The Kubernetes e2e suite against a shunt cluster with no kube-proxy
# (scripts/conformance.sh): FOCUS (default: sig-network conformance; netpol:
# the NetworkPolicy specs), SKIP, REPORT (directory of JUnit and results.md);
# SUITE=gateway-mesh: focus 3, the Gateway API mesh suite (RUN: a regular
# expression of its tests).
conformance:
	scripts/conformance.sh $(if $(SUITE),--suite '$(SUITE)') $(if $(RUN),--run-test '$(RUN)') $(if $(FOCUS),--focus '$(FOCUS)') $(if $(SKIP),--skip '$(SKIP)') $(if $(REPORT),--report-dir '$(REPORT)')

# Every fuzz target for longer (FUZZTIME each); make test runs 20 000
# executions of each (scripts/fuzz.sh says why a count).
FUZZTIME ?= 2m
fuzz: setup
	scripts/fuzz.sh $(FUZZTIME)

bench: setup build
	bench/run forwarding

clean:
	rm -rf $(BIN)
