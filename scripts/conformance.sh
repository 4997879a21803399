#!/usr/bin/env bash
# Runs the Kubernetes e2e suite against a shunt cluster with no kube-proxy:
# `shunt dev cluster`'s control plane with kube-scheduler, and lab nodes whose
# agents play the kubelet (test/conformance). Writes e2e.test's JUnit and a
# Markdown table of passed / failed / skipped specs, with the reason of every
# failure and skip, into the report directory, and tears everything down,
# on failure and Ctrl-C too.
#
#   scripts/conformance.sh                      focus 1: sig-network conformance
#   scripts/conformance.sh --focus netpol       focus 2: test/e2e/network/netpol
#   scripts/conformance.sh --focus RE --skip RE --report-dir DIR --nodes N
#   scripts/conformance.sh --suite gateway-mesh [--run-test NAME]
#                                               focus 3: the Gateway API
#                                               conformance suite's mesh
#                                               profile (tools/gwconformance)
#
# It builds shunt (make build) and, once per Kubernetes release, e2e.test,
# kube-scheduler, agnhost and coredns, the cluster DNS (scripts/kube-build.sh;
# e2e.test took 611 s on 2 busy cores with a warm Go build cache, much longer
# cold; coredns 376 s). Root needed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export PATH=/usr/local/go/bin:$PATH
if [ "$(id -u)" != 0 ]; then
	echo "conformance: needs root (network namespaces, BPF, cgroups)" >&2
	exit 1
fi
scripts/setup.sh
make -s build
scripts/kube-build.sh >/dev/null
GOWORK=off go build -o bin/conformance ./test/conformance
case " $* " in
*" --suite gateway-mesh "* | *" --suite=gateway-mesh "*)
	# Istio's echo app (the suite's echo-advanced image) and the suite's
	# test binary, from modules of their own.
	kube=$(scripts/kube-build.sh kube-scheduler coredns istio-echo | tail -n1)
	(cd tools/gwconformance && GOWORK=off nice -n 19 go test -c -o ../../bin/gateway-mesh-conformance.test .)
	;;
*)
	kube=$(scripts/kube-build.sh kube-scheduler agnhost e2e.test coredns | tail -n1)
	;;
esac
exec bin/conformance --shunt-bin bin --kube-bin "$kube" "$@"
