#!/usr/bin/env bash
# Services benchmark: connecting to a ClusterIP with N other services
# programmed, side by side in one run, for N in 0 100 1000 10000 (each
# service with 10 endpoints; the measured service placed last in rule order):
#   direct    connect to a backend pod IP, no rules (the floor)
#   iptables  kube-proxy iptables layout (KUBE-SERVICES -> KUBE-SVC-* ->
#             statistic -> KUBE-SEP-* DNAT), loaded with iptables-restore
#   nftables  kube-proxy nftables layout (verdict map on daddr . proto .
#             dport -> per-service chain -> numgen -> dnat), loaded with nft -f
#   shunt     socket-layer load balancing, services applied through the agent
# The iptables and nftables rules live in the client pod's own network
# namespace (nat OUTPUT, as kube-proxy does for locally started connections),
# so the benchmark never touches the host's rules. shunt's socket hooks stay
# attached in every case; for the other cases they find no service and cost
# one hash lookup per connect, the floor included.
# Metrics: sockperf TCP request/response p50/p99 (persistent connection),
# new connections per second (connect, 4-byte request, reply, close; 4
# workers), programming time (full load; one service update at the largest N).
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE_OPT=--n
SCALE_LIST="0 100 1000 10000"
SMOKE_SCALE_LIST=10 # --smoke: one small scale (N > 0 takes every path N = 0 takes, and more)
source bench/lib.sh

bench_out services
go build -o bin/ ./bench/cmd/connrate ./bench/cmd/svcgen

INST="bsvc$$"
INST=${INST:0:10}
POD_CIDR=10.215.0.0/24
SVC_CIDR=10.216.0.0/16
MANIFEST=$OUT/pods.yaml
{
	printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: client}\nspec:\n  containers:\n  - {name: idle, command: [sleep, infinity]}\n'
	for i in $(seq 0 9); do
		cat <<YAML
---
apiVersion: v1
kind: Pod
metadata: {name: server-$i, labels: {app: server}}
spec:
  containers:
  - {name: sockperf, command: [taskset, -c, "1", sockperf, server, --tcp, -i, 0.0.0.0, -p, "11111"]}
  - {name: echo, command: [shunt, lab, serve, --tcp, "8080"]}
YAML
	done
} >"$MANIFEST"
lab_up "$INST" redirect-peer "$POD_CIDR" "$MANIFEST" --service-cidr "$SVC_CIDR"
ENDPOINTS=$($SHUNT --instance "$INST" get pods -o json | jq -r '[.items[] | select(.metadata.name | startswith("server")) | .status.podIP] | join(",")')
DIRECT=${ENDPOINTS%%,*}
CLIENT_NETNS=/run/netns/$INST-default-client
inns() { nsenter --net="$CLIENT_NETNS" "$@"; }
# Thousands of short connections a second from one client: let it reuse
# TIME_WAIT ports, or every case after the first runs out of ports.
inns sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="1024 65000"

cat >"$OUT/commands.txt" <<EOT
bin/shunt --instance $INST lab up --mode redirect-peer --pod-cidr $POD_CIDR --service-cidr $SVC_CIDR -f $MANIFEST
# per N, the same table three ways (measured service last):
bin/svcgen -n N -format iptables -measured ENDPOINTS | nsenter --net=CLIENT_NETNS iptables-restore
bin/svcgen -n N -format nft -measured ENDPOINTS | nsenter --net=CLIENT_NETNS nft -f -
bin/svcgen -n N -format yaml -measured ENDPOINTS > svc.yaml; bin/shunt apply --timing -f svc.yaml
# one update at the largest N, each repetition: bin/svcgen -n N -format yaml -update -measured ENDPOINTS > upd.yaml; bin/shunt apply --timing -f upd.yaml
# per case and repetition, from the client pod, to the measured service (or a backend for direct):
bin/shunt lab exec client -- taskset -c 0 sockperf ping-pong --tcp -i VIP -p 11111 -t $DURATION --msg-size 64 --full-rtt
bin/shunt lab exec client -- connrate -target VIP:8080 -workers 4 -duration ${DURATION}s
# direct: sockperf to one backend; connrate spread at random over the ten backends, as a service would
EOT

# shunt_apply FILE: apply it; print the command's wall-clock seconds and
# the milliseconds the agent says it took (check, program, persist).
shunt_apply() {
	local t0 t1 agent
	t0=$(date +%s%N)
	agent=$($SHUNT --instance "$INST" apply --timing -f "$1" 2>&1 >/dev/null | awk '/^agent took/ {print $3}')
	t1=$(date +%s%N)
	echo "$(awk -v ns=$((t1 - t0)) 'BEGIN { printf "%.4f", ns / 1e9 }') ${agent:-0}"
}

