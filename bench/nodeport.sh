#!/usr/bin/env bash
# NodePort benchmark (issue 27): traffic from a host outside the cluster to
# a NodePort, two nodes on this machine (network namespaces joined by an
# underlay bridge, an external host on it), one real control plane, side by
# side in one run (bench/cmd/crossnode -nodeport builds, measures and
# removes everything):
#   kube-proxy-iptables  the real kube-proxy (iptables mode) in both nodes,
#                        flannel-style VXLAN between them: the baseline
#   kube-proxy-nftables  the same in nftables mode
#   shunt-vxlan          shunt's agent per node, --tunnel vxlan: NodePort
#                        translated in tc at the uplink, the backend by the
#                        Service's Maglev table
#   shunt-native         the same with --routing native, its measured
#                        Services annotated shunt.io/forwarding-mode: snat
#   shunt-native-dsr     shunt-native's nodes through a second set of
#                        Services annotated shunt.io/forwarding-mode: dsr:
#                        the client's address kept, IPIP to node 2, the
#                        replies from node 2 straight to the external host
#   shunt-vxlan-dsr      shunt-vxlan's nodes through Services annotated
#                        dsr: IPIP between the nodes' underlay addresses
#                        beside the overlay (Cilium's DSR needs native
#                        routing)
# shunt's SNAT and DSR are measured in every run, on the same nodes (the
# node-wide --nodeport-mode stays snat; the annotation picks the mode per
# Service), and the report compares them (shunt-native-dsr / shunt-native,
# shunt-vxlan-dsr / shunt-vxlan).
# Ten server pods on node 2. From the external host: through node 1's
# NodePort (every backend on the other node: SNAT to node 1) and node 2's
# (every backend on the ingress node): sockperf TCP ping-pong (avg, p50,
# p99, trans/s), new connections/s (bench/cmd/connrate); through node 1,
# one iperf3 stream. At N other Services (ClusterIP, 10 endpoints each).
# Plus the Maglev disruption of the measured Service's table on a backend
# removal (maglev.md, computed as the agents compute it).
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE_OPT=--n
SCALE_LIST="0 1000"
SMOKE_SCALE_LIST=10
source bench/lib.sh

bench_out nodeport
for tool in sockperf iperf3 iptables-restore nft conntrack nsenter taskset bridge jq; do
	command -v "$tool" >/dev/null || { echo "nodeport: $tool is missing: run scripts/setup.sh" >&2; exit 1; }
done
scripts/kube-build.sh >/dev/null
go build -o bin/ ./bench/cmd/crossnode ./bench/cmd/connrate
SCALES=$(echo $SCALE_LIST | tr ' ' ,)
SETTLE=5s SMOKE_FLAG=
# MEASURE (environment): only these cases are measured (every case is still
# built), comma-separated: e.g. MEASURE=shunt-native,shunt-native-dsr to
# compare shunt's NodePort modes without the kube-proxy cases' runs.
# (NATIVE_MODE, shunt-native's node-wide --nodeport-mode, is gone: both
# modes are measured in every run through the Services' annotation.)
MEASURE=${MEASURE:-}
# LINK_DELAY (environment): a one-way latency for every link to the
# underlay bridge (the nodes' and the external host's), e.g. 200us: a
# network where each hop costs time, which DSR's saved hop needs in order
# to show (this kernel has no netem: bench/internal/delayline passes the
# frames in user space). Unset: no delay.
LINK_DELAY=${LINK_DELAY:-}
# PROFILE=1 (environment): every measured new-connections run is also
# recorded by perf (the whole machine, its steady part) and its CPU sorted
# by kind of work (netfilter, bpf, vxlan, ...): in the log, and in
# profile-shares.tsv beside the perf-*.data files.
PROFILE=${PROFILE:-}
# OVERLAY_DECAP_IN_DEVICE=1: shunt-vxlan's agents leave the overlay's
# packets to the VXLAN device, the baseline of the uplink's decapsulation
# in BPF (rerun without it to compare).
OVERLAY_DECAP_IN_DEVICE=${OVERLAY_DECAP_IN_DEVICE:-}
# OVERLAY_ENCAP_IN_DEVICE=1: shunt-vxlan's agents leave the encapsulation
# to the VXLAN device, the baseline of the encapsulation in BPF.
OVERLAY_ENCAP_IN_DEVICE=${OVERLAY_ENCAP_IN_DEVICE:-}
# BPF_STATS=1: shunt's agents run with --bpf-stats, and each measured
# new-connections run of a shunt case logs its programs' runs per
# connection and time per run, by node and hook (bpf-stats.tsv). The
# statistics cost time per program run: such a run's rates are not the
# benchmark's.
BPF_STATS=${BPF_STATS:-}
[ -z "$PROFILE" ] || command -v perf >/dev/null || { echo "nodeport: perf is missing (PROFILE): the machine image brings it (Debian: linux-perf)" >&2; exit 1; }
# The smoke run goes through delay lines, so that make test proves them
# with every case's traffic (bench/crossnode.sh's smoke proves the bridge
# without them).
[ -z "$SMOKE" ] || LINK_DELAY=${LINK_DELAY:-50us}
if [ -n "$LINK_DELAY" ]; then
	command -v ethtool >/dev/null || PATH=$PATH:/usr/sbin command -v ethtool >/dev/null || { echo "nodeport: ethtool is missing (LINK_DELAY): run scripts/setup.sh" >&2; exit 1; }
