#!/usr/bin/env bash
# Flow observability benchmark: what flow events cost the datapath, side by
# side in one run on the same two pods, with the agent reading the ring
# buffer as in production:
#   off      no flow events
#   default  drops, connection starts and ends, service translations
#   all      every packet traced
# Metrics: sockperf TCP request/response p50/p99 (persistent connection:
# under default sampling it emits nothing per packet) and new connections
# per second (connect, 4-byte request, reply, close; 4 workers: under
# default sampling every connection emits its start and end events).
# The order of the cases rotates between repetitions.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

bench_out observe
go build -o bin/ ./bench/cmd/connrate

INST="bobs$$"
INST=${INST:0:10}
MANIFEST=$OUT/pods.yaml
cat >"$MANIFEST" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - {name: idle, command: [sleep, infinity]}
---
apiVersion: v1
kind: Pod
metadata: {name: server}
spec:
  containers:
  - {name: sockperf, command: [taskset, -c, "1", sockperf, server, --tcp, -i, 0.0.0.0, -p, "11111"]}
  - {name: echo, command: [shunt, lab, serve, --tcp, "8080"]}
YAML
lab_up "$INST" redirect-peer 10.219.0.0/24 "$MANIFEST" --service-cidr 10.220.0.0/16
SERVER=$(pod_ip "$INST" server)
# The server pod runs before its programs listen: wait for both ports, or
# the first case measures a refused connection (seen in CI's smoke run).
for _ in $(seq 100); do
	in_pod "$INST" client bash -c "exec 3<>/dev/tcp/$SERVER/11111 && exec 4<>/dev/tcp/$SERVER/8080" 2>/dev/null && break
	sleep 0.1
done
nsenter --net="/run/netns/$INST-default-client" sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="1024 65000"

cat >"$OUT/commands.txt" <<EOT
bin/shunt --instance $INST lab up --mode redirect-peer --pod-cidr 10.219.0.0/24 -f $MANIFEST
# per repetition, per case (order rotating):
bin/shunt --instance $INST flow-sampling CASE
bin/shunt lab exec client -- taskset -c 0 sockperf ping-pong --tcp -i $SERVER -p 11111 -t $DURATION --msg-size 64 --full-rtt
bin/shunt lab exec client -- connrate -target $SERVER:8080 -workers 4 -duration ${DURATION}s
EOT

cases=(off default all)
for rep in $(seq "$REPS"); do
	for i in 0 1 2; do
		c=${cases[$(((i + rep) % 3))]}
		$SHUNT --instance "$INST" flow-sampling "$c" >/dev/null
		log=$OUT/sockperf-$c-$rep.log
		in_pod "$INST" client taskset -c 0 sockperf ping-pong --tcp -i "$SERVER" -p 11111 -t "$DURATION" --msg-size 64 --full-rtt >"$log" 2>&1
		p50=$(awk '/percentile 50.000 =/ {print $NF}' "$log")
		p99=$(awk '/percentile 99.000 =/ {print $NF}' "$log")
		row "$c" tcp_rr_p50 us "$p50" "$rep"
		row "$c" tcp_rr_p99 us "$p99" "$rep"
		rate=$(in_pod "$INST" client connrate -target "$SERVER:8080" -workers 4 -duration "${DURATION}s" | jq .rate)
		row "$c" conn_rate conn/s "$rate" "$rep"
		echo "rep $rep $c: p50 ${p50}us p99 ${p99}us, $rate conn/s"
	done
done
$SHUNT --instance "$INST" status -o json | jq '.flows' >"$OUT/flow-stats.json"

NOTES=$OUT/notes.md
cat >"$NOTES" <<EOT
Flow events read by the running agent into its history (as in production); flow totals at the end of the run: $(jq -c . "$OUT/flow-stats.json").
Targets (issue): default sampling within 3% of off, every-packet tracing within 10% (request/response p50).
EOT
finish "Flow events: off vs default sampling vs every packet" off
