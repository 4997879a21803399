#!/usr/bin/env bash
# Builds the Kubernetes binaries that tests, benchmarks and `shunt dev cluster`
# run: kube-apiserver, kube-controller-manager, kube-proxy and kubectl, from
# k8s.io/kubernetes at the release pinned in tools/kube/go.mod. kubectl is
# built too because Debian's kubernetes-client (1.20) is 17 minor versions
# behind the server and its /usr/bin/kubectl collides with the kubectl package
# some machines already carry; this one always matches the server.
#
# A cold build takes 15-20 minutes on 2 cores (measured: 919 s with empty Go
# build and module caches, downloads included, 3.8 GB of build cache, while
# other work shared the CPUs), so it happens once per
# version: the binaries are kept in
#   ${SHUNT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shunt/kube}/<version>/bin
# outside the repository, so every worktree and checkout of the same release
# shares one build and `git clean` does not throw it away. When they exist the
# script exits at once. It prints that bin directory as its last line of
# stdout (internal/kubecluster reads it); progress goes to stderr.
#
#   scripts/kube-build.sh            build if needed, print the bin directory
#   scripts/kube-build.sh --check    print the bin directory, exit 1 if not built
#   scripts/kube-build.sh [--check] PROGRAM...
#                                    the same for the programs named (one of
#                                    the four above, or an extra below)
#
# Extras, built only when named, into the same directory (scripts/conformance.sh
# asks for them):
#   kube-scheduler  the scheduler, for clusters whose pods ask for nodes by
#                   selector or affinity (the Kubernetes e2e suite)
#   agnhost         k8s.io/kubernetes/test/images/agnhost, the program of the
#                   registry.k8s.io/e2e-test-images/agnhost image that the lab
#                   kubelet runs for it (internal/lab/images.go)
#   e2e.test        the Kubernetes end-to-end suite, `go test -c` of
#                   k8s.io/kubernetes/test/e2e (tools/kube/e2e names its imports)
#   coredns         CoreDNS with the kubernetes plugin, from the module
#                   tools/coredns (github.com/coredns/coredns at its pin,
#                   client-go at this release), the program of the
#                   registry.k8s.io/coredns/coredns image: the cluster DNS
#                   that `shunt dev cluster up --dns` runs. Rebuilt when the
#                   CoreDNS pin changes (bin/coredns.version says which).
#   istio-echo      Istio's echo app from the module tools/istioecho
#                   (istio.io/istio at its pin): istio-echo-server,
#                   istio-echo-client and the certificate and key of its
#                   image (istio-echo-cert.crt, .key), the programs of the
#                   registry.k8s.io/gateway-api/echo-advanced image that the
#                   Gateway API mesh conformance suite deploys. Rebuilt when
#                   the pin changes (bin/istio-echo.version).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod=$root/tools/kube
# The pin: the k8s.io/kubernetes line of tools/kube/go.mod (read without
# running go, so --check is instant).
version=$(awk '($1 == "k8s.io/kubernetes" && $2 ~ /^v/) { print $2 } ($1 == "require" && $2 == "k8s.io/kubernetes") { print $3 }' "$mod/go.mod")
if [ -z "$version" ]; then
	echo "kube-build: no k8s.io/kubernetes version in $mod/go.mod" >&2
	exit 1
fi
cache=${SHUNT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shunt/kube}
dir=$cache/$version
bin=$dir/bin
programs=(kube-apiserver kube-controller-manager kube-proxy kubectl)
extras=(kube-scheduler agnhost e2e.test coredns istio-echo)
check=
if [ "${1:-}" = --check ]; then
	check=1
	shift
fi
if [ $# -gt 0 ]; then
	for p in "$@"; do
		case " ${programs[*]} ${extras[*]} " in
		*" $p "*) ;;
		*)
			echo "kube-build: no program $p: the programs are ${programs[*]} ${extras[*]}" >&2
			exit 2
			;;
		esac
	done
	programs=("$@")
fi

# CoreDNS has a pin of its own (tools/coredns/go.mod).
coredns_version=$(awk '$1 == "github.com/coredns/coredns" && $2 ~ /^v/ { print $2 }' "$root/tools/coredns/go.mod")
# And Istio (tools/istioecho/go.mod).
istio_version=$(awk '($1 == "istio.io/istio" && $2 ~ /^v/) { print $2 } ($1 == "require" && $2 == "istio.io/istio") { print $3 }' "$root/tools/istioecho/go.mod")

