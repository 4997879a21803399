#!/usr/bin/env bash
# Conntrack table pressure: a SYN flood from one pod against the idle
# established connections of another, side by side in one run:
#   single-table  every connection enters shunt_ct at its first packet
#                 (--conntrack-single-table, shunt before shunt_ct_new): the baseline
#   two-tables    new connections wait in shunt_ct_new until assured (shunt's default)
# Per case and repetition, a fresh lab: the client pod opens HELD connections
# to the server (ctflood.py serve: no keepalive probes, which would open a
# lost connection again from the server's side) and exchanges a message on each; a policy then admits new
# connections to the server from the flooder only, and none to the client
# (the held ones go on through conntrack alone: refused both ways, one whose
# entry is lost is not recorded again from its next packet); the flooder sends SYNS SYNs from a raw socket
# per CPU to one open and seven closed ports of the server (every SYN a new
# tuple); then every held connection exchanges a message again (3 s to
# answer). Metrics: established connections kept (of HELD), SYNs sent per
# second (the flooder), packets the datapath processed per second during the
# flood (from-pod counters: the SYNs and the replies, SYN-ACK and RST).
# The order of the cases rotates between repetitions.
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE_OPT=--syns
SCALE_LIST=400000
SMOKE_SCALE_LIST=20000 # --smoke: too few to evict anything, enough to run every step
source bench/lib.sh
SYNS=$SCALE_LIST
HELD=200
PORTS=7000,7001,7002,7003,7004,7005,7006,7007
SCRIPT=$PWD/test/e2e/testdata/ctflood.py

bench_out ctflood

MANIFEST=$OUT/pods.yaml
POLICY=$OUT/only-flooder.yaml
python3 "$SCRIPT" pods >"$MANIFEST"
python3 "$SCRIPT" policy >"$POLICY"

cat >"$OUT/commands.txt" <<EOT
python3 $SCRIPT pods >$MANIFEST
python3 $SCRIPT policy >$POLICY
# per repetition, per case (order rotating), a fresh lab; CASE_FLAGS is --conntrack-single-table for single-table:
bin/shunt --instance INST lab up --mode redirect-peer --pod-cidr 10.218.I.0/24 -f $MANIFEST CASE_FLAGS
bin/shunt --instance INST lab exec client -- python3 $SCRIPT hold SERVER 7000 $HELD   # stdin: one "check" after the flood
bin/shunt --instance INST apply -f $POLICY
bin/shunt --instance INST lab exec flooder -- python3 $SCRIPT flood SERVER $PORTS $SYNS
bin/shunt --instance INST status -o json   # from-pod counters before and after the flood
bin/shunt --instance INST lab down
EOT

# from_pod_packets INSTANCE: every packet the from-pod programs counted.
from_pod_packets() {
	$SHUNT --instance "$1" status -o json | jq '[.counters[] | select(.direction == "from-pod") | .packets] | add // 0'
}

# wait_lines FILE N: wait (30 s at most) until FILE has N lines.
wait_lines() {
	for _ in $(seq 300); do
		[ "$(wc -l <"$1")" -ge "$2" ] && return 0
		sleep 0.1
	done
	echo "ctflood: no answer from the holder in $1" >&2
	cat "$1" >&2
	return 1
}

cases=(single-table two-tables)
i=0
for rep in $(seq "$REPS"); do
	for k in 0 1; do
		c=${cases[$(((k + rep) % 2))]}
		flags=()
		[ "$c" = single-table ] && flags=(--conntrack-single-table)
		inst="bct$$$i"
		inst=${inst:0:12}
		lab_up "$inst" redirect-peer "10.218.$((i % 250)).0/24" "$MANIFEST" --service-cidr "10.217.$((i % 250)).0/24" "${flags[@]}"
		i=$((i + 1))
		server=$(pod_ip "$inst" server)
		in_pod "$inst" client python3 -c "import socket,time
for _ in range(50):
    try: socket.create_connection(('$server', 7000), timeout=1).close(); break
    except OSError: time.sleep(0.1)"

		fifo=$OUT/hold-$c-$rep.in
		held=$OUT/hold-$c-$rep.jsonl
		rm -f "$fifo"
		mkfifo "$fifo"
		in_pod "$inst" client python3 "$SCRIPT" hold "$server" 7000 "$HELD" <"$fifo" >"$held" 2>&1 &
		holder=$!
		exec 3>"$fifo"
		wait_lines "$held" 1
		if [ "$(head -1 "$held" | jq .held)" != "$HELD" ]; then
			echo "ctflood: the client could not hold $HELD connections:" >&2
			cat "$held" >&2
			exit 1
		fi
		$SHUNT --instance "$inst" apply -f "$POLICY" >/dev/null

		before=$(from_pod_packets "$inst")
		in_pod "$inst" flooder python3 "$SCRIPT" flood "$server" "$PORTS" "$SYNS" >"$OUT/flood-$c-$rep.json"
		after=$(from_pod_packets "$inst")
		echo check >&3
		wait_lines "$held" 2
		exec 3>&-
		wait "$holder" || true
		rm -f "$fifo"

		kept=$(sed -n 2p "$held" | jq .ok)
		rate=$(jq .rate "$OUT/flood-$c-$rep.json")
		seconds=$(jq .seconds "$OUT/flood-$c-$rep.json")
		processed=$(awk -v n=$((after - before)) -v s="$seconds" 'BEGIN { printf "%.0f\n", n / s }')
		row "$c" established_kept conns "$kept" "$rep"
		row "$c" syn_sent_rate SYN/s "$rate" "$rep"
		row "$c" datapath_rate pkt/s "$processed" "$rep"
		$SHUNT --instance "$inst" map list >"$OUT/maps-$c-$rep.txt"
		echo "rep $rep $c: $kept of $HELD established kept; $rate SYN/s sent, $processed pkt/s through from-pod"
		$SHUNT --instance "$inst" lab down >/dev/null
	done
done

NOTES=$OUT/notes.md
cat >"$NOTES" <<EOT
$HELD idle established connections from the client pod, a flood of $SYNS SYNs (one raw-socket sender per CPU, $(nproc) CPUs) from the flooder pod to one open and seven closed ports of the server. established_kept: the held connections that still answered within 3 s after the flood (policy no longer admits the client as new, so a connection whose conntrack entry was evicted is cut). datapath_rate counts every packet the from-pod programs handled during the flood: the SYNs, the server's SYN-ACKs and RSTs and the flooder's RSTs.
Tables: shunt_ct 131 072 entries, shunt_ct_new 32 768 (two-tables only). BPF's LRU evicts per CPU and gives recently looked-up entries a second chance, so the single table loses its idle entries only once the flood has gone through it about twice; a flood from one CPU can miss the entries another CPU added.
EOT
finish "Conntrack under a SYN flood: established connections kept, flood rate" single-table -verdict auto
