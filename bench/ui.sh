#!/usr/bin/env bash
# shunt ui under load: does the service map page stay usable when the flow
# source delivers 10 000 flows/s? bench/cmd/uibench feeds the ui server's
# Source (the interface the lab's agents and a relay plug into) from a
# generator of a synthetic cluster (--namespaces N: N namespaces of 6
# workloads and 2 Services, a 90/8/2 HTTP split, policy drops, HTTP
# denials, traffic from the world and to the node), loads the page in
# headless Chromium (chromedp; --no-sandbox: Chromium refuses its sandbox as
# root) and reads the browser's own metrics over --duration seconds after a
# warm-up: long tasks (PerformanceObserver 'longtask', tasks > 50 ms),
# requestAnimationFrame intervals (16.7 ms = 60 fps), the page's time to
# draw one snapshot, snapshots and bytes it received. Cases, side by side
# per repetition (order rotating):
#   idle   the page with no flows (floor: the baseline of the ratios)
#   1k     1 000 flows/s
#   10k    10 000 flows/s
# The server aggregates flows into edges and sends at most 4 snapshots a
# second (internal/ui), so the browser's work follows the number of edges,
# not the flow rate; --namespaces 100 passes the default node limit (500).
#
# usage: bench/run ui [--reps N] [--duration S] [--quick | --smoke] [--namespaces "10 100"]
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE_OPT=--namespaces
SCALE_LIST="10 100"
SMOKE_SCALE_LIST=5
source bench/lib.sh

bench_out ui
go build -o bin/ ./bench/cmd/uibench
WARMUP=3s
[ -z "$SMOKE" ] || WARMUP=1s

cat >"$OUT/commands.txt" <<EOT
# per namespace count N, repetition and case (order rotating):
bin/uibench -rate RATE -namespaces N -warmup $WARMUP -duration ${DURATION}s
# RATE: idle 0, 1k 1000, 10k 10000
EOT

cases=(idle 1k 10k)
rate_of() { case $1 in idle) echo 0 ;; 1k) echo 1000 ;; 10k) echo 10000 ;; esac; }
for n in $SCALE_LIST; do
	for rep in $(seq "$REPS"); do
		for i in 0 1 2; do
			c=${cases[$(((i + rep) % 3))]}
			shot=
			if [ "$rep" = 1 ] && [ "$c" = 10k ]; then shot="-screenshot $OUT/page-10k-$n.png"; fi
			# shellcheck disable=SC2086
			res=$(bin/uibench -rate "$(rate_of "$c")" -namespaces "$n" -warmup "$WARMUP" -duration "${DURATION}s" $shot)
			echo "$res" >>"$OUT/raw-$n.jsonl"
			for m in frameP50Ms:frame_p50:ms frameP99Ms:frame_p99:ms frameMaxMs:frame_max:ms longTasks:long_tasks:count \
				longTaskMs:long_task_ms:ms longTaskMaxMs:long_task_max:ms renderP50Ms:render_p50:ms renderMaxMs:render_max:ms \
				snapshotsPerSec:snapshots:per_s snapshotKB:snapshot_size:KiB flowsPerSec:flows:per_s edges:edges:count serverCPU:server_cpu:cores; do
				IFS=: read -r key metric unit <<<"$m"
				row "$c" "$metric" "$unit" "$(jq ".$key" <<<"$res")" "$rep" "$n"
			done
			echo "namespaces $n rep $rep $c: $res"
		done
	done
done

NOTES=$OUT/notes.md
cat >"$NOTES" <<EOT
Browser: $(chromium --version 2>/dev/null | head -n 1), headless, --no-sandbox (root), software rendering; the page and the
server on the same 2-core machine as the generator. Long tasks and frame intervals are the browser's own
(PerformanceObserver, requestAnimationFrame) over the measured window; render is the page's JavaScript per snapshot
(JSON.parse and the DOM updates). Raw results per run: raw-N.jsonl.
Target (issue 30): 10 000 flows/s does not freeze the page.
EOT
finish "shunt ui: the service map page under a synthetic flow rate" idle
