#!/usr/bin/env bash
# Socket acceleration benchmark: TCP between local pods with and without
# shunt's sockops + sk_msg acceleration, every case side by side in ONE lab
# (run it through bench/run, which builds bin/ first):
#   loopback         client and server in the server pod over 127.0.0.1, accel
#                    off (the floor: the stack without any veth)
#   loopback-accel   the same, accel on (shunt accelerates loopback inside a
#                    pod, keyed by the pod's network namespace)
#   redirect-peer    client pod -> server pod IP, accel off: tc +
#                    bpf_redirect_peer (the baseline of the ratios)
#   accel            client pod -> server pod IP, accel on: sk_msg redirects
#                    sends into the peer socket's ingress queue
#   clusterip-accel  client pod -> ClusterIP -> server pod, accel on (socket-
#                    layer load balancing picks the backend at connect)
#   proxy            client pod -> a second server pod whose ports are
#                    redirected (shunt.io/inbound-redirect) to a transparent
#                    TCP proxy in that pod (HAProxy, one thread, mode tcp),
#                    which forwards over 127.0.0.1 to the same servers; accel
#                    off
#   proxy-accel      the same, accel on: both legs (client -> proxy between
#                    pods, proxy -> server on the pod's loopback) accelerated
# `shunt accel on|off` only affects new connections, so the script switches
# it before each case and every measurement opens its own connections.
# Metrics per case and repetition: sockperf TCP ping-pong (64-byte messages,
# --full-rtt) p50/p99; iperf3 single-stream throughput at payloads (-l) 64 B,
# 1448 B, 16 KiB, 64 KiB, 1 MiB (no -Z: plain send/recv); connrate new
# connections per second (connect, 4-byte request, reply, close; 4 workers).
# Every measurement checks the accel-redirected / accel-added counters
# (status -o json, direction sockmsg): they must grow in accel cases and stay
# put in the others, or the run fails. Cases rotate per repetition.
# Client pinned to CPU 0, servers to CPU 1 (as in forwarding.sh).
#
# usage: bench/sockaccel.sh [--reps N] [--duration S] [--quick] [--iperf-time S] [--payloads "64 1448 16K 64K 1M"]
set -euo pipefail
cd "$(dirname "$0")/.."

ORIG_ARGS="$*"
IPERF_TIME=""
PAYLOADS=""
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--iperf-time) IPERF_TIME=$2; shift 2 ;;
	--payloads) PAYLOADS=$2; shift 2 ;;
	-h | --help) sed -n '2,/^# usage/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) args+=("$1"); shift ;;
	esac
done
set -- "${args[@]+"${args[@]}"}"
source bench/lib.sh # REPS, DURATION, SHUNT, LABS, cleanup_labs, row, finish
# iperf3 runs once per payload: keep each run short (3 s; 1 s with --quick).
if [ -z "$IPERF_TIME" ]; then
	IPERF_TIME=3
	[ "$DURATION" -le 2 ] && IPERF_TIME=1
fi
# --smoke: one payload (the one the targets read).
[ -n "$PAYLOADS" ] || { PAYLOADS="64 1448 16K 64K 1M"; [ -z "$SMOKE" ] || PAYLOADS=64K; }
read -ra PAYLOAD_LIST <<<"$PAYLOADS"
CASES=(loopback loopback-accel redirect-peer accel clusterip-accel proxy proxy-accel)

die() { echo "sockaccel: FAIL: $*" >&2; exit 1; }
bench_out sockaccel
for tool in sockperf iperf3 jq taskset haproxy; do
	command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh"
done
go build -o bin/ ./bench/cmd/connrate

SOCKPERF_PORT=11111 IPERF_PORT=5201 ECHO_PORT=8080
PROXY_OFFSET=10000 # the proxied pod's proxy listens on PORT + PROXY_OFFSET
INST="${SOCKACCEL_INSTANCE:-bsa$$}"
INST=${INST:0:10}
POD_CIDR=10.214.0.0/24 # not policy.sh's pods nor ctflood's: smoke runs overlap (bench/smoke_test.go)
SVC_CIDR=10.222.0.0/16
MANIFEST=$OUT/pods.yaml
HAPROXY_CFG=$(realpath "$OUT")/haproxy.cfg
{
	printf 'global\n  nbthread 1\n  maxconn 4000\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n'
	for p in $SOCKPERF_PORT $IPERF_PORT $ECHO_PORT; do
		printf 'listen p%s\n  bind 0.0.0.0:%s\n  server s 127.0.0.1:%s\n' "$p" $((p + PROXY_OFFSET)) "$p"
	done
} >"$HAPROXY_CFG"
cat >"$MANIFEST" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: server}}
spec:
  containers:
  - {name: sockperf, command: [taskset, -c, "1", sockperf, server, --tcp, -i, 0.0.0.0, -p, "$SOCKPERF_PORT"]}
  - {name: iperf3, command: [taskset, -c, "1", iperf3, -s, -p, "$IPERF_PORT"]}
  - {name: echo, command: [taskset, -c, "1", shunt, lab, serve, --tcp, "$ECHO_PORT"]}