# measure CASE N REP IP [CONNECT TARGETS]
measure() {
	local c=$1 n=$2 rep=$3 ip=$4 targets=${5:-$4:8080} log steal0
	log=$OUT/sockperf-$c-$n-$rep.log
	steal0=$(steal_ms)
	in_pod "$INST" client taskset -c 0 sockperf ping-pong --tcp -i "$ip" -p 11111 -t "$DURATION" --msg-size 64 --full-rtt >"$log" 2>&1
	row "$c" tcp_rr_p50 us "$(awk '/percentile 50.000 =/ {print $NF}' "$log")" "$rep" "$n"
	row "$c" tcp_rr_p99 us "$(awk '/percentile 99.000 =/ {print $NF}' "$log")" "$rep" "$n"
	row "$c" tcp_rr_steal ms $(($(steal_ms) - steal0)) "$rep" "$n"
	local rate
	steal0=$(steal_ms)
	rate=$(in_pod "$INST" client connrate -target "$targets" -workers 4 -duration "${DURATION}s" | jq .rate)
	row "$c" conn_rate_steal ms $(($(steal_ms) - steal0)) "$rep" "$n"
	# Start every case with an empty connection-tracking table in the client
	# (the NAT baselines fill it; a full table would drop their packets).
	inns conntrack -F >/dev/null 2>&1 || true
	row "$c" conn_rate conn/s "$rate" "$rep" "$n"
	echo "n=$n rep $rep $c: p50 $(awk '/percentile 50.000 =/ {print $NF}' "$log")us, $rate conn/s"
}

# The measured VIP at each N (svcgen puts it right after the fillers).
vip_for() { bin/svcgen -n "$1" -format yaml -measured "$ENDPOINTS" | awk '/clusterIP/ {ip=$2} END {print ip}'; }

for n in $SCALE_LIST; do
	vip=$(vip_for "$n")
	bin/svcgen -n "$n" -format iptables -measured "$ENDPOINTS" >"$OUT/iptables-$n.rules"
	bin/svcgen -n "$n" -format nft -measured "$ENDPOINTS" >"$OUT/nft-$n.rules"
	bin/svcgen -n "$n" -format yaml -measured "$ENDPOINTS" >"$OUT/shunt-$n.yaml"
	for rep in $(seq "$REPS"); do
		measure direct "$n" "$rep" "$DIRECT" "$(echo "$ENDPOINTS" | sed 's/,/:8080,/g'):8080"

		t=$(timed inns iptables-restore "$OUT/iptables-$n.rules")
		row iptables load_time s "$t" "$rep" "$n"
		measure iptables "$n" "$rep" "$vip"
		if [ "$n" = "${SCALE_LIST##* }" ] && [ "$rep" = 1 ]; then
			# kube-proxy's iptables mode rewrites the table to change one service.
			row iptables update_time_ms ms "$(ms "$(timed inns iptables-restore "$OUT/iptables-$n.rules")")" "$rep" "$n"
		fi
		inns iptables -t nat -F
		inns iptables -t nat -X

		t=$(timed inns nft -f "$OUT/nft-$n.rules")
		row nftables load_time s "$t" "$rep" "$n"
		measure nftables "$n" "$rep" "$vip"
		if [ "$n" = "${SCALE_LIST##* }" ] && [ "$rep" = 1 ] && [ "$n" -gt 0 ]; then
			# One endpoint change: replace the last filler's first endpoint chain.
			row nftables update_time_ms ms "$(ms "$(timed inns nft add rule ip shunt-bench-kube-proxy sep-$((n - 1))-0-0 meta l4proto tcp dnat to 10.218.0.1:8080)")" "$rep" "$n"
		fi
		inns nft delete table ip shunt-bench-kube-proxy

		read -r t agent < <(shunt_apply "$OUT/shunt-$n.yaml")
		row shunt load_time s "$t" "$rep" "$n"
		row shunt load_time_agent s "$(awk -v m="$agent" 'BEGIN { printf "%.4f", m / 1000 }')" "$rep" "$n"
		measure shunt "$n" "$rep" "$vip"
		if [ "$n" = "${SCALE_LIST##* }" ] && [ "$n" -gt 0 ]; then
			# Every repetition (on a freshly loaded table) changes one endpoint
			# of the last filler service.
			bin/svcgen -n "$n" -format yaml -update -measured "$ENDPOINTS" >"$OUT/shunt-update.yaml"
			read -r t agent < <(shunt_apply "$OUT/shunt-update.yaml")
			row shunt update_time_ms ms "$(ms "$t")" "$rep" "$n"
			row shunt update_time_agent_ms ms "$agent" "$rep" "$n"
			# The floor of any `shunt` command on this machine: starting the process.
			row shunt cli_start_ms ms "$(ms "$(timed $SHUNT --help)")" "$rep" "$n"
		fi
		$SHUNT --instance "$INST" delete -f "$OUT/shunt-$n.yaml" >/dev/null
	done
done

NOTES=$OUT/notes.md
cat >"$NOTES" <<'EOT'
N counts the filler services; the measured service (two ports, ten real endpoints) comes after them.
load_time and update_time are wall-clock times of the commands shown (for shunt: `shunt apply` end to end: process start, YAML parsing, the request, the agent's work). *_agent is the time the agent reports for the same request (`shunt apply --timing`: decoding and validating, programming the maps, persisting), i.e. the programming time without the client. cli_start_ms is `shunt --help`: what starting the CLI process costs on this machine.
EOT
finish "Service load balancing at N services" direct \
	-paired tcp_rr_p50,tcp_rr_p99,conn_rate
