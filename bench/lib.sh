# Shared helpers for bench/*.sh: option parsing, result rows, lab handling.
# Every lab a benchmark starts has its own instance name and is removed on
# exit, also when the benchmark fails.

REPS=3
DURATION=10
while [ $# -gt 0 ]; do
	case "$1" in
	--reps) REPS=$2; shift 2 ;;
	--duration) DURATION=$2; shift 2 ;;
	--quick) REPS=1; DURATION=2; shift ;;
	*) echo "unknown option $1" >&2; exit 2 ;;
	esac
done

SHUNT=bin/shunt
LABS=()

cleanup_labs() {
	for inst in "${LABS[@]}"; do
		$SHUNT --instance "$inst" lab down >/dev/null 2>&1 || true
	done
}
trap cleanup_labs EXIT

# lab_up INSTANCE MODE CIDR MANIFEST: start a lab and remember to remove it.
lab_up() {
	LABS+=("$1")
	$SHUNT --instance "$1" lab down >/dev/null 2>&1 || true
	$SHUNT --instance "$1" lab up --mode "$2" --pod-cidr "$3" -f "$4" >/dev/null
}

# pod_ip INSTANCE POD
pod_ip() { $SHUNT --instance "$1" get pods "$2" -o json | jq -r .status.podIP; }

# in_pod INSTANCE POD CMD...: run a command inside a pod.
in_pod() {
	local inst=$1 pod=$2
	shift 2
	$SHUNT --instance "$inst" lab exec "$pod" -- "$@"
}

# row CASE METRIC UNIT VALUE REP [N]: append one raw result row.
row() {
	local n=${6:-0}
	printf '{"case":"%s","metric":"%s","unit":"%s","value":%s,"rep":%s,"n":%s}\n' "$1" "$2" "$3" "$4" "$5" "$n" >>"$ROWS"
}

# finish TITLE BASELINE: write results.json and the report.
finish() {
	jq -s . "$ROWS" >"$OUT/results.json"
	go run ./bench/cmd/benchreport -in "$OUT/results.json" -title "$1" -baseline "$2" \
		-commands "$OUT/commands.txt" ${NOTES:+-notes "$NOTES"}
	echo "wrote $OUT/results.md, $OUT/results.json, $OUT/medians.json, $OUT/chart.svg"
	cat "$OUT/results.md"
}