---
apiVersion: v1
kind: Pod
metadata:
  name: proxied
  labels: {app: proxied}
  annotations: {shunt.io/inbound-redirect: "$SOCKPERF_PORT:$((SOCKPERF_PORT + PROXY_OFFSET)),$IPERF_PORT:$((IPERF_PORT + PROXY_OFFSET)),$ECHO_PORT:$((ECHO_PORT + PROXY_OFFSET))"}
spec:
  containers:
  - {name: sockperf, command: [taskset, -c, "1", sockperf, server, --tcp, -i, 0.0.0.0, -p, "$SOCKPERF_PORT"]}
  - {name: iperf3, command: [taskset, -c, "1", iperf3, -s, -p, "$IPERF_PORT"]}
  - {name: echo, command: [taskset, -c, "1", shunt, lab, serve, --tcp, "$ECHO_PORT"]}
  - {name: proxy, command: [taskset, -c, "1", haproxy, -db, -f, "$HAPROXY_CFG"]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers:
  - {name: idle, command: [sleep, infinity]}
---
apiVersion: v1
kind: Service
metadata: {name: server}
spec:
  selector: {app: server}
  ports:
  - {name: sockperf, port: $SOCKPERF_PORT, targetPort: $SOCKPERF_PORT}
  - {name: iperf3, port: $IPERF_PORT, targetPort: $IPERF_PORT}
  - {name: echo, port: $ECHO_PORT, targetPort: $ECHO_PORT}
YAML

# lab_up registers the lab; lib.sh's EXIT trap removes it, also on failure.
trap 'exit 130' INT
trap 'exit 143' TERM
echo "sockaccel: lab $INST; cases ${CASES[*]}; $REPS repetitions; sockperf/connrate $DURATION s, iperf3 $IPERF_TIME s per payload (${PAYLOAD_LIST[*]}); output in $OUT"
lab_up "$INST" redirect-peer "$POD_CIDR" "$MANIFEST" --service-cidr "$SVC_CIDR"
POD_IP=$(pod_ip "$INST" server)
PROXIED_IP=$(pod_ip "$INST" proxied)
[[ $PROXIED_IP =~ ^[0-9.]+$ ]] || die "no proxied pod IP ($PROXIED_IP)"
VIP=$($SHUNT --instance "$INST" get services server -o json | jq -r .spec.clusterIP)
[[ $POD_IP =~ ^[0-9.]+$ && $VIP =~ ^[0-9.]+$ ]] || die "no server pod IP ($POD_IP) or ClusterIP ($VIP)"
# connrate opens thousands of short connections: let both ends reuse TIME_WAIT ports.
for p in client server proxied; do
	nsenter --net="/run/netns/$INST-default-$p" sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="1024 65000"
done

declare -A FROM TARGET ACCEL
FROM[loopback]=server TARGET[loopback]=127.0.0.1 ACCEL[loopback]=off
FROM[loopback-accel]=server TARGET[loopback-accel]=127.0.0.1 ACCEL[loopback-accel]=on
FROM[proxy]=client TARGET[proxy]=$PROXIED_IP ACCEL[proxy]=off
FROM[proxy-accel]=client TARGET[proxy-accel]=$PROXIED_IP ACCEL[proxy-accel]=on
FROM[redirect-peer]=client TARGET[redirect-peer]=$POD_IP ACCEL[redirect-peer]=off
FROM[accel]=client TARGET[accel]=$POD_IP ACCEL[accel]=on
FROM[clusterip-accel]=client TARGET[clusterip-accel]=$VIP ACCEL[clusterip-accel]=on

# cexec CASE LIMIT CMD...: run CMD in the case's client pod, killed after LIMIT s
# (inside the pod, and the lab exec itself a few seconds later).
cexec() {
	local c=$1 limit=$2
	shift 2
	timeout -k 3 $((limit + 5)) $SHUNT --instance "$INST" lab exec "${FROM[$c]}" -- timeout -k 2 "$limit" "$@"
}

# counter REASON: the sockmsg counter's packets (0 when absent).
counter() {
	$SHUNT --instance "$INST" status -o json |
		jq -r --arg r "$1" '[.counters[]? | select(.direction == "sockmsg" and .reason == $r) | .packets] | add // 0'
}
accel_sockets() { $SHUNT --instance "$INST" status -o json | jq -r '.socketAcceleration.sockets // 0'; }

# check_delta CASE WHAT BEFORE AFTER: accel cases must move the counter, others must not.
check_delta() {
	local c=$1 what=$2 d=$(($4 - $3))
	echo "$c: $what accel-redirected +$d" >>"$OUT/counters.log"
	if [ "${ACCEL[$c]}" = on ] && [ "$d" -le 0 ]; then
		die "case $c ($what): accel-redirected did not grow ($3 -> $4): the connection was not accelerated"
	fi
	if [ "${ACCEL[$c]}" = off ] && [ "$d" -ne 0 ]; then
		die "case $c ($what): accel-redirected grew by $d with acceleration off"
	fi
	LAST_DELTA=$d
}

percentile() {
	local v
	v=$(awk -v p="percentile $2 =" 'index($0, p) { print $NF }' "$1")
	[[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "no 'percentile $2' in $1 (sockperf output format changed?)"
	echo "$v"
}

# metric name for an iperf3 payload: 64 -> tput_64B, 16K -> tput_16KiB
pname() { case $1 in *K) echo "tput_${1%K}KiB" ;; *M) echo "tput_${1%M}MiB" ;; *) echo "tput_${1}B" ;; esac; }