fi
[ -z "$SMOKE" ] || SETTLE=0s SMOKE_FLAG=-smoke

cat >"$OUT/commands.txt" <<EOT
# ${BENCH_INVOCATION:-bench/nodeport.sh} (reps $REPS, duration $DURATION s, N = $SCALES)
bin/crossnode -nodeport -n $SCALES -reps $REPS -duration ${DURATION}s -settle $SETTLE $SMOKE_FLAG -bin bin -rows $ROWS -out $OUT${MEASURE:+ -measure $MEASURE}${LINK_DELAY:+ -link-delay $LINK_DELAY}${PROFILE:+ -profile}${BPF_STATS:+ -bpf-stats}${OVERLAY_DECAP_IN_DEVICE:+ -overlay-decap-in-device}${OVERLAY_ENCAP_IN_DEVICE:+ -overlay-encap-in-device}
# every command it ran, exactly and in order: commands-run.txt; in short, as bench/crossnode.sh without the floor and the policies, shunt's agents with --masquerade (pods get a default route), plus per case an external host:
ip netns add xbID-CASE-ext; ip -n xbID-CASE-ext link add ul0 type veth peer name eH netns xbID-CASE-ul; ip -n xbID-CASE-ext addr add 192.168.U.H/24 dev ul0   # one per measured case, on its underlay bridge: H = 200; shunt-native 201, shunt-native-dsr 202 and shunt-vxlan-dsr 203 on shunt-vxlan's
# measured Services: xbench (NodePort 30080 -> lab serve, 31111 -> sockperf; xbench-iperf 30201 -> server-0's iperf3), shunt-native: xbench-native 30081, 31112, xbench-native-iperf 30202 (annotated shunt.io/forwarding-mode: snat), shunt-native-dsr: xbench-native-dsr 30082, 31113, xbench-native-dsr-iperf 30203 (shunt.io/forwarding-mode: dsr), shunt-vxlan-dsr: xbench-vxlan-dsr 30083, 31114, xbench-vxlan-dsr-iperf 30204 (dsr; xbench's server pods)
nsenter --net=EXT timeout T taskset -c 0 sockperf ping-pong --tcp -i 192.168.U.1|192.168.U.2 -p 31111 -t $DURATION --msg-size 14 --full-rtt   # node 1 (remote backends), node 2 (local backends)
nsenter --net=EXT timeout T taskset -c 0 bin/connrate -target 192.168.U.1|192.168.U.2:30080 -workers 4 -duration ${DURATION}s
nsenter --net=EXT timeout T taskset -c 0 iperf3 -c 192.168.U.1 -p 30201 -t $DURATION -J
EOT
bin/crossnode -nodeport -n "$SCALES" -reps "$REPS" -duration "${DURATION}s" -settle "$SETTLE" $SMOKE_FLAG -bin bin -rows "$ROWS" -out "$OUT" ${MEASURE:+-measure "$MEASURE"} ${LINK_DELAY:+-link-delay "$LINK_DELAY"} ${PROFILE:+-profile} ${BPF_STATS:+-bpf-stats} ${OVERLAY_DECAP_IN_DEVICE:+-overlay-decap-in-device} ${OVERLAY_ENCAP_IN_DEVICE:+-overlay-encap-in-device} \
	> >(tee "$OUT/crossnode.log") 2>&1 &
XB=$!
trap 'kill -TERM $XB 2>/dev/null; wait $XB; exit 130' INT TERM
wait $XB || { echo "nodeport: bin/crossnode -nodeport failed (log: $OUT/crossnode.log)" >&2; exit 1; }
trap - INT TERM

