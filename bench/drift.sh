#!/usr/bin/env bash
# Drift checks: what comparing the maps with the desired state costs an idle
# agent holding N services (each with 10 endpoints: ~11 N shunt_services and
# 10 N shunt_backends entries). The agent runs with --drift-check-period
# off (0: the baseline), at the default and at shorter periods; for each,
# the agent's CPU time (utime + stime of /proc/PID/stat) over a window of
# idle time, as a share of one core, and the duration of one check as the
# agent reports it (`shunt status`: drift.lastTookMs).
#   bench/run drift [--reps 3] [--quick] [--smoke] [--n 10000] [--periods "0 2m 30s 1s"]
# WINDOW (env, seconds; default 120, at least the longest period; --quick 15,
# --smoke 3) is the idle window.
# --smoke: tiny sizes (N 100, periods 0 and 1s), one repetition: proves the
# script runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PERIODS="0 2m 30s 1s"
ARGS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--periods) PERIODS=$2; shift 2 ;;
	*) ARGS+=("$1"); shift ;;
	esac
done
SCALE_OPT=--n
SCALE_LIST="10000"
SMOKE_SCALE_LIST=100
set -- "${ARGS[@]+"${ARGS[@]}"}"
source bench/lib.sh
die() { echo "bench/drift: $*" >&2; exit 1; }
QUICK=0
for a in "${ARGS[@]+"${ARGS[@]}"}"; do [ "$a" = --quick ] && QUICK=1; done
WINDOW=${WINDOW:-120}
[ "$QUICK" = 1 ] && WINDOW=${WINDOW_QUICK:-15}
if [ "$SMOKE" = 1 ]; then
	WINDOW=3 PERIODS="0 1s" # REPS and SCALE_LIST: lib.sh
fi
bench_out drift
go build -o bin/ ./bench/cmd/svcgen

INST="bdrift$$"
INST=${INST:0:10}
POD_CIDR=10.219.0.0/24
SVC_CIDR=10.216.0.0/16
MANIFEST=$OUT/pods.yaml
printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: client}\nspec:\n  containers:\n  - {name: idle, command: [sleep, infinity]}\n' >"$MANIFEST"
TICK=$(getconf CLK_TCK)

cat >"$OUT/commands.txt" <<EOT
bin/shunt --instance $INST lab up --mode redirect-peer --pod-cidr $POD_CIDR --service-cidr $SVC_CIDR --drift-check-period 0 -f $MANIFEST
bin/svcgen -n N -format yaml -measured 10.219.0.250 > svc.yaml; bin/shunt apply -f svc.yaml
# per period P: the agent restarted with it (SIGTERM, then)
bin/shunt --instance $INST lab up --drift-check-period P
# settle 15 s, then per repetition: utime+stime of the agent over ${WINDOW} s idle
awk '{print \$14 + \$15}' /proc/PID/stat   # clock ticks, CLK_TCK=$TICK
bin/shunt --instance $INST status -o json | jq .drift.lastTookMs
EOT

agent_pid() { $SHUNT --instance "$INST" status -o json | jq -r .pid; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# restart_agent PERIOD: stop the agent and start it again with this period
# (the lab keeps its objects; the datapath stays).
restart_agent() {
	local pid
	pid=$(agent_pid)
	kill -TERM "$pid"
	# Until it has exited: gone, or a zombie (state Z) init has not reaped
	# yet, which kill -0 would still reach.
	while [ "$(sed 's/.*) //; s/ .*//' "/proc/$pid/stat" 2>/dev/null || echo gone)" != Z ] && [ -e "/proc/$pid" ]; do sleep 0.1; done
	$SHUNT --instance "$INST" lab up --drift-check-period "$1" >/dev/null 2>&1
}

lab_up "$INST" redirect-peer "$POD_CIDR" "$MANIFEST" --service-cidr "$SVC_CIDR" --drift-check-period 0
for n in $SCALE_LIST; do
	bin/svcgen -n "$n" -format yaml -measured 10.219.0.250 >"$OUT/svc-$n.yaml"
	$SHUNT --instance "$INST" apply -f "$OUT/svc-$n.yaml" >/dev/null
	entries=$($SHUNT --instance "$INST" map list -o json | jq '[.[] | select(.name == "shunt_services" or .name == "shunt_backends") | .entries] | add')
	echo "n=$n: $entries service and backend entries"
	for p in $PERIODS; do
		restart_agent "$p"
		pid=$(agent_pid)
		sleep "$([ "$SMOKE" = 1 ] && echo 2 || echo 15)" # start-up work and its garbage collections
		for rep in $(seq "$REPS"); do
			t0=$(ticks "$pid")
			sleep "$WINDOW"
			t1=$(ticks "$pid")
			pct=$(awk -v d=$((t1 - t0)) -v hz="$TICK" -v w="$WINDOW" 'BEGIN { printf "%.3f", 100 * d / hz / w }')
			case=off
			[ "$p" != 0 ] && case="every-$p"
			row "$case" cpu_pct "% core" "$pct" "$rep" "$n"
			st=$($SHUNT --instance "$INST" status -o json)
			took=$(jq '.drift.lastTookMs // 0' <<<"$st")
			checks=$(jq '.drift.checks // 0' <<<"$st")
			sleep 2 # the status request's own work, before the next window
			if [ "$checks" != 0 ]; then
				row "$case" check_ms ms "$took" "$rep" "$n"
			fi
			echo "n=$n period $p rep $rep: agent ${pct}% of a core over ${WINDOW}s; last check ${took} ms ($checks checks)"
		done
	done
	# One check on demand, with what it read.
	$SHUNT --instance "$INST" sync --verify | tee "$OUT/verify-$n.txt"
done

NOTES=$OUT/notes.md
cat >"$NOTES" <<EOT
cpu_pct is the agent's CPU time (user + system) over ${WINDOW} s of idle time (nothing applied, no traffic, no scrapes), as a share of one core: the target is that a drift check at the chosen period keeps an idle agent at N = 10 000 within 1% of one core. check_ms is how long the last check took (read every map the agent determines in batches, compare, nothing to repair). N counts services with 10 endpoints each. The agent is restarted between periods (SIGTERM, then \`lab up\` with the new period); it re-reads the maps at start and settles for 15 s before measuring.
EOT
finish "Drift checks: idle agent CPU at N services" off