wait_ready() {
	local c try
	for c in "${CASES[@]}"; do
		for try in $(seq 75); do
			cexec "$c" 5 bash -c "exec 3<>/dev/tcp/${TARGET[$c]}/$SOCKPERF_PORT && exec 4<>/dev/tcp/${TARGET[$c]}/$IPERF_PORT && exec 5<>/dev/tcp/${TARGET[$c]}/$ECHO_PORT" 2>/dev/null && break
			[ "$try" = 75 ] && die "case $c: servers on ${TARGET[$c]} do not answer after 15 s"
			sleep 0.2
		done
	done
}

# measure CASE REP
measure() {
	local c=$1 rep=$2 t=${TARGET[$1]} log json p50 p99 gbps before after socks l try rate line
	$SHUNT --instance "$INST" accel "${ACCEL[$c]}" >/dev/null
	sleep 0.3 # let the server close previous connections
	line="rep $rep $(printf '%-15s' "$c") accel ${ACCEL[$c]}:"

	log=$OUT/sockperf-$c-$rep.log
	before=$(counter accel-redirected)
	# sample the sockhash while the connection is up
	(sleep "$(awk -v d="$DURATION" 'BEGIN { print d / 2 }')"; accel_sockets >"$OUT/.socks") &
	local sampler=$!
	cexec "$c" $((DURATION + 30)) taskset -c 0 sockperf ping-pong --tcp -i "$t" -p "$SOCKPERF_PORT" \
		-t "$DURATION" --msg-size 64 --full-rtt >"$log" 2>&1 ||
		{ rc=$?; tail -5 "$log" >&2; die "sockperf exited $rc for case $c, repetition $rep (log: $log)"; }
	wait "$sampler" || true
	socks=$(cat "$OUT/.socks" 2>/dev/null || echo "?")
	after=$(counter accel-redirected)
	check_delta "$c" sockperf "$before" "$after"
	p50=$(percentile "$log" 50.000)
	p99=$(percentile "$log" 99.000)
	row "$c" tcp_rr_p50 us "$p50" "$rep"
	row "$c" tcp_rr_p99 us "$p99" "$rep"
	line+=" rr p50 $p50 p99 $p99 µs (redirected +$LAST_DELTA, sockhash $socks mid-run);"
	[ "${ACCEL[$c]}" = on ] && [ "$socks" = 0 ] && die "case $c: sockhash empty while sockperf ran"

	for l in "${PAYLOAD_LIST[@]}"; do
		json=$OUT/iperf3-$c-$l-$rep.json
		before=$(counter accel-redirected)
		local congested=$(counter accel-congested)
		for try in 1 2 3; do
			cexec "$c" $((IPERF_TIME + 20)) taskset -c 0 iperf3 -c "$t" -p "$IPERF_PORT" -t "$IPERF_TIME" -l "$l" -J >"$json" 2>"$json.err" && break
			echo "sockaccel: iperf3 -l $l case $c try $try failed (rc $?): $(jq -r '.error // empty' "$json" 2>/dev/null) $(cat "$json.err")" | tee -a "$OUT/errors.log" >&2
			[ "$try" = 3 ] && die "iperf3 -l $l failed 3 times for case $c, repetition $rep"
			sleep 1
		done
		rm -f "$json.err"
		after=$(counter accel-redirected)
		check_delta "$c" "iperf3 -l $l" "$before" "$after"
		# sockets that moved to the stack because their reader lagged (issue 31)
		echo "$c: iperf3 -l $l accel-congested +$(($(counter accel-congested) - congested))" >>"$OUT/counters.log"
		gbps=$(jq -r '.end.sum_received.bits_per_second // empty | . / 1e9' "$json")
		[[ $gbps =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || die "no end.sum_received.bits_per_second in $json"
		row "$c" "$(pname "$l")" Gbit/s "$gbps" "$rep"
		line+=" $l $(printf '%.2f' "$gbps")"
	done
	line+=" Gbit/s;"

	json=$OUT/connrate-$c-$rep.json
	before=$(counter accel-added)
	local rb
	rb=$(counter accel-redirected)
	cexec "$c" $((DURATION + 30)) taskset -c 0 connrate -target "$t:$ECHO_PORT" -workers 4 -duration "${DURATION}s" >"$json" ||
		die "connrate failed for case $c, repetition $rep: $(cat "$json")"
	after=$(counter accel-added)
	check_delta "$c" connrate "$rb" "$(counter accel-redirected)"
	echo "$c: connrate accel-added +$((after - before))" >>"$OUT/counters.log"
	rate=$(jq -r .rate "$json")
	[ "$(jq -r .failed "$json")" = 0 ] || echo "sockaccel: case $c connrate: $(jq -c '{failed, first_error}' "$json")" | tee -a "$OUT/errors.log" >&2
	row "$c" conn_rate conn/s "$rate" "$rep"
	line+=" $(printf '%.0f' "$rate") conn/s (accel-added +$((after - before)))"
	echo "$line"
}

cat >"$OUT/commands.txt" <<EOT
# ${BENCH_INVOCATION:-bench/sockaccel.sh${ORIG_ARGS:+ $ORIG_ARGS}} (reps $REPS, sockperf/connrate $DURATION s, iperf3 $IPERF_TIME s per payload)
bin/shunt --instance $INST lab up --mode redirect-peer --pod-cidr $POD_CIDR --service-cidr $SVC_CIDR -f $MANIFEST
# server pod $POD_IP: taskset -c 1 sockperf server --tcp -p $SOCKPERF_PORT; taskset -c 1 iperf3 -s -p $IPERF_PORT; taskset -c 1 shunt lab serve --tcp $ECHO_PORT; Service server ClusterIP $VIP
# proxied pod $PROXIED_IP: the same servers, annotation shunt.io/inbound-redirect PORT:PORT+$PROXY_OFFSET, and taskset -c 1 haproxy -db -f haproxy.cfg (mode tcp, nbthread 1, each PORT+$PROXY_OFFSET -> 127.0.0.1:PORT)
# before each case: bin/shunt --instance $INST accel on|off   (loopback, redirect-peer, proxy: off; the *-accel cases and accel: on)
# per case and repetition (FROM = server for loopback*, client otherwise; TARGET = 127.0.0.1 | $POD_IP | $VIP | $PROXIED_IP):
bin/shunt --instance $INST lab exec FROM -- taskset -c 0 sockperf ping-pong --tcp -i TARGET -p $SOCKPERF_PORT -t $DURATION --msg-size 64 --full-rtt
bin/shunt --instance $INST lab exec FROM -- taskset -c 0 iperf3 -c TARGET -p $IPERF_PORT -t $IPERF_TIME -l L -J   # L in ${PAYLOAD_LIST[*]}
bin/shunt --instance $INST lab exec FROM -- taskset -c 0 connrate -target TARGET:$ECHO_PORT -workers 4 -duration ${DURATION}s
# around each: bin/shunt --instance $INST status -o json | jq '.counters[] | select(.direction == "sockmsg")'  (accel-redirected must grow iff accel is on)
EOT

wait_ready
ncases=${#CASES[@]}
for rep in $(seq "$REPS"); do
	for i in $(seq 0 $((ncases - 1))); do
		measure "${CASES[$(((i + rep - 1) % ncases))]}" "$rep"
	done
done
$SHUNT --instance "$INST" accel off >/dev/null

# --- targets, from the medians -------------------------------------------------
med() { # med CASE METRIC
	jq -rs --arg c "$1" --arg m "$2" '[.[] | select(.case == $c and .metric == $m) | .value] | sort |
		if length == 0 then "null" elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end' "$ROWS"
}
judge() { # judge NAME VALUE OP LIMIT
	if awk -v v="$2" -v l="$4" -v op="$3" 'BEGIN { exit !((op == "<=" && v <= l) || (op == ">=" && v >= l)) }'; then echo "met"; else echo "NOT met"; fi
}
rr_ratio=$(awk -v a="$(med accel tcp_rr_p50)" -v b="$(med redirect-peer tcp_rr_p50)" 'BEGIN { printf "%.2f", a / b }')
tp_ratio=$(awk -v a="$(med accel tput_64KiB)" -v b="$(med loopback tput_64KiB)" 'BEGIN { printf "%.2f", a / b }')
cr_ratio=$(awk -v a="$(med accel conn_rate)" -v b="$(med redirect-peer conn_rate)" 'BEGIN { printf "%.2f", a / b }')
lo_ratio=$(awk -v a="$(med loopback-accel tcp_rr_p50)" -v b="$(med loopback tcp_rr_p50)" 'BEGIN { printf "%.2f", a / b }')
px_ratio=$(awk -v a="$(med proxy-accel tput_64KiB)" -v b="$(med proxy tput_64KiB)" 'BEGIN { printf "%.2f", a / b }')
px_base=$(awk -v a="$(med proxy-accel tput_64KiB)" -v b="$(med redirect-peer tput_64KiB)" 'BEGIN { printf "%.2f", a / b }')
TARGETS="targets: accel RR p50 = ${rr_ratio}× redirect-peer (target ≤ 0.70×: $(judge x "$rr_ratio" "<=" 0.70)); accel 64 KiB throughput = ${tp_ratio}× loopback (target ≥ 1.00×: $(judge x "$tp_ratio" ">=" 1.0)); accel connection rate = ${cr_ratio}× redirect-peer (target ≥ 0.95×: $(judge x "$cr_ratio" ">=" 0.95)); proxy + accel 64 KiB = ${px_ratio}× proxy alone (target ≥ 1.50×: $(judge x "$px_ratio" ">=" 1.5)) and ${px_base}× no proxy (target ≥ 1.00×: $(judge x "$px_base" ">=" 1.0)); loopback RR p50 accelerated = ${lo_ratio}× loopback (published: 0.68×)"
[ "$REPS" = 1 ] && TARGETS+=" (1 repetition: indicative only)"

NOTES=$OUT/notes.md
cat >"$NOTES" <<EOT
$TARGETS.
One lab (redirect-peer forwarding); \`shunt accel on|off\` switched before each case (it applies to new connections; every measurement opens its own). Cases: loopback = sockperf/iperf3/connrate inside the server pod over 127.0.0.1, accel off (the floor); loopback-accel = the same, accel on (loopback inside a pod is accelerated, keyed by its network namespace); redirect-peer = client pod -> server pod IP, accel off (the baseline); accel = the same, accel on; clusterip-accel = client pod -> ClusterIP $VIP -> server pod, accel on; proxy = client pod -> proxied pod $PROXIED_IP, whose ports the socket hooks redirect (shunt.io/inbound-redirect) to HAProxy (mode tcp, one thread) in that pod, which forwards over the pod's loopback to the same servers, accel off; proxy-accel = the same, accel on (both legs accelerated).
tcp_rr_p50/p99: sockperf TCP ping-pong, 64-byte messages, full round trip. tput_L: iperf3, one TCP stream, -l L (send size), $IPERF_TIME s, end.sum_received (no -Z). conn_rate: bench/cmd/connrate, 4 workers, connect + 4-byte request + reply + close. Client pinned to CPU 0, servers to CPU 1.
Every measurement checked the sockmsg counters: accel-redirected grew in every accel case and stayed put otherwise (counters.log; the run fails otherwise). Order within a repetition rotates. Raw values: results.json; min/max: medians.json; tool output: sockperf-CASE-REP.log, iperf3-CASE-L-REP.json, connrate-CASE-REP.json.
EOT
rm -f "$OUT/.socks"
finish "Socket acceleration (sockops + sk_msg)" redirect-peer -verdict auto -floor loopback
echo "$TARGETS"
