#!/usr/bin/env bash
# scripts/fuzz.sh [TIME]: run every fuzz target for TIME each: a duration
# (2m) or a number of executions (20000x; default). `make test` runs a
# count, because a duration races Go 1.26's fuzzing coordinator: at the
# deadline it can report "context deadline exceeded" as a failure with no
# failing input, under CPU load (go.dev/issue/75804, fixed in Go 1.27); a
# count never meets that deadline. `make fuzz` runs longer. Inputs that fail are
# written by go test under the package's testdata/fuzz/ and become part of
# its corpus: commit them with the fix. The BPF target needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-20000x}
targets=(
	./internal/manifest:FuzzParseValidate
	./internal/agent:FuzzObjectsRequest
	./internal/datapath:FuzzDecodeFlow
	./internal/datapath:FuzzPodPrograms
	./internal/proxy:FuzzParseRequestHead
	./internal/proxyapi:FuzzDecodeFlowBatch
)
for t in "${targets[@]}"; do
	pkg=${t%%:*} fn=${t##*:}
	echo "fuzz $fn ($pkg) for $time"
	# The tail on success; everything on failure (the panic and its stack,
	# the failing input's file).
	if ! out=$(go test -run '^$' -fuzz "^$fn\$" -fuzztime "$time" "$pkg" 2>&1); then
		printf '%s\n' "$out"
		exit 1
	fi
	printf '%s\n' "$out" | tail -n 3
done