NOTES=$OUT/notes.md
cat >"$NOTES" <<'EOT'
Two nodes on one machine, each a network namespace, joined by a bridge in a third (the underlay), and an external host (192.168.U.200) on that bridge; every case has its own namespaces (shunt-native's nodes are on shunt-vxlan's underlay, with an external host for shunt-native, .201, one for shunt-native-dsr, .202, and one for shunt-vxlan-dsr, .203: each measured case's client holds only its own closed connections). Ten server pods on node 2 (CPU 1), the client tools in the external host (CPU 0). `n` = Services besides the measured ones (ClusterIP, the ten servers as endpoints each: NodePorts are at most 2768 per cluster).

- kube-proxy-iptables / kube-proxy-nftables: the real kube-proxy (scripts/kube-build.sh) in both node namespaces, flannel's vxlan backend by hand between them (bench/crossnode.sh's floor); a NodePort flow is DNATed to a backend and, its backend on the other node, masqueraded to node 1's flannel address.
- shunt-vxlan / shunt-native: shunt's agent per node (`lab up --kubeconfig ... --tunnel vxlan` or `--routing native`, with `--masquerade`: without it pods route only the cluster's addresses, and a backend on the ingress node could not answer the outside client whose address it sees): the uplink program translates the flow in tc, the backend from the Service's Maglev table (16381 slots), SNAT to node 1's pod-network address when the backend is on node 2 (shunt-native's Services say so by their annotation `shunt.io/forwarding-mode: snat`); shunt-native-dsr: the same nodes and server pods through Services annotated `shunt.io/forwarding-mode: dsr` (the agents' `--nodeport-mode` is snat): the client's address kept, IPIP to node 2, the replies from node 2 straight to the external host; shunt-vxlan-dsr: the same through shunt-vxlan's nodes and server pods (Services annotated dsr; the IPIP goes between the nodes' underlay addresses beside the overlay, the replies leave node 2's uplink to the external host). Through node 2 (`*_local`) both go the same way (the backends are there): the difference between them there is the noise.

*_remote: through node 1's NodePort (every backend on node 2); *_local: through node 2's (every backend there). rr_*: sockperf ping-pong over one persistent TCP connection, 14-byte messages, full round trip, avg/p50/p99 in µs, tps = received / measured time; softirq: machine-wide softirq time per transaction. conn_rate_*: connect, 4-byte request, reply, close; 4 workers. throughput_remote: iperf3, one TCP stream through node 1's NodePort to server-0. *_steal: the CPU time (ms, all CPUs) the hypervisor took from this machine during that measurement (/proc/stat): a rate or tail that stands out in one repetition is read against it.
EOT
if [ -n "$LINK_DELAY" ]; then
	cat >>"$NOTES" <<EOT

**Link delay $LINK_DELAY.** Every link to the underlay bridge (both nodes' and the external host's) crosses a delay line (bench/internal/delayline: AF_PACKET sockets in the underlay namespace, one thread per direction holding each frame until its kernel arrival time plus $LINK_DELAY), so every hop between two hosts costs 2 × $LINK_DELAY plus the line's own wake-ups (tens of µs per crossing on a small VM, and some CPU the hosts would not spend on a real wire). The nodes' uplinks segment tunnelled frames (VXLAN, DSR's IPIP) in software, as without a NIC's tunnel offload: a packet socket cannot carry them whole. Through node 1, SNAT's round trip crosses 8 links (client → node 1 → node 2 → node 1 → client), DSR's 6 (the reply goes from node 2 straight to the client): this is what the DSR/SNAT ratio shows. Connection rates and throughput here measure the delay and the line, not the dataplanes; DSR's throughput most of all: its IPIP frames cross the line as 1 500-byte packets (segmented before it) where SNAT's cross as 64 KiB GSO frames, and the line's cost is per frame.
EOT
fi
if [ -f "$OUT/maglev.md" ]; then
	echo >>"$NOTES"
	cat "$OUT/maglev.md" >>"$NOTES"
fi
# The baseline: kube-proxy in iptables mode, or with MEASURE the first of
# the kube-proxy modes it measured (none: no ratio column).
BASELINE=
for c in kube-proxy-iptables kube-proxy-nftables; do
	if [ -z "$MEASURE" ] || [[ ",$MEASURE," == *,$c,* ]]; then
		BASELINE=$c
		break
	fi
done
# shunt's DSR beside its own SNAT, metric by metric (the issue's target:
# DSR RR avg <= 0.9x SNAT), when both were measured.
COMPARE=
for pair in shunt-native-dsr/shunt-native shunt-vxlan-dsr/shunt-vxlan; do
	if [ -z "$MEASURE" ] || { [[ ",$MEASURE," == *,${pair#*/},* ]] && [[ ",$MEASURE," == *,${pair%/*},* ]]; }; then
		COMPARE=${COMPARE:+$COMPARE,}$pair
	fi
done
# The targets' metrics per repetition against the baseline beside the
# steal of both runs.
finish "NodePort from outside: kube-proxy iptables and nftables, shunt VXLAN and native routing, each SNAT and DSR" "$BASELINE" ${COMPARE:+-compare "$COMPARE"} \
	-paired conn_rate_remote,conn_rate_local,rr_remote_p50
