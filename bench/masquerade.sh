#!/usr/bin/env bash
# Masquerade benchmark (issue 18): a pod reaches a host outside the cluster
# through its node, every case side by side in one run:
#   routed         no translation: the outside host routes the pod network
#                  back through the node (the baseline of the ratios)
#   iptables-masq  an iptables MASQUERADE rule on the node's uplink (netfilter
#                  conntrack + NAT), the outside host knows only the node
#   shunt-masq     shunt's agent with --masquerade: the uplink's tc programs
#                  and their BPF NAT table, the outside host knows only the node
# Each case is its own node (a network namespace whose uplink ul0
# 192.168.<90+i>.1/24 leads to an outside-host namespace at .100) with its
# own shunt lab (redirect-peer, one idle client pod); the outside host runs
# sockperf, iperf3 and a TCP echo server (bin/shunt lab serve).
# Metrics per case and repetition: sockperf TCP ping-pong round trip
# (14-byte messages, --full-rtt) p50 and p99 over one persistent connection,
# iperf3 single-stream throughput, and new connections/s (bench/cmd/connrate:
# connect, 4-byte request, reply, close; 4 workers) to ten ports of the
# outside host. Client pinned to CPU 0, servers to CPU 1.
#
# usage: bench/masquerade.sh [--reps N] [--duration S] [--quick] [--cases "routed iptables-masq shunt-masq"]
set -euo pipefail
cd "$(dirname "$0")/.."
CASES_ARG="routed iptables-masq shunt-masq"
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--cases) CASES_ARG=$2; shift 2 ;;
	*) args+=("$1"); shift ;;
	esac
done
set -- "${args[@]+"${args[@]}"}"
source bench/lib.sh # REPS, DURATION, SHUNT, LABS, cleanup_labs, row, finish
read -ra CASES <<<"$CASES_ARG"

die() { echo "masquerade: $*" >&2; exit 1; }
bench_out masquerade
for tool in sockperf iperf3 iptables jq taskset nsenter; do
	command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh"
done
go build -o bin/ ./bench/cmd/connrate
echo "# ${BENCH_INVOCATION:-bench/masquerade.sh} (reps $REPS, duration $DURATION s)" >"$OUT/commands.txt"

