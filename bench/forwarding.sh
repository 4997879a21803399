#!/usr/bin/env bash
# Forwarding benchmark: pod -> pod on one node, side by side in one run:
#   loopback       client and server in one pod over 127.0.0.1 (the floor)
#   bridge         classic Linux bridge, no BPF
#   routed         host routing over the veths, no BPF
#   redirect       tc + bpf_redirect
#   redirect-peer  tc + bpf_redirect_peer (shunt's default)
# Metrics: sockperf TCP request/response round trip (64-byte messages) p50 and
# p99, and iperf3 single-stream TCP throughput. Cases are interleaved within
# each repetition so machine drift hits all of them alike; medians reported.
# Client and server are pinned to different CPUs (client 0, server 1): on a
# 2-core machine, letting the scheduler move them adds more noise than the
# differences being measured.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

OUT=bench/out/forwarding
mkdir -p "$OUT"
ROWS=$OUT/rows.jsonl
: >"$ROWS"
: >"$OUT/commands.txt"

MANIFEST=$OUT/pods.yaml
cat >"$MANIFEST" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: server}
spec:
  containers:
  - {name: sockperf, command: [taskset, -c, "1", sockperf, server, --tcp, -i, 0.0.0.0, -p, "11111"]}
  - {name: iperf3, command: [taskset, -c, "1", iperf3, -s, -p, "5201"]}
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - {name: idle, command: [sleep, infinity]}
YAML

MODES=(bridge routed redirect redirect-peer)
declare -A INST TARGET
i=0
for mode in "${MODES[@]}"; do
	inst="bfwd$$$i"
	inst=${inst:0:10}
	lab_up "$inst" "$mode" "10.213.$i.0/24" "$MANIFEST"
	INST[$mode]=$inst
	TARGET[$mode]=$(pod_ip "$inst" server)
	echo "bin/shunt --instance $inst lab up --mode $mode --pod-cidr 10.213.$i.0/24 -f $MANIFEST" >>"$OUT/commands.txt"
	i=$((i + 1))
done
# The floor: both ends inside the redirect-peer lab's server pod.
INST[loopback]=${INST[redirect-peer]}
TARGET[loopback]=127.0.0.1
CASES=(loopback "${MODES[@]}")
declare -A FROM_POD=([loopback]=server)

cat >>"$OUT/commands.txt" <<EOT
# per case and repetition (client pod; loopback: inside the server pod):
bin/shunt --instance INST lab exec client -- taskset -c 0 sockperf ping-pong --tcp -i IP -p 11111 -t $DURATION --msg-size 64 --full-rtt
bin/shunt --instance INST lab exec client -- taskset -c 0 iperf3 -c IP -p 5201 -t $DURATION -J
EOT

# Wait until both servers answer in every lab.
for c in "${CASES[@]}"; do
	from=${FROM_POD[$c]:-client}
	for try in $(seq 50); do
		in_pod "${INST[$c]}" "$from" sockperf ping-pong --tcp -i "${TARGET[$c]}" -p 11111 -t 1 >/dev/null 2>&1 && break
		sleep 0.2
	done
done

for rep in $(seq "$REPS"); do
	for c in "${CASES[@]}"; do
		from=${FROM_POD[$c]:-client}
		log=$OUT/sockperf-$c-$rep.log
		in_pod "${INST[$c]}" "$from" taskset -c 0 sockperf ping-pong --tcp -i "${TARGET[$c]}" -p 11111 -t "$DURATION" --msg-size 64 --full-rtt >"$log" 2>&1
		p50=$(awk '/percentile 50.000 =/ {print $NF}' "$log")
		p99=$(awk '/percentile 99.000 =/ {print $NF}' "$log")
		row "$c" tcp_rr_p50 us "$p50" "$rep"
		row "$c" tcp_rr_p99 us "$p99" "$rep"

		json=$OUT/iperf3-$c-$rep.json
		in_pod "${INST[$c]}" "$from" taskset -c 0 iperf3 -c "${TARGET[$c]}" -p 5201 -t "$DURATION" -J >"$json"
		gbps=$(jq '.end.sum_received.bits_per_second / 1e9' "$json")
		row "$c" throughput Gbit/s "$gbps" "$rep"
		echo "rep $rep $c: p50 ${p50}us p99 ${p99}us ${gbps} Gbit/s"
	done
done

NOTES=$OUT/notes.md
jq -s -r '
  def med: sort | if length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end;
  group_by(.case + "/" + .metric) | map({key: (.[0].case + "/" + .[0].metric), value: (map(.value) | med)}) | from_entries as $m
  | ["bridge", "routed", "redirect", "redirect-peer"] as $c
  | ($c | map({c: ., v: $m[. + "/tcp_rr_p50"]}) | min_by(.v)) as $lat
  | ($c | map({c: ., v: $m[. + "/throughput"]}) | max_by(.v)) as $tp
  | "Lowest non-loopback p50: **\($lat.c)** (redirect-peer p50 \(($m["redirect-peer/tcp_rr_p50"] / $m["bridge/tcp_rr_p50"] * 100 | round) / 100)× bridge, \(($m["redirect-peer/tcp_rr_p50"] / $m["routed/tcp_rr_p50"] * 100 | round) / 100)× routed); "
    + "highest throughput: **\($tp.c)** (redirect-peer \(($m["redirect-peer/throughput"] / $m["bridge/throughput"] * 100 | round) / 100)× bridge)."
' "$ROWS" >"$NOTES"
finish "Pod-to-pod forwarding" bridge
