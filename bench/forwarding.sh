#!/usr/bin/env bash
# Forwarding benchmark: pod -> pod on one node, every case side by side in one
# run (run it through bench/run, which builds bin/ first):
#   loopback       client and server in one pod over 127.0.0.1 (the floor)
#   bridge         classic Linux bridge, no BPF (the baseline of the ratios)
#   routed         host routing over the veths, no BPF
#   redirect       tc + bpf_redirect
#   redirect-peer  tc + bpf_redirect_peer (shunt's default)
#   veth           (not in the default set) two hand-made network namespaces
#                  joined by one veth pair, no shunt at all: a sanity check of
#                  the kernel itself, and the way to run this script without
#                  bin/shunt (--cases "veth")
# Each lab case is its own shunt lab (instance bf<PID><letter>, pod CIDR
# 10.211.<i>.0/24) with a server pod (sockperf + iperf3 servers) and an idle
# client pod; labs and namespaces are removed on exit, also on failure.
# Metrics per case and repetition: sockperf TCP ping-pong round trip (64-byte
# messages, --full-rtt) p50 and p99, and iperf3 single-stream TCP throughput.
# Cases are interleaved within each repetition, and the starting case rotates
# from one repetition to the next, so drift hits every case alike; medians
# over the repetitions are reported.
# Client and server are pinned to different CPUs (client 0, server 1): on a
# 2-core machine, letting the scheduler move them adds more noise than the
# differences being measured.
#
# usage: bench/forwarding.sh [--reps N] [--duration S] [--quick] [--cases "A B ..."]
set -euo pipefail
cd "$(dirname "$0")/.."

ORIG_ARGS="$*"
ALL_CASES="loopback bridge routed redirect redirect-peer"
CASES_ARG=$ALL_CASES
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--cases) CASES_ARG=$2; shift 2 ;;
	-h | --help) sed -n '2,/^# usage/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) args+=("$1"); shift ;;
	esac
done
set -- "${args[@]+"${args[@]}"}"
source bench/lib.sh # REPS, DURATION, SHUNT, LABS, cleanup_labs, row, finish
read -ra CASES <<<"$CASES_ARG"

die() { echo "forwarding: $*" >&2; exit 1; }
bench_out forwarding
echo "# ${BENCH_INVOCATION:-bench/forwarding.sh${ORIG_ARGS:+ $ORIG_ARGS}} (reps $REPS, duration $DURATION s)" >"$OUT/commands.txt"

SOCKPERF_PORT=11111
IPERF_PORT=5201

for tool in sockperf iperf3 jq taskset; do
	command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh (or apt-get install -y $tool)"
done

# Per case: how to run a command on the client side, and the server address.
declare -A KIND INST FROM TARGET NETNS SERVER_PIDS

# client_exec CASE CMD...: run CMD where the case's client lives.
client_exec() {
	local c=$1
	shift
	case ${KIND[$c]} in
	lab) $SHUNT --instance "${INST[$c]}" lab exec "${FROM[$c]}" -- "$@" ;;
	netns) ip netns exec "${NETNS[$c]}" "$@" ;;
	esac
}

# client_cmd CASE: the client-side prefix, as commands.txt shows it.
client_cmd() {
	case ${KIND[$1]} in
	lab) echo "bin/shunt --instance ${INST[$1]} lab exec ${FROM[$1]} --" ;;
	netns) echo "ip netns exec ${NETNS[$1]}" ;;
	esac
}

# --- lab cases: one shunt lab per case ---------------------------------------