SOCKPERF_PORT=11111 IPERF_PORT=5201 ECHO_PORT=7000
declare -A NODE OUTSIDE INST PODNS
NAMESPACES=()
SERVER_PIDS=()
cleanup() {
	for p in "${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}"; do kill "$p" 2>/dev/null || true; done
	cleanup_labs
	for ns in "${NAMESPACES[@]+"${NAMESPACES[@]}"}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT

MANIFEST=$OUT/pods.yaml
cat >"$MANIFEST" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers:
  - {name: idle, command: [sleep, infinity]}
YAML

# run CMD...: run a command and note it in commands.txt.
run() {
	echo "$*" >>"$OUT/commands.txt"
	"$@"
}

# setup CASE INDEX: the case's node and outside host, its lab, the servers.
setup() {
	local c=$1 i=$2 node=bm$$n$2 out=bm$$o$2 inst=bm$$$2
	local net=192.168.$((90 + i)) cidr=10.213.$i.0/24 flags=()
	NODE[$c]=$node OUTSIDE[$c]=$net.100 INST[$c]=$inst
	NAMESPACES+=("$node" "$out")
	run ip netns add "$node"
	run ip netns add "$out"
	run ip -n "$node" link set lo up
	run ip -n "$out" link set lo up
	run ip -n "$node" link add ul0 type veth peer name ul1 netns "$out"
	run ip -n "$node" addr add "$net.1/24" dev ul0
	run ip -n "$out" addr add "$net.100/24" dev ul1
	run ip -n "$node" link set ul0 up
	run ip -n "$out" link set ul1 up
	[ "$c" = shunt-masq ] && flags=(--masquerade --underlay-addr "$net.1")
	LABS+=("$inst")
	run nsenter --net=/run/netns/"$node" $SHUNT --instance "$inst" lab up --mode redirect-peer --pod-cidr "$cidr" -f "$MANIFEST" \
		"${flags[@]+"${flags[@]}"}" >"$OUT/lab-$c.log" 2>&1 || { cat "$OUT/lab-$c.log" >&2; die "lab up for case $c failed"; }
	PODNS[$c]=$inst-default-client
	local nodeip
	nodeip=$(nsenter --net=/run/netns/"$node" $SHUNT --instance "$inst" status -o json | jq -r .nodeIP)
	# Without shunt's masquerade, replies come in on ul0 and the node's
	# stack forwards them (forwarding is per incoming device).
	[ "$c" = shunt-masq ] || run ip netns exec "$node" sysctl -qw net.ipv4.conf.ul0.forwarding=1
	case $c in
	routed)
		run ip -n "$out" route add "$cidr" via "$net.1"
		run ip -n "${PODNS[$c]}" route add "$net.0/24" via "$nodeip" dev eth0 onlink ;;
	iptables-masq)
		run ip netns exec "$node" iptables -t nat -A POSTROUTING -s "$cidr" -o ul0 -j MASQUERADE
		run ip -n "${PODNS[$c]}" route add "$net.0/24" via "$nodeip" dev eth0 onlink ;;
	esac
	ip netns exec "$out" taskset -c 1 sockperf server --tcp -i "$net.100" -p $SOCKPERF_PORT >"$OUT/sockperf-server-$c.log" 2>&1 &
	SERVER_PIDS+=($!)
	ip netns exec "$out" taskset -c 1 iperf3 -s -p $IPERF_PORT >"$OUT/iperf3-server-$c.log" 2>&1 &
	SERVER_PIDS+=($!)
	ip netns exec "$out" taskset -c 1 $SHUNT lab serve --tcp "$(seq -s, $ECHO_PORT $((ECHO_PORT + 9)))" >"$OUT/echo-server-$c.log" 2>&1 &
	SERVER_PIDS+=($!)
	echo "ip netns exec $out taskset -c 1 sockperf server --tcp -i $net.100 -p $SOCKPERF_PORT; ... iperf3 -s -p $IPERF_PORT; ... bin/shunt lab serve --tcp $ECHO_PORT-$((ECHO_PORT + 9))" >>"$OUT/commands.txt"
	for try in $(seq 75); do
		client "$c" bash -c "exec 3<>/dev/tcp/$net.100/$SOCKPERF_PORT" 2>/dev/null && return 0
		sleep 0.2
	done
	die "case $c: the outside host's sockperf server does not answer from the pod"
}

# client CASE CMD...: run CMD in the case's client pod.
client() {
	local c=$1
	shift
	ip netns exec "${PODNS[$c]}" "$@"
}

