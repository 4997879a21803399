#!/usr/bin/env bash
# Installs everything building, testing, the demo and the benchmarks call, on
# Debian 12, idempotently: a second run installs nothing. `make demo`,
# `make test` and `bench/run` all start with it. Nothing else is installed
# by hand on any machine: when a program is missing, add it here.
#
# The table below is the one list of external programs: every program the
# build, the tests (test/e2e, the Go tests), scripts/demo.sh and bench/*.sh
# run, with the Debian package that has it. After installing, each program
# is checked to be on PATH, so a wrong package name fails here, not in the
# middle of a test.
set -euo pipefail

# program          package          who calls it
programs=(
	"clang-14          clang-14         make generate: compiles bpf/*.c (pinned: other versions emit other bytes)"
	"llvm-strip-14     llvm-14          make generate: bpf2go strips DWARF with it"
	"ip                iproute2         lab, tests, benchmarks: netns, veth, routes"
	"tc                iproute2         tests, benchmarks: inspect tc attachments"
	"ss                iproute2         e2e: socket states inside pods"
	"nsenter           util-linux       benchmarks: run baselines inside a pod's netns"
	"taskset           util-linux       benchmarks: pin client and server to a core"
	"mount             mount            agent: bpffs"
	"timeout           coreutils        benchmarks"
	"awk               mawk             benchmarks: arithmetic on results"
	"sysctl            procps           benchmarks"
	"ping              iputils-ping     demo, e2e: ICMP between pods"
	"dig               bind9-dnsutils   e2e: DNS through a ClusterIP"
	"dnsmasq           dnsmasq-base     e2e: a DNS server pod"
	"jq                jq               demo, benchmarks: read -o json output"
	"sockperf          sockperf         benchmarks: request/response latency"
	"iperf3            iperf3           e2e, benchmarks: throughput"
	"iptables          iptables         benchmarks: iptables baselines"
	"iptables-restore  iptables         benchmarks: kube-proxy-style rule loads"
	"nft               nftables         benchmarks: nftables baseline"
	"conntrack         conntrack        benchmarks: flush conntrack between cases"
	"haproxy           haproxy          benchmarks: the sidecar proxies of the mesh baseline"
	"bpftool           bpftool          debugging: inspect loaded programs and maps by hand"
	"ethtool           ethtool          bench nodeport with LINK_DELAY: tunnel segmentation in software at a node's uplink, before a delay line (bench/internal/delayline)"
	"tcpdump           tcpdump          debugging: packet captures in a node's or pod's netns (e.g. a handshake the datapath lost)"
	"curl              curl             debugging: the agent's /debug/pprof over its socket"
	"etcd              etcd-server      internal/kubecluster: the storage of the test control plane"
	"chromium          chromium         e2e, bench ui: drives the page of shunt ui headless (chromedp)"
	"busybox           busybox-static   lab kubelet: the program of busybox images (internal/lab/images.go), as the conformance suites run them"
	"nc                netcat-openbsd   lab kubelet: agnhost's nc (its image installs netcat-openbsd); the Services conformance specs exec nc -u/-t/-v in its pods"
	"qemu-system-x86_64 qemu-system-x86 scripts/kernel-vm.sh: boots Debian 12's Linux 6.1 (apt-get download, not installed) to run shunt's programs on its verifier"
	"depmod            kmod             scripts/kernel-vm.sh: the module index of that kernel's modules"
	"cpio              cpio             scripts/kernel-vm.sh: the VM's initramfs"
)

# Not here: kube-apiserver, kube-controller-manager, kube-proxy and kubectl.
# scripts/kube-build.sh builds them from the k8s.io/kubernetes Go module at the
# release pinned in tools/kube/go.mod (`make kube`, part of `make test`):
# Debian has no API server, and its kubernetes-client (kubectl 1.20) is far
# behind the server and collides with /usr/bin/kubectl of the kubectl package
# some machines carry.

missing=()
for row in "${programs[@]}"; do
	read -r _ pkg _ <<<"$row"
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	if [ "$(id -u)" != 0 ]; then
		echo "setup: need root to install: ${missing[*]}" >&2
		exit 1
	fi
	echo "setup: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

absent=()
for row in "${programs[@]}"; do
	read -r prog pkg _ <<<"$row"
	command -v "$prog" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "$prog" >/dev/null || absent+=("$prog ($pkg)")
done
if ((${#absent[@]})); then
	echo "setup: installed, but not found on PATH: ${absent[*]}" >&2
	exit 1
fi

if ! command -v go >/dev/null; then
	echo "setup: Go 1.26+ is required (https://go.dev/doc/install); /usr/local/go/bin must be on PATH" >&2
	exit 1
fi
go mod download