MANIFEST=$OUT/pods.yaml
cat >"$MANIFEST" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: server}}
spec:
  containers:
  - {name: sockperf, command: [taskset, -c, "1", sockperf, server, --tcp, -i, 0.0.0.0, -p, "$SOCKPERF_PORT"]}
  - {name: iperf3, command: [taskset, -c, "1", iperf3, -s, -p, "$IPERF_PORT"]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers:
  - {name: idle, command: [sleep, infinity]}
YAML

# setup_lab CASE MODE LETTER INDEX [FROM_POD TARGET]: start the case's lab.
# The instance name is bf + this script's PID + a letter (at most 10
# characters, unique while this script runs); a lab of that name can only be
# a leftover of an earlier run that had the same PID, so it is removed first.
setup_lab() {
	local c=$1 mode=$2 letter=$3 idx=$4 from=${5:-client} target=${6:-}
	local inst="bf$$$letter" cidr="10.211.$idx.0/24"
	[ -x "$SHUNT" ] || die "$SHUNT is missing: run make build (or use --cases veth)"
	KIND[$c]=lab INST[$c]=$inst FROM[$c]=$from
	LABS+=("$inst")
	$SHUNT --instance "$inst" lab down >/dev/null 2>&1 || true
	echo "bin/shunt --instance $inst lab up --mode $mode --pod-cidr $cidr -f $MANIFEST" >>"$OUT/commands.txt"
	$SHUNT --instance "$inst" lab up --mode "$mode" --pod-cidr "$cidr" -f "$MANIFEST" >"$OUT/lab-$c.log" 2>&1 ||
		{ cat "$OUT/lab-$c.log" >&2; die "lab up for case $c failed"; }
	if [ -z "$target" ]; then
		target=$($SHUNT --instance "$inst" get pods -o json |
			jq -r '.items[] | select(.metadata.name == "server") | .status.podIP // empty')
		[ -n "$target" ] || die "case $c: the server pod of lab $inst has no IP"
	fi
	TARGET[$c]=$target
}

teardown_lab() {
	local inst=${INST[$1]:-} keep=() l
	[ -n "$inst" ] || return 0
	$SHUNT --instance "$inst" lab down >/dev/null 2>&1 || echo "forwarding: lab down $inst failed" >&2
	for l in "${LABS[@]}"; do
		[ "$l" = "$inst" ] || keep+=("$l")
	done
	LABS=("${keep[@]+"${keep[@]}"}")
}

setup_loopback() { setup_lab loopback redirect-peer l 0 server 127.0.0.1; }
setup_bridge() { setup_lab bridge bridge b 1; }
setup_routed() { setup_lab routed routed r 2; }
setup_redirect() { setup_lab redirect redirect d 3; }
setup_redirect-peer() { setup_lab redirect-peer redirect-peer p 4; }
teardown_loopback() { teardown_lab loopback; }
teardown_bridge() { teardown_lab bridge; }
teardown_routed() { teardown_lab routed; }
teardown_redirect() { teardown_lab redirect; }
teardown_redirect-peer() { teardown_lab redirect-peer; }

# --- veth case: hand-made namespaces, no shunt ---------------------------------

VETH_A=bfwd$$-a VETH_B=bfwd$$-b
setup_veth() {
	KIND[veth]=netns NETNS[veth]=$VETH_A TARGET[veth]=10.212.0.2
	ip netns add "$VETH_A"
	ip netns add "$VETH_B"
	ip link add "bfw$$a" netns "$VETH_A" type veth peer name "bfw$$b" netns "$VETH_B"
	ip -n "$VETH_A" addr add 10.212.0.1/24 dev "bfw$$a"
	ip -n "$VETH_B" addr add 10.212.0.2/24 dev "bfw$$b"
	for ns in "$VETH_A" "$VETH_B"; do
		ip -n "$ns" link set lo up
	done
	ip -n "$VETH_A" link set "bfw$$a" up
	ip -n "$VETH_B" link set "bfw$$b" up
	ip netns exec "$VETH_B" taskset -c 1 sockperf server --tcp -i 0.0.0.0 -p "$SOCKPERF_PORT" >"$OUT/veth-sockperf-server.log" 2>&1 &
	SERVER_PIDS[veth]=$!
	ip netns exec "$VETH_B" taskset -c 1 iperf3 -s -p "$IPERF_PORT" >"$OUT/veth-iperf3-server.log" 2>&1 &
	SERVER_PIDS[veth]+=" $!"
	cat >>"$OUT/commands.txt" <<EOT
ip netns add $VETH_A; ip netns add $VETH_B; veth pair bfw$$a (10.212.0.1/24, in $VETH_A) <-> bfw$$b (10.212.0.2/24, in $VETH_B)
ip netns exec $VETH_B taskset -c 1 sockperf server --tcp -i 0.0.0.0 -p $SOCKPERF_PORT
ip netns exec $VETH_B taskset -c 1 iperf3 -s -p $IPERF_PORT
EOT
}

teardown_veth() {
	local pid
	for pid in ${SERVER_PIDS[veth]:-}; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	ip netns del "$VETH_A" 2>/dev/null || true
	ip netns del "$VETH_B" 2>/dev/null || true
}

# --- cleanup: every case set up is torn down, also on failure or ^C -----------

SET_UP=()
cleanup() {
	local rc=$? c
	trap - EXIT INT TERM
	for c in "${SET_UP[@]+"${SET_UP[@]}"}"; do
		"teardown_$c" || true
	done
	cleanup_labs # whatever lab_up/setup_lab registered and is still there
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- measuring ------------------------------------------------------------------

# wait_ready CASE: both servers answer (at most ~15 s).
wait_ready() {
	local c=$1 t=${TARGET[$1]} try
	for try in $(seq 75); do
		client_exec "$c" bash -c "exec 3<>/dev/tcp/$t/$SOCKPERF_PORT" 2>/dev/null && break
		[ "$try" = 75 ] && die "case $c: nothing listens on $t:$SOCKPERF_PORT (sockperf server) after 15 s"
		sleep 0.2
	done
	for try in $(seq 30); do
		client_exec "$c" iperf3 -c "$t" -p "$IPERF_PORT" -n 1K >/dev/null 2>&1 && break
		[ "$try" = 30 ] && die "case $c: iperf3 server on $t:$IPERF_PORT does not answer after 15 s"
		sleep 0.5
	done
}

# percentile LOG P: sockperf's "---> percentile P = value" line, in µs.
percentile() {
	local v
	v=$(awk -v p="percentile $2 =" 'index($0, p) { print $NF }' "$1")
	[[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "no 'percentile $2' in $1 (sockperf output format changed?)"
	echo "$v"
}

# measure CASE REP: one sockperf and one iperf3 run, three rows.
measure() {
	local c=$1 rep=$2 t=${TARGET[$1]} log json p50 p99 gbps try steal0 rr_steal
	local limit=$((DURATION + 30))
	log=$OUT/sockperf-$c-$rep.log
	steal0=$(steal_ms)
	client_exec "$c" timeout "$limit" taskset -c 0 sockperf ping-pong --tcp -i "$t" -p "$SOCKPERF_PORT" \
		-t "$DURATION" --msg-size 64 --full-rtt >"$log" 2>&1 ||
		{ tail -5 "$log" >&2; die "sockperf failed for case $c, repetition $rep (log: $log)"; }
	p50=$(percentile "$log" 50.000)
	p99=$(percentile "$log" 99.000)
	rr_steal=$(($(steal_ms) - steal0))

	json=$OUT/iperf3-$c-$rep.json
	# The iperf3 server takes one test at a time and needs a moment after
	# the previous one: retry a refused start, not a failed measurement.
	for try in 1 2 3; do
		steal0=$(steal_ms)
		client_exec "$c" timeout "$limit" taskset -c 0 iperf3 -c "$t" -p "$IPERF_PORT" -t "$DURATION" -J >"$json" 2>"$json.err" && break
		[ "$try" = 3 ] && die "iperf3 failed for case $c, repetition $rep: $(jq -r '.error // empty' "$json" 2>/dev/null) $(cat "$json.err")"
		sleep 1
	done
	rm -f "$json.err"
	gbps=$(jq -r '.end.sum_received.bits_per_second // empty | . / 1e9' "$json")
	[[ $gbps =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || die "no end.sum_received.bits_per_second in $json"

	row "$c" tcp_rr_p50 us "$p50" "$rep"
	row "$c" tcp_rr_p99 us "$p99" "$rep"
	row "$c" throughput Gbit/s "$gbps" "$rep"
	row "$c" tcp_rr_steal ms "$rr_steal" "$rep"
	row "$c" throughput_steal ms $(($(steal_ms) - steal0)) "$rep"
	printf 'rep %s %-14s p50 %8s µs  p99 %8s µs  %6.2f Gbit/s\n' "$rep" "$c" "$p50" "$p99" "$gbps"
}

# --- the run ----------------------------------------------------------------------

for c in "${CASES[@]}"; do
	declare -F "setup_$c" >/dev/null || die "unknown case $c (known: $ALL_CASES veth)"
done
echo "forwarding: cases ${CASES[*]}; $REPS repetitions of $DURATION s; output in $OUT"
for c in "${CASES[@]}"; do
	SET_UP+=("$c")
	"setup_$c"
	wait_ready "$c"
done

echo "# per case and repetition:" >>"$OUT/commands.txt"
for c in "${CASES[@]}"; do
	cat >>"$OUT/commands.txt" <<EOT
$(client_cmd "$c") taskset -c 0 sockperf ping-pong --tcp -i ${TARGET[$c]} -p $SOCKPERF_PORT -t $DURATION --msg-size 64 --full-rtt   # $c
$(client_cmd "$c") taskset -c 0 iperf3 -c ${TARGET[$c]} -p $IPERF_PORT -t $DURATION -J   # $c
EOT
done

ncases=${#CASES[@]}
if [ -n "$SMOKE" ]; then
	# --smoke: every case measured at once (each case's path still runs
	# end to end; the numbers mean nothing), so sockperf's fixed 2 s start
	# is paid once, not once per case.
	pids=()
	for c in "${CASES[@]}"; do
		measure "$c" 1 &
		pids+=($!)
	done
	for pid in "${pids[@]}"; do
		wait "$pid" || die "a case's measurement failed (see above)"
	done
else
	for rep in $(seq "$REPS"); do
		for i in $(seq 0 $((ncases - 1))); do
			measure "${CASES[$(((i + rep - 1) % ncases))]}" "$rep"
		done
	done
fi

baseline=bridge
[[ " ${CASES[*]} " == *" bridge "* ]] || baseline=${CASES[0]}
floor=()
[[ " ${CASES[*]} " == *" loopback "* ]] && floor=(-floor loopback)
NOTES=$OUT/notes.md
cat >"$NOTES" <<EOT
tcp_rr_p50/p99: sockperf TCP ping-pong over one persistent connection, 64-byte messages, full round trip (--full-rtt; sockperf's default would print half of it). throughput: iperf3, one TCP stream, end.sum_received. Client pinned to CPU 0, servers to CPU 1.
Cases: loopback = client and server inside one pod over 127.0.0.1 (the floor); bridge/routed/redirect/redirect-peer = client pod -> server pod on one lab node in that forwarding mode; veth (when selected) = two plain namespaces over one veth pair, no shunt. Order within a repetition rotates: $(for r in $(seq "$REPS"); do
	echo -n "rep $r starts with ${CASES[$(((r - 1) % ncases))]}; "
done | sed 's/; $//').
Per-repetition raw values: results.json; min and max per median: medians.json; tool output: sockperf-CASE-REP.log, iperf3-CASE-REP.json.
EOT
finish "Pod-to-pod forwarding" "$baseline" -verdict auto "${floor[@]+"${floor[@]}"}" \
	-paired tcp_rr_p50,tcp_rr_p99,throughput