present() {
	if [ "$1" = istio-echo ]; then
		[ -x "$bin/istio-echo-server" ] && [ -x "$bin/istio-echo-client" ] && [ -f "$bin/istio-echo-cert.crt" ] && [ -f "$bin/istio-echo-cert.key" ] || return 1
		[ "$(cat "$bin/istio-echo.version" 2>/dev/null)" = "$istio_version" ] || return 1
		return 0
	fi
	[ -x "$bin/$1" ] || return 1
	if [ "$1" = coredns ]; then
		[ "$(cat "$bin/coredns.version" 2>/dev/null)" = "$coredns_version" ] || return 1
	fi
}

built() {
	local p
	for p in "${programs[@]}"; do
		present "$p" || return 1
	done
}

if built; then
	echo "$bin"
	exit 0
fi
if [ -n "$check" ]; then
	echo "$bin"
	exit 1
fi

mkdir -p "$dir"
# Two test packages (or two worktrees) may ask at once: one builds, the
# other waits for it instead of starting a second 20-minute build.
exec 9>"$dir/.lock"
flock 9
if built; then
	echo "$bin"
	exit 0
fi

if ! command -v go >/dev/null; then
	echo "kube-build: Go 1.26+ is required (https://go.dev/doc/install); /usr/local/go/bin must be on PATH" >&2
	exit 1
fi

echo "kube-build: building ${programs[*]} $version into $bin (cold: 15-20 minutes on 2 cores; e2e.test about as long again)" >&2
start=$(date +%s)
# The same version stamps the Kubernetes release build sets (hack/lib/version.sh),
# so `kube-apiserver --version` and kubectl's version-skew check see the real
# release rather than v0.0.0-master.
minor=${version#v*.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
mkdir -p "$bin"
# Each program is built into a private directory and moved into bin/ whole,
# so a build cut short never leaves a half-written program that built() takes
# for done.
tmp=$(mktemp -d "$dir/bin.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for p in "${programs[@]}"; do
	present "$p" && continue
	case $p in
	agnhost) pkg=k8s.io/kubernetes/test/images/agnhost ;;
	e2e.test) pkg=k8s.io/kubernetes/test/e2e ;;
	*) pkg=k8s.io/kubernetes/cmd/$p ;;
	esac
	t0=$(date +%s)
	# nice: other work shares these cores; static binaries like the release ones.
	if [ "$p" = e2e.test ]; then
		(cd "$mod" && GOWORK=off CGO_ENABLED=0 nice -n 19 go test -c -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/$p" "$pkg")
	elif [ "$p" = istio-echo ]; then
		# A module of its own (tools/istioecho): the image's two programs,
		# and the certificate and key its Dockerfile (pkg/test/echo/docker/
		# Dockerfile.app at the pin) copies to /cert.crt and /cert.key.
		(cd "$root/tools/istioecho" && GOWORK=off CGO_ENABLED=0 nice -n 19 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp/istio-echo-server" istio.io/istio/pkg/test/echo/cmd/server &&
			GOWORK=off CGO_ENABLED=0 nice -n 19 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp/istio-echo-client" istio.io/istio/pkg/test/echo/cmd/client)
		src=$(cd "$root/tools/istioecho" && GOWORK=off go list -m -f '{{.Dir}}' istio.io/istio)
		install -m 644 "$src/tests/testdata/certs/dns/cert-chain.pem" "$tmp/istio-echo-cert.crt"
		install -m 644 "$src/tests/testdata/certs/dns/key.pem" "$tmp/istio-echo-cert.key"
		for f in istio-echo-server istio-echo-client istio-echo-cert.crt istio-echo-cert.key; do
			mv -f "$tmp/$f" "$bin/$f"
		done
		echo "$istio_version" >"$bin/istio-echo.version"
		echo "kube-build: $p built in $(($(date +%s) - t0)) s" >&2
		continue
	elif [ "$p" = coredns ]; then
		# A module of its own (tools/coredns), not k8s.io/kubernetes.
		(cd "$root/tools/coredns" && GOWORK=off CGO_ENABLED=0 nice -n 19 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp/$p" .)
	else
		(cd "$mod" && GOWORK=off CGO_ENABLED=0 nice -n 19 go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/$p" "$pkg")
	fi
	chmod 755 "$tmp/$p"
	mv -f "$tmp/$p" "$bin/$p"
	if [ "$p" = coredns ]; then
		echo "$coredns_version" >"$bin/coredns.version"
	fi
	echo "kube-build: $p built in $(($(date +%s) - t0)) s" >&2
done
echo "kube-build: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
