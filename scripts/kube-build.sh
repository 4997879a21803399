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

built() {
	local p
	for p in "${programs[@]}"; do
		[ -x "$bin/$p" ] || return 1
	done
}

if built; then
	echo "$bin"
	exit 0
fi
if [ "${1:-}" = --check ]; then
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

echo "kube-build: building ${programs[*]} $version into $bin (cold: 15-20 minutes on 2 cores)" >&2
start=$(date +%s)
tmp=$(mktemp -d "$dir/bin.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The same version stamps the Kubernetes release build sets (hack/lib/version.sh),
# so `kube-apiserver --version` and kubectl's version-skew check see the real
# release rather than v0.0.0-master.
minor=${version#v*.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
pkgs=()
for p in "${programs[@]}"; do
	pkgs+=("k8s.io/kubernetes/cmd/$p")
done
# nice: other work shares these cores; static binaries like the release ones.
(cd "$mod" && GOWORK=off CGO_ENABLED=0 nice -n 19 go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
chmod 755 "$tmp" # mktemp made it private
mv -T "$tmp" "$bin"
trap - EXIT
echo "kube-build: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
