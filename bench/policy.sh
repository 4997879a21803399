#!/usr/bin/env bash
# Network policy benchmark: a client pod talking to a server pod whose
# ingress is governed by R rules, side by side in one run, for R in 0 100
# 1000 10000 (R filler rules allowing other /32s, the client matched last):
#   none      no policy, no iptables rules (the floor and the baseline)
#   iptables  an iptables CNI's layout, loaded with iptables-restore into the
#             server pod's own network namespace: INPUT accepts
#             RELATED,ESTABLISHED first, then jumps to a per-pod chain with
#             one rule per (peer, port), the client's last, then DROP
#   shunt     the same policy as one NetworkPolicy, applied through the agent
# The iptables rules live in the server pod's namespace, so the benchmark
# never touches the host's rules. shunt's programs stay attached in every
# case; without a policy they allow everything.
# Metrics: sockperf TCP request/response p50/p99 (persistent connection),
# new connections per second (connect, 4-byte request, reply, close; 4
# workers; every new connection walks the rules), load time (wall clock of
# iptables-restore and of `shunt apply`). A third pod, intruder, matched by
# no rule, checks in every case that the policy is enforced at all
# (enforcement.txt). The order of the cases rotates between repetitions.
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE_OPT=--r
SCALE_LIST="0 100 1000 10000"
SMOKE_SCALE_LIST=10 # --smoke: one small scale (N > 0 takes every path N = 0 takes, and more)
source bench/lib.sh

bench_out policy
: >"$OUT/enforcement.txt"
go build -o bin/ ./bench/cmd/connrate ./bench/cmd/policygen

INST="bpol$$"
INST=${INST:0:10}
POD_CIDR=10.217.0.0/24
MANIFEST=$OUT/pods.yaml
cat >"$MANIFEST" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers:
  - {name: idle, command: [sleep, infinity]}
---
apiVersion: v1
kind: Pod
metadata: {name: intruder, labels: {app: intruder}}
spec:
  containers:
  - {name: idle, command: [sleep, infinity]}
---
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: server}}
spec:
  containers:
  - name: sockperf
    command: [taskset, -c, "1", sockperf, server, --tcp, -i, 0.0.0.0, -p, "11111"]
    ports: [{name: sockperf, containerPort: 11111}]
  - name: echo
    command: [shunt, lab, serve, --tcp, "8080"]
    ports: [{name: echo, containerPort: 8080}]
YAML
lab_up "$INST" redirect-peer "$POD_CIDR" "$MANIFEST"
SERVER=$(pod_ip "$INST" server)
CLIENT=$(pod_ip "$INST" client)
SERVER_NETNS=/run/netns/$INST-default-server
insrv() { nsenter --net="$SERVER_NETNS" "$@"; }
# Thousands of short connections a second from one client: let it reuse
# TIME_WAIT ports, or every case after the first runs out of ports.
nsenter --net="/run/netns/$INST-default-client" sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="1024 65000"

# The servers need a moment to listen.
for _ in $(seq 50); do
	in_pod "$INST" client shunt lab probe --tcp "$SERVER:8080" --timeout 200ms >/dev/null 2>&1 && break
	sleep 0.1
done

cat >"$OUT/commands.txt" <<EOT
bin/shunt --instance $INST lab up --mode redirect-peer --pod-cidr $POD_CIDR -f $MANIFEST
# per R, the same policy two ways (the client's rule last):
bin/policygen -r R -format iptables -client $CLIENT | nsenter --net=/run/netns/$INST-default-server iptables-restore
bin/policygen -r R -format yaml > policy.yaml; bin/shunt --instance $INST apply -f policy.yaml
# per case and repetition (order rotating), after conntrack -F in the server pod, from the client pod:
bin/shunt lab exec client -- taskset -c 0 sockperf ping-pong --tcp -i $SERVER -p 11111 -t $DURATION --msg-size 64 --full-rtt
bin/shunt lab exec client -- connrate -target $SERVER:8080 -workers 4 -duration ${DURATION}s
# enforcement check, from a pod no rule allows (expected: timeout or refused under iptables and shunt, connected under none):
bin/shunt lab exec intruder -- shunt lab probe --tcp $SERVER:8080 --timeout 300ms --expect any -o json
# after each case: iptables -F; iptables -X (and the emptied iptables-nft table) in the server pod; shunt delete -f policy.yaml
EOT