percentile() {
	local v
	v=$(awk -v p="percentile $2 =" 'index($0, p) { print $NF }' "$1")
	[[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "no 'percentile $2' in $1 (sockperf output format changed?)"
	echo "$v"
}

measure() {
	local c=$1 rep=$2 t=${OUTSIDE[$1]} log json limit=$((DURATION + 30)) targets try
	log=$OUT/sockperf-$c-$rep.log
	client "$c" timeout $limit taskset -c 0 sockperf ping-pong --tcp -i "$t" -p $SOCKPERF_PORT -t "$DURATION" --msg-size 14 --full-rtt >"$log" 2>&1 ||
		die "sockperf failed for case $c (log: $log)"
	row "$c" tcp_rr_p50 us "$(percentile "$log" 50.000)" "$rep"
	row "$c" tcp_rr_p99 us "$(percentile "$log" 99.000)" "$rep"
	json=$OUT/iperf3-$c-$rep.json
	for try in 1 2 3; do
		client "$c" timeout $limit taskset -c 0 iperf3 -c "$t" -p $IPERF_PORT -t "$DURATION" -J >"$json" 2>&1 && break
		[ $try = 3 ] && die "iperf3 failed for case $c (log: $json)"
		sleep 1
	done
	row "$c" throughput Gbit/s "$(jq '.end.sum_received.bits_per_second / 1e9' "$json")" "$rep"
	targets=$(for p in $(seq $ECHO_PORT $((ECHO_PORT + 9))); do printf '%s:%s,' "$t" "$p"; done)
	json=$OUT/connrate-$c-$rep.json
	client "$c" timeout $limit taskset -c 0 bin/connrate -target "${targets%,}" -workers 4 -duration "${DURATION}s" >"$json" 2>&1 ||
		die "connrate failed for case $c (log: $json)"
	row "$c" conn_rate conn/s "$(jq .rate "$json")" "$rep"
	row "$c" conn_failed count "$(jq .failed "$json")" "$rep"
	printf 'rep %s %-14s %s\n' "$rep" "$c" "$(jq -c . "$json")"
}

for i in "${!CASES[@]}"; do
	setup "${CASES[$i]}" "$i"
done
cat >>"$OUT/commands.txt" <<EOT
ip netns exec POD taskset -c 0 sockperf ping-pong --tcp -i OUTSIDE -p $SOCKPERF_PORT -t $DURATION --msg-size 14 --full-rtt
ip netns exec POD taskset -c 0 iperf3 -c OUTSIDE -p $IPERF_PORT -t $DURATION -J
ip netns exec POD taskset -c 0 bin/connrate -target OUTSIDE:$ECHO_PORT,...,OUTSIDE:$((ECHO_PORT + 9)) -workers 4 -duration ${DURATION}s
EOT
for rep in $(seq "$REPS"); do
	# The starting case rotates, so drift hits every case alike.
	for k in "${!CASES[@]}"; do
		measure "${CASES[$(((k + rep) % ${#CASES[@]}))]}" "$rep"
	done
	# Between repetitions, the closed connections' entries expire (TCP
	# closing: 10 s in shunt's table, CLOSE/TIME_WAIT in conntrack are
	# reused) so each repetition starts from about the same state.
	[ "$rep" = "$REPS" ] || sleep 11
done
if [ -n "${INST[shunt-masq]:-}" ]; then
	nsenter --net=/run/netns/"${NODE[shunt-masq]}" $SHUNT --instance "${INST[shunt-masq]}" status -o json |
		jq '[.counters[] | select(.direction == "to-uplink" or .direction == "from-uplink")]' >"$OUT/shunt-counters.json"
fi

NOTES=$OUT/notes.md
cat >"$NOTES" <<'EOT'
One node per case, a network namespace with its own shunt lab (redirect-peer, one idle client pod), whose uplink veth leads to an outside-host namespace. routed: the outside host has a route back to the pod CIDR, nothing is translated (the pod gets a route to the uplink subnet). iptables-masq: `iptables -t nat -A POSTROUTING -s POD_CIDR -o ul0 -j MASQUERADE` in the node, no shunt masquerade. shunt-masq: `lab up --masquerade --underlay-addr NODE`: the tc programs on ul0 translate with the BPF NAT table (ports 61000-65535).

tcp_rr_*: sockperf ping-pong over one persistent TCP connection, 14-byte messages, full round trip, µs. throughput: iperf3, one TCP stream. conn_rate: connect, 4-byte request, reply, close, 4 workers, spread over ten ports of the outside host; conn_failed: connections that failed in the run. shunt's table gives each (outside address, port, protocol) 4536 ports; a closed TCP connection gives its port to a new flow 1 s after it closed (its entries stay 10 s for its late packets), so about 4500 new connections per second per outside port are sustained; shunt-counters.json shows masq-port-exhausted if a run goes beyond.
EOT
finish "Masquerade: pod to a host outside the cluster, routed vs iptables MASQUERADE vs shunt's BPF masquerade" routed -verdict auto
