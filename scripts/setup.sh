#!/usr/bin/env bash
# Installs what building and testing shunt needs on Debian 12, idempotently:
# a second run installs nothing. Used by both `make demo` and `make test`.
set -euo pipefail

packages=(clang llvm libbpf-dev bpftool iproute2 util-linux sockperf iperf3 dnsutils dnsmasq-base jq iputils-ping iptables nftables conntrack)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	if [ "$(id -u)" != 0 ]; then
		echo "setup: need root to install: ${missing[*]}" >&2
		exit 1
	fi
	echo "setup: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
	echo "setup: Go 1.26+ is required (https://go.dev/doc/install); /usr/local/go/bin must be on PATH" >&2
	exit 1
fi
go mod download
