#!/usr/bin/env bash
# Copies the third-party headers the BPF programs build with into
# bpf/include/, verbatim, from Debian 12's packages, and records where each
# came from in bpf/include/VENDORED. The build then compiles with -nostdinc
# and sees only bpf/include/ and bpf/: no libc header, no machine path, so
# the objects are the same on every machine (make check-generated).
#
# Run it only to move to newer headers (install the packages first); the
# copies are committed and the build never reads /usr/include.
set -euo pipefail
cd "$(dirname "$0")/.."

dest=bpf/include
# package: headers (paths under /usr/include)
declare -A files=(
	[linux-libc-dev]="linux/bpf.h linux/bpf_common.h"
	[libbpf-dev]="bpf/bpf_helpers.h bpf/bpf_helper_defs.h bpf/bpf_endian.h"
)

{
	echo "# Vendored verbatim by scripts/vendor-bpf-headers.sh; do not edit."
	echo "# file	Debian package	version"
} >"$dest/VENDORED.new"
for pkg in linux-libc-dev libbpf-dev; do
	version=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) || {
		echo "vendor-bpf-headers: package $pkg is not installed (apt-get install $pkg)" >&2
		exit 1
	}
	for f in ${files[$pkg]}; do
		install -D -m 0644 "/usr/include/$f" "$dest/$f"
		printf '%s\t%s\t%s\n' "$f" "$pkg" "$version" >>"$dest/VENDORED.new"
	done
done
mv "$dest/VENDORED.new" "$dest/VENDORED"
echo "vendored into $dest/ (see $dest/VENDORED); run 'make generate' and commit"