# enforced CASE R REP: probe the server from the intruder, log the result.
enforced() {
	local res
	res=$(in_pod "$INST" intruder shunt lab probe --tcp "$SERVER:8080" --timeout 300ms --expect any -o json 2>/dev/null | jq -r .result) || res=error
	echo "r=$2 rep $3 $1: intruder -> server:8080 $res" >>"$OUT/enforcement.txt"
	case "$1:$res" in
	none:connected | iptables:timeout | iptables:refused | shunt:timeout | shunt:refused) ;;
	*) echo "WARNING: r=$2 $1: intruder -> server:8080 $res (policy $([ "$1" = none ] && echo "blocks it" || echo "not enforced"))" >&2 ;;
	esac
}

# measure CASE R REP
measure() {
	local c=$1 r=$2 rep=$3 log json
	# Start every case with an empty connection-tracking table in the server.
	insrv conntrack -F >/dev/null 2>&1 || true
	log=$OUT/sockperf-$c-$r-$rep.log
	in_pod "$INST" client taskset -c 0 sockperf ping-pong --tcp -i "$SERVER" -p 11111 -t "$DURATION" --msg-size 64 --full-rtt >"$log" 2>&1
	local p50 p99
	p50=$(awk '/percentile 50.000 =/ {print $NF}' "$log")
	p99=$(awk '/percentile 99.000 =/ {print $NF}' "$log")
	row "$c" tcp_rr_p50 us "$p50" "$rep" "$r"
	row "$c" tcp_rr_p99 us "$p99" "$rep" "$r"
	json=$OUT/connrate-$c-$r-$rep.json
	in_pod "$INST" client connrate -target "$SERVER:8080" -workers 4 -duration "${DURATION}s" >"$json"
	row "$c" conn_rate conn/s "$(jq .rate "$json")" "$rep" "$r"
	echo "r=$r rep $rep $c: p50 ${p50}us p99 ${p99}us, $(jq -r '"\(.rate | floor) conn/s (\(.failed) failed)"' "$json")"
}

run_case() {
	local c=$1 r=$2 rep=$3 t
	case "$c" in
	none)
		enforced none "$r" "$rep"
		measure none "$r" "$rep"
		;;
	iptables)
		t=$(timed insrv iptables-restore "$OUT/iptables-$r.rules")
		row iptables load_time s "$t" "$rep" "$r"
		enforced iptables "$r" "$rep"
		measure iptables "$r" "$rep"
		# The client's rules are the last ACCEPTs: their counters prove the
		# walk reached them.
		insrv iptables -L SHUNT-BENCH-POD-server -v -x -n | tail -n 3 >"$OUT/iptables-counters-$r-$rep.txt"
		insrv iptables -F
		insrv iptables -X
		# iptables-nft keeps the emptied table and its hooked base chains.
		insrv nft delete table ip filter >/dev/null 2>&1 || true
		;;
	shunt)
		t=$(timed $SHUNT --instance "$INST" apply -f "$OUT/policy-$r.yaml")
		row shunt load_time s "$t" "$rep" "$r"
		enforced shunt "$r" "$rep"
		measure shunt "$r" "$rep"
		$SHUNT --instance "$INST" delete -f "$OUT/policy-$r.yaml" >/dev/null
		;;
	esac
}

cases=(none iptables shunt)
for r in $SCALE_LIST; do
	bin/policygen -r "$r" -format iptables -client "$CLIENT" >"$OUT/iptables-$r.rules"
	bin/policygen -r "$r" -format yaml >"$OUT/policy-$r.yaml"
	for rep in $(seq "$REPS"); do
		for i in 0 1 2; do
			run_case "${cases[$(((i + rep - 1) % 3))]}" "$r" "$rep"
		done
	done
done

NOTES=$OUT/notes.md
{
	cat <<'EOT'
R (the `n` column) counts the filler ingress rules (each allowing one other /32 on TCP 11111 and 8080); the client's rule comes after them, so iptables walks 2R + 2 rules for every new connection to port 8080 (persistent connections stop at the ESTABLISHED rule).
load_time is the wall-clock time of the command shown (iptables-restore of the whole table; for shunt, `shunt apply` end to end: YAML parsing, policy computation, map programming).
Targets (issue): at R = 10 000, shunt's new-connection rate ≥ 0.95× none and ≥ 1.5× iptables; request/response p50 within 5% of none; the policy computed and programmed in < 1 s.
Enforcement check (intruder pod, allowed by no rule, to server:8080; expected connected under none, timeout or refused under iptables and shunt):
EOT
	for c in none iptables shunt; do
		echo "- $c: $(grep " $c: " "$OUT/enforcement.txt" | awk '{print $NF}' | sort | uniq -c | awk '{printf "%s%s ×%s", sep, $2, $1; sep=", "}')"
	done
} >"$NOTES"
finish "Network policy at R ingress rules" none
