#!/usr/bin/env bash
# Per-packet processing cost (issue 18, seed 003's figures): pod -> pod on
# one node, a fixed rate of UDP datagrams, in each forwarding mode side by
# side in one run:
#   bridge         classic Linux bridge, no BPF (the baseline of the ratios)
#   redirect       tc + bpf_redirect
#   redirect-peer  tc + bpf_redirect_peer (shunt's default)
# Each case is its own shunt lab (instance pc<PID><letter>, pod CIDR
# 10.212.<i>.0/24): a server pod (sockperf server, UDP, pinned to CPU 1) and
# a client pod whose sockperf sends --rate datagrams/s of 64 bytes for
# --duration seconds, pinned to CPU 0.
#
# Method. The seed timed the kernel's functions with the function-graph
# tracer (rx: the softirq handling one packet, 79 -> 43 -> 14 us; tx:
# ~62 -> ~36 us). This kernel has no function-graph tracer and no kprobes,
# so the time comes from the kernel's CPU accounting instead, under a fixed
# packet rate: over the run, the softirq time of the whole machine divided
# by the datagrams the server's UDP layer received is the receive side's
# cost per packet (the host end of the client's veth, the bridge or the tc
# program, the server's veth, IP and UDP up to the socket: with veths all of
# it runs in softirq on the sender's CPU), and the system time of CPU 0,
# where only the sender runs, divided by the datagrams sent is the transmit
# side's (the sendto() path down to the veth). /proc/stat counts whole ticks
# (statistical sampling, this kernel has no IRQ time accounting), so only
# a long run at a steady rate gives stable figures, and absolute values are
# not the seed's function timings: compare the ratios between the modes.
#
# usage: bench/pktcost.sh [--reps N] [--duration S] [--quick]   (RATE=50000 datagrams/s)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh # REPS, DURATION, SHUNT, LABS, lab_up, in_pod, row, finish

RATE=${RATE:-50000}
PORT=11111
die() { echo "pktcost: $*" >&2; exit 1; }
bench_out pktcost
for tool in sockperf jq taskset getconf; do
	command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh"
done
[ -x "$SHUNT" ] || die "$SHUNT is missing: run make build"
HZ=$(getconf CLK_TCK)

MANIFEST=$OUT/pods.yaml
cat >"$MANIFEST" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: server}}
spec:
  containers:
  - {name: sockperf, command: [taskset, -c, "1", sockperf, server, -i, 0.0.0.0, -p, "$PORT"]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers:
  - {name: idle, command: [sleep, infinity]}
YAML

CASES=(bridge redirect redirect-peer)
declare -A INST TARGET LETTER=([bridge]=b [redirect]=d [redirect-peer]=p)
i=0
for c in "${CASES[@]}"; do
	inst="pc$$${LETTER[$c]}" # at most 10 characters: pc, a PID, a letter
	INST[$c]=$inst
	lab_up "$inst" "$c" "10.212.$i.0/24" "$MANIFEST"
	TARGET[$c]=$(pod_ip "$inst" server)
	[ -n "${TARGET[$c]}" ] && [ "${TARGET[$c]}" != null ] || die "case $c: the server pod has no address"
	i=$((i + 1))
done

cat >"$OUT/commands.txt" <<EOT
# ${BENCH_INVOCATION:-bench/pktcost.sh} (reps $REPS, duration $DURATION s, rate $RATE datagrams/s, CLK_TCK $HZ)
bin/shunt --instance INST lab up --mode MODE --pod-cidr 10.212.I.0/24 -f $MANIFEST   # MODE = bridge, redirect, redirect-peer
bin/shunt --instance INST lab exec client -- taskset -c 0 sockperf throughput -i SERVER -p $PORT --mps $RATE -m 64 -t $DURATION
# before and after each run: /proc/stat (cpu: softirq; cpu0: system), and Udp InDatagrams of /proc/net/snmp in the server pod
EOT

# stat FIELD LINE: a /proc/stat field (2 user, 4 system, 8 softirq) of a line (cpu, cpu0).
stat_field() { awk -v f="$1" -v l="$2" '$1 == l { print $f }' /proc/stat; }
udp_in() { in_pod "$1" server cat /proc/net/snmp | awk '$1 == "Udp:" && $2 ~ /^[0-9]+$/ { print $2 }'; }

for rep in $(seq 1 "$REPS"); do
	# Rotate the order so drift hits every case alike.
	order=("${CASES[@]:$(((rep - 1) % 3))}" "${CASES[@]:0:$(((rep - 1) % 3))}")
	for c in "${order[@]}"; do
		inst=${INST[$c]}
		in0=$(udp_in "$inst")
		soft0=$(stat_field 8 cpu) sys0=$(stat_field 4 cpu0)
		out=$(in_pod "$inst" client taskset -c 0 sockperf throughput -i "${TARGET[$c]}" -p "$PORT" --mps "$RATE" -m 64 -t "$DURATION" 2>&1) ||
			{ echo "$out" >&2; die "case $c: sockperf failed"; }
		soft1=$(stat_field 8 cpu) sys1=$(stat_field 4 cpu0)
		in1=$(udp_in "$inst")
		sent=$(echo "$out" | sed -n 's/.*Total of \([0-9]*\) messages sent.*/\1/p' | tail -n 1)
		got=$((in1 - in0))
		[ -n "$sent" ] && [ "$sent" -gt 0 ] && [ "$got" -gt 0 ] || { echo "$out" >&2; die "case $c: nothing sent or received"; }
		rx=$(awk -v t=$((soft1 - soft0)) -v hz="$HZ" -v n="$got" 'BEGIN { printf "%.3f", t * 1e6 / hz / n }')
		tx=$(awk -v t=$((sys1 - sys0)) -v hz="$HZ" -v n="$sent" 'BEGIN { printf "%.3f", t * 1e6 / hz / n }')
		loss=$(awk -v s="$sent" -v g="$got" 'BEGIN { printf "%.3f", (s - g) * 100 / s }')
		row "$c" rx_softirq_per_pkt us "$rx" "$rep"
		row "$c" tx_sys_per_pkt us "$tx" "$rep"
		row "$c" loss_pct "%" "$loss" "$rep"
		printf '%s rep %d %-14s rx softirq %s us/pkt, tx system %s us/pkt, %s sent, %s received (%s%% lost)\n' \
			"$(date +%T)" "$rep" "$c" "$rx" "$tx" "$sent" "$got" "$loss"
	done
done

NOTES=$OUT/notes.md
cat >"$NOTES" <<EOT
rx_softirq_per_pkt: softirq time of the whole machine (/proc/stat, tick-sampled) over the run / datagrams the server's UDP layer received (Udp InDatagrams in its namespace): the receive side of the forwarding path, which with veths runs in softirq on the sender's CPU. tx_sys_per_pkt: system time of CPU 0 (the sender's only) / datagrams sockperf sent: the sendto() path down to the client's veth. loss_pct: sent but not received. Rate $RATE datagrams/s of 64 bytes, $DURATION s per run; the seed's figures (function-graph tracer, per call) are not comparable in absolute terms, the ratios between modes are.
EOT
finish "Per-packet cost of pod-to-pod forwarding: bridge, bpf_redirect, bpf_redirect_peer (UDP at a fixed rate)" bridge
