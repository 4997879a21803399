# Shared helpers for bench/*.sh: option parsing, result rows, lab handling.
# Every lab a benchmark starts has its own instance name and is removed on
# exit, also when the benchmark fails.

# A benchmark that measures at several scales sets SCALE_OPT (its option,
# e.g. --n) and SCALE_LIST (the default scales) before sourcing this file;
# SCALE_LIST is then what the user gave. SMOKE_SCALE_LIST (optional) is the
# tiny scale --smoke runs when the user gave none.
#
# --quick: 1 repetition of 2 s at the usual scales (its numbers mean nothing).
# --smoke: 1 repetition of 1 s at tiny scales (SMOKE_SCALE_LIST, and whatever
# else the script shrinks when SMOKE is set): proves that the whole pipeline
# (set-up of every case, measuring, the report, the chart, the teardown)
# still runs, in seconds to a minute; what `make test` runs (smoke_test.go).
# BENCH_OUT (environment): the folder the NAME/ output folders go in
# (default bench/out), so that a smoke run clobbers no real results.
REPS=3
DURATION=10
QUICK=
SMOKE=
SCALE_GIVEN=
while [ $# -gt 0 ]; do
	case "$1" in
	--reps) REPS=$2; shift 2 ;;
	--duration) DURATION=$2; shift 2 ;;
	--quick) QUICK=1; REPS=1; DURATION=2; shift ;;
	--smoke) SMOKE=1; REPS=1; DURATION=1; shift ;;
	"${SCALE_OPT:-}")
		[ -n "${SCALE_OPT:-}" ] || { echo "unknown option $1" >&2; exit 2; }
		SCALE_LIST=$2; SCALE_GIVEN=1; shift 2 ;;
	*) echo "unknown option $1" >&2; exit 2 ;;
	esac
done
if [ -n "$SMOKE" ] && [ -z "$SCALE_GIVEN" ] && [ -n "${SMOKE_SCALE_LIST:-}" ]; then
	SCALE_LIST=$SMOKE_SCALE_LIST
fi
BENCH_OUT=${BENCH_OUT:-bench/out}

# die MESSAGE: the script's own die (defined after sourcing) replaces this.
die() { echo "$(basename "$0" .sh): $*" >&2; exit 1; }

SHUNT=bin/shunt
LABS=()

cleanup_labs() {
	for inst in "${LABS[@]}"; do
		$SHUNT --instance "$inst" lab down >/dev/null 2>&1 || true
	done
}
trap cleanup_labs EXIT

# bench_out NAME: $BENCH_OUT/NAME (bench/out/NAME), emptied for this run,
# under a lock: one run of NAME at a time (runs share the folder, its address
# ranges and the CPUs; the lock is in /run, so a run into another BENCH_OUT
# is locked out too). Sets OUT and ROWS (empty); calls die when locked out.
bench_out() {
	OUT=$BENCH_OUT/$1
	mkdir -p "$BENCH_OUT" /run/shunt-bench
	exec 9>"/run/shunt-bench/$1.lock"
	flock -n 9 || die "another $1 run holds /run/shunt-bench/$1.lock"
	rm -rf "$OUT"
	mkdir -p "$OUT"
	ROWS=$OUT/rows.jsonl
	: >"$ROWS"
}

# lab_up INSTANCE MODE CIDR MANIFEST [LAB UP FLAGS...]: start a lab and
# remember to remove it.
lab_up() {
	local inst=$1 mode=$2 cidr=$3 manifest=$4
	shift 4
	LABS+=("$inst")
	$SHUNT --instance "$inst" lab down >/dev/null 2>&1 || true
	# 9>&-: the agent this starts must not inherit (and keep) bench_out's lock.
	$SHUNT --instance "$inst" lab up --mode "$mode" --pod-cidr "$cidr" -f "$manifest" "$@" >/dev/null 9>&-
}

# timed CMD...: run a command, print its wall-clock seconds.
timed() {
	local t0 t1
	t0=$(date +%s%N)
	"$@" >/dev/null
	t1=$(date +%s%N)
	awk -v ns=$((t1 - t0)) 'BEGIN { printf "%.4f\n", ns / 1e9 }'
}

# ms SECONDS: seconds to milliseconds.
ms() { awk -v s="$1" 'BEGIN { printf "%.2f\n", s * 1000 }'; }

# pod_ip INSTANCE POD
pod_ip() { $SHUNT --instance "$1" get pods "$2" -o json | jq -r .status.podIP; }

# in_pod INSTANCE POD CMD...: run a command inside a pod.
in_pod() {
	local inst=$1 pod=$2
	shift 2
	$SHUNT --instance "$inst" lab exec "$pod" -- "$@"
}

# steal_ms: CPU time (ms, all CPUs) the hypervisor has taken from this
# virtual machine so far (/proc/stat's steal): other guests' work on the
# host, invisible from inside except as this number and as stalls in the
# tails (a task whose virtual CPU the host stops counts that time as its
# own run time). A measurement records its growth as METRIC_steal (ms), the
# row benchreport's -paired table reads a repetition against.
steal_ms() {
	awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { printf "%.0f", $9 * 1000 / hz }' /proc/stat
}

# row CASE METRIC UNIT VALUE REP [N]: append one raw result row.
row() {
	local n=${6:-0}
	printf '{"case":"%s","metric":"%s","unit":"%s","value":%s,"rep":%s,"n":%s}\n' "$1" "$2" "$3" "$4" "$5" "$n" >>"$ROWS"
}

# finish TITLE BASELINE [BENCHREPORT FLAGS...]: write results.json and the
# report (extra flags, e.g. -verdict auto -floor loopback, go to benchreport).
# With -paired METRICS, a repetition counts as quiet when the host took at
# most 1% of the machine's CPU over a run of DURATION from either run of a
# pair (-quiet-steal, the same rule for every benchmark).
finish() {
	local title=$1 baseline=$2
	shift 2
	jq -s . "$ROWS" >"$OUT/results.json"
	go run ./bench/cmd/benchreport -in "$OUT/results.json" -title "$title" -baseline "$baseline" \
		-commands "$OUT/commands.txt" ${NOTES:+-notes "$NOTES"} -quiet-steal $((DURATION * 10 * $(nproc))) "$@"
	echo "wrote $OUT/results.md, $OUT/results.json, $OUT/medians.json, $OUT/chart.svg"
	cat "$OUT/results.md"
}
