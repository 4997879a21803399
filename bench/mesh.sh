#!/usr/bin/env bash
# Mesh benchmark: HTTP through shunt's node-local L7 proxy against a classic
# sidecar mesh, side by side in one run, in a lab of N pods (N = 10 50 150):
#   no-proxy    (a) client pod -> service ClusterIP -> server pod; shunt's
#               socket load balancing only: the floor and the baseline
#   node-proxy  (b) the same with an HTTPRoute whose parent is the service:
#               the socket hooks send the client's connections to the node
#               proxy (bin/shunt-proxy, started by the agent) on the node
#               address, which forwards them to the server pod
#   sidecars    (c) an HAProxy sidecar in every pod (HTTP mode, keep-alive
#               on both sides), traffic captured with iptables REDIRECT
#               inside the pods' own network namespaces: outbound in the
#               client pod, inbound in the server pod
#   node-proxy-accel (d) case (b) with socket acceleration (`shunt accel
#               on`) on both legs: client -> proxy and proxy -> server
#               through sockmap (sk_msg redirects), the proxy restarted
#               first so its upstream connections are opened accelerated;
#               the accel-added/accel-redirected counters are checked
# Until bin/shunt-proxy exists, (b) is skipped with a note and (a) and (c)
# still run.
#
# Load: bench/cmd/httpload (fortio as a library) from the client pod at a
# fixed rate (default 1000 requests/s) over 32 keep-alive connections (--conns
# 64 for more), 1 s unmeasured warm-up, then --duration seconds measured;
# p50/p90/p99/p99.9 of every request. The server is `shunt lab serve --http`
# (Go net/http and a handler that writes the pod's name: ≈ 13% of one
# core at 1000 requests/s here, the same in every case). One client/server
# pair carries all the load; the other N-2 pods are idle.
# Data plane cost: the proxies' CPU time over the load run (utime + stime in
# /proc/PID/stat: the node proxy for (b), every pod's sidecar for (c)) and
# their memory sampled in the middle of it (VmRSS summed, as sidecar
# comparisons usually quote it, and PSS summed, which counts the pages the
# HAProxies share once). And how long the proxies' threads waited for a CPU
# (run queue, /proc/PID/task/TID/schedstat) per request: what of their
# added latency is waiting, not work.
# Client pinned to CPU 0, server to CPU 1, proxies unpinned. Cases are
# interleaved within a repetition and the first case rotates from one
# repetition to the next. Every lab is removed on exit, also on failure or
# SIGTERM; the iptables rules live only in the lab pods' namespaces.
#
# usage: bench/mesh.sh [--reps N] [--duration S] [--quick] [--pods "10 50 150"] [--conns 32] [--qps 1000]
# REQUESTS=1 (environment): httpload also writes every measured request
# (start, latency, connection) to requests-CASE-N-REP.txt, to see whether a
# case's slow requests come in stalls or one by one. Every run's line says
# it in short either way: how many requests were above p99 and in how many
# 100 ms windows they fell.
set -euo pipefail
cd "$(dirname "$0")/.."

ORIG_ARGS="$*"
CONNS=32
QPS=1000
WARMUP=1
QUICK=
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--conns) CONNS=$2; shift 2 ;;
	--qps) QPS=$2; shift 2 ;;
	--quick) QUICK=1; args+=("$1"); shift ;;
	-h | --help) sed -n '2,/^# usage/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) args+=("$1"); shift ;;
	esac
done
set -- "${args[@]+"${args[@]}"}"
SCALE_OPT=--pods
SCALE_LIST="10 50 150"
SMOKE_SCALE_LIST=3 # --smoke: client, server and one idle pod
# --quick: 1 repetition of 2 s (lib.sh) in a lab of 10 pods, unless --pods says otherwise.
[ -z "$QUICK" ] || SCALE_LIST=10
source bench/lib.sh # REPS, DURATION, SCALE_LIST, SHUNT, LABS, cleanup_labs, row, finish

die() { echo "mesh: $*" >&2; exit 1; }
warn() { echo "mesh: WARNING: $*" >&2; }
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "--conns wants a positive number, not '$CONNS'"
[[ $QPS =~ ^[1-9][0-9]*$ ]] || die "--qps wants a positive number, not '$QPS'"
read -ra PODS <<<"$(tr ' ' '\n' <<<"$SCALE_LIST" | grep . | sort -n -u | tr '\n' ' ')"
for n in "${PODS[@]}"; do
	# Client and server are two of the N; the /22 below holds 1021 pods.
	[[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le 1000 ] || die "--pods: '$n' is not a pod count from 2 to 1000"
done
for tool in haproxy iptables nft jq taskset ss; do
	command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null ||
		die "$tool is missing: run scripts/setup.sh"
done

bench_out mesh
: >"$OUT/path.txt"
go build -o bin/ ./bench/cmd/httpload

INST="bmesh$$"
INST=${INST:0:10}
POD_CIDR=10.224.0.0/22
SVC_CIDR=10.225.0.0/16
PORT=8080
CLIENT_NETNS=/run/netns/$INST-default-client
SERVER_NETNS=/run/netns/$INST-default-server
CGROOT=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
[ -n "$CGROOT" ] || die "no cgroup2 mount in /proc/mounts (the lab needs cgroup v2)"
HZ=$(getconf CLK_TCK)

# The node proxy: (b) runs when the binary exists; until the proxy lands it
# is skipped with a note. NODE_PROXY_SKIP says why it did not run (also when
# it failed half-way: the other cases go on and the run exits 1).
NODE_PROXY_BIN=bin/shunt-proxy
NODE_PROXY_SKIP=
NODE_PROXY_EXPECTED=
if [ -x "$NODE_PROXY_BIN" ]; then
	NODE_PROXY_EXPECTED=1
elif [ -d cmd/shunt-proxy ]; then
	NODE_PROXY_SKIP="not measured: $NODE_PROXY_BIN does not exist although cmd/shunt-proxy does (is it in the Makefile's build target?)"
else
	NODE_PROXY_SKIP="not measured: $NODE_PROXY_BIN does not exist (the node proxy, cmd/shunt-proxy, is not on this branch yet)"
fi
[ -z "$NODE_PROXY_SKIP" ] ||
	echo "mesh: case node-proxy (b) skipped, $NODE_PROXY_SKIP; (a) and (c) run. Once 'make build' builds it, this benchmark measures it." >&2

# --- the sidecar, the pods, the route ---------------------------------------------

# One HAProxy configuration for every sidecar, as a mesh injects the same
# proxy everywhere: outbound listener for what the client pod's iptables
# captures, inbound listener for what the server pod's captures. HTTP mode
# with keep-alive and connection reuse on both sides is what an Envoy sidecar
# does; nbthread 1 is one core, like a sidecar's CPU limit; maxconn bounds the
# tables HAProxy allocates up front (its default follows ulimit -n).
# `server 0.0.0.0:0` connects to the connection's original destination, which
# HAProxy reads with getsockopt(SO_ORIGINAL_DST) (Debian's build has
# USE_NETFILTER/USE_TPROXY). HAProxy drops to the haproxy user, so the client
# pod's capture rule can leave its own upstream connections alone (Istio
# does the same with uid 1337).
SIDECAR_CFG=$(realpath "$OUT")/sidecar.cfg
cat >"$SIDECAR_CFG" <<'EOT'
global
    nbthread 1
    maxconn 1024
    user haproxy
    group haproxy

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    http-reuse always

frontend outbound
    bind 127.0.0.1:15001
    default_backend original_destination

backend original_destination
    server original 0.0.0.0:0

frontend inbound
    bind :15006
    default_backend app

backend app
    server app 127.0.0.1:8080
EOT
haproxy -c -q -f "$SIDECAR_CFG" || die "haproxy rejects $SIDECAR_CFG"

# manifest N: the service, client, server and N-2 idle pods, each with its
# sidecar container. The sidecars run in every case; without capture rules
# they are idle and cost only memory.
manifest() {
	local n=$1 i f=$OUT/pods-$1.yaml
	{
		cat <<YAML
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: $PORT, targetPort: $PORT}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers:
  - {name: app, command: [sleep, infinity]}
  - {name: sidecar, command: [haproxy, -db, -f, $SIDECAR_CFG]}
---
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: web}}
spec:
  containers:
  - name: app
    command: [taskset, -c, "1", shunt, lab, serve, --http, "$PORT"]
    ports: [{name: http, containerPort: $PORT}]
  - {name: sidecar, command: [haproxy, -db, -f, $SIDECAR_CFG]}
YAML
		for i in $(seq 1 $((n - 2))); do
			printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {name: idle-%03d, labels: {app: idle}}\nspec:\n  containers:\n  - {name: app, command: [sleep, infinity]}\n  - {name: sidecar, command: [haproxy, -db, -f, %s]}\n' "$i" "$SIDECAR_CFG"
		done
	} >"$f"
	echo "$f"
}

# The Gateway API route of case (b): parent and backend are the same
# service, so it changes nothing but the path (GAMMA, a mesh route).
ROUTE=$OUT/route.yaml
cat >"$ROUTE" <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web}
spec:
  parentRefs: [{group: "", kind: Service, name: web}]
  rules: [{backendRefs: [{name: web, port: $PORT}]}]
YAML

# --- cleanup: the labs (and with them pods, sidecars, iptables rules, route) ------

LOAD_PID=
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$LOAD_PID" ]; then
		kill "$LOAD_PID" 2>/dev/null || true
		wait "$LOAD_PID" 2>/dev/null || true
	fi
	# The agent's and the node proxy's logs go with the lab: keep them.
	cp -f "/var/lib/shunt/$INST/shuntd.log" "$OUT/shuntd.log" 2>/dev/null || true
	cp -f "/run/shunt/$INST/proxy.log" "$OUT/proxy.log" 2>/dev/null || true
	cleanup_labs
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- helpers ----------------------------------------------------------------------

inns() { local ns=$1; shift; nsenter --net="$ns" "$@"; }

# wait_ready URL: the server answers through the service (at most ~20 s).
wait_ready() {
	local try
	for try in $(seq 100); do
		in_pod "$INST" client shunt lab probe --http "$1" --timeout 500ms >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	return 1
}

# sidecar_pids: every pod's HAProxy (found through the pods' cgroups).
sidecar_pids() {
	local f pid
	for f in "$CGROOT/$INST"/pods/*/cgroup.procs; do
		while read -r pid; do
			[ "$(cat "/proc/$pid/comm" 2>/dev/null)" = haproxy ] && echo "$pid"
		done <"$f"
	done
}

# node_proxy_pids: this lab's node proxy: every process in the cgroup the
# agent runs it in (two of them while a restart drains the old one), else
# the pid file the agent writes.
node_proxy_pids() {
	local pid
	if [ -s "$CGROOT/$INST/proxy/cgroup.procs" ]; then
		cat "$CGROOT/$INST/proxy/cgroup.procs"
	elif [ -s "/run/shunt/$INST/proxy.pid" ]; then
		pid=$(cat "/run/shunt/$INST/proxy.pid")
		[ ! -d "/proc/$pid" ] || echo "$pid"
	fi
}

# cpu_ticks PID...: their user + system CPU time, in clock ticks (utime and
# stime, fields 14 and 15 of /proc/PID/stat, counted after the command name
# which may contain spaces). A process's own line covers all its threads.
cpu_ticks() {
	local pid
	for pid in "$@"; do cat "/proc/$pid/stat" 2>/dev/null || true; done |
		awk '{ sub(/.*\) /, ""); s += $12 + $13 } END { print s + 0 }'
}

# run_delay_ns PID...: how long their threads have waited on a run queue,
# runnable but not running, in ns (field 2 of /proc/PID/task/TID/schedstat,
# summed): for a proxy, mostly the time from a wake-up to getting a CPU.
run_delay_ns() {
	local pid
	for pid in "$@"; do cat /proc/"$pid"/task/*/schedstat 2>/dev/null || true; done |
		awk '{ s += $2 } END { printf "%.0f\n", s }'
}

# mem_kib FIELD PID...: FIELD (VmRSS from status, Pss from smaps_rollup) summed.
mem_kib() {
	local field=$1 pid file
	shift
	file=status
	[ "$field" = Pss ] && file=smaps_rollup
	for pid in "$@"; do cat "/proc/$pid/$file" 2>/dev/null || true; done |
		awk -v f="$field:" '$1 == f { s += $2 } END { print s + 0 }'
}

# lab_ms: CPU time (ms) the lab (its cgroup subtree) and its agent have used.
lab_ms() {
	local lab agent
	lab=$(awk '$1 == "usage_usec" { printf "%.0f", $2 / 1000 }' "$CGROOT/$INST/cpu.stat")
	agent=$(awk -v hz="$HZ" '{ sub(/.*\) /, ""); printf "%.0f", ($12 + $13) * 1000 / hz }' "/proc/$AGENT_PID/stat" 2>/dev/null || echo 0)
	echo $((lab + agent))
}

# outside_ms: CPU time (ms) the whole machine has spent busy (user, system,
# interrupts, stolen by the hypervisor) minus what the lab (pods, proxies,
# the load generator: the instance's cgroup subtree) and its agent spent.
# Its growth over a run is the work of everything else on the machine
# (other builds and tests on a shared machine), which lands in the tail
# latencies. Clock ticks against exact run times: good to ±100 ms or so.
outside_ms() {
	local busy
	busy=$(awk -v hz="$HZ" '$1 == "cpu" { printf "%.0f", ($2 + $3 + $4 + $7 + $8 + $9) * 1000 / hz }' /proc/stat)
	echo $((busy - $(lab_ms)))
}

# settle: wait (at most 60 s) until the lab is idle, i.e. uses less than 5%
# of a core over a second: after the lab grows, the new pods' containers
# start and the agent programs them, and that work would land in the first
# repetition's numbers.
settle() {
	local t0 try
	for try in $(seq 60); do
		t0=$(lab_ms)
		sleep 1
		[ $(($(lab_ms) - t0)) -ge 50 ] || { echo "$try"; return 0; }
	done
	echo 60
}

# server_peers: the server pod's established TCP connections to the app's
# port and the inbound sidecar's, as "local port <- peer address × count":
# which hop the server's traffic came from.
server_peers() {
	inns "$SERVER_NETNS" ss -Htn state established |
		awk -v ports=" $PORT 15006 " '{ l = $3; p = $4; gsub(/\[::ffff:|\]/, "", l); gsub(/\[::ffff:|\]/, "", p)
			sub(/.*:/, "", l); sub(/:[0-9]+$/, "", p); if (index(ports, " " l " ")) c[l "<-" p]++ }
			END { for (k in c) printf "%s ×%d\n", k, c[k] }' | sort
}

capture_on() {
	# Outbound: every TCP connection the client pod opens, except to itself
	# and except the sidecar's own, goes to the sidecar. Inbound: what
	# arrives for the app's port goes to the server's sidecar.
	inns "$CLIENT_NETNS" iptables -t nat -A OUTPUT -p tcp ! -d 127.0.0.0/8 -m owner ! --uid-owner haproxy -j REDIRECT --to-ports 15001
	inns "$SERVER_NETNS" iptables -t nat -A PREROUTING -p tcp --dport "$PORT" -j REDIRECT --to-ports 15006
}

capture_off() {
	local ns
	for ns in "$CLIENT_NETNS" "$SERVER_NETNS"; do
		inns "$ns" iptables -t nat -F
		# iptables-nft keeps the emptied table and its hooked base chains,
		# which would keep NAT and connection tracking in the path of the
		# other cases: remove the table.
		inns "$ns" nft delete table ip nat 2>/dev/null || true
	done
}

# route_on: apply the HTTPRoute and wait until the node proxy serves it;
# on failure, say why in NODE_PROXY_SKIP and return 1.
route_on() {
	local try log=$OUT/route-apply.log
	if ! $SHUNT --instance "$INST" apply -f "$ROUTE" >"$log" 2>&1; then
		NODE_PROXY_SKIP="failed: \`shunt apply\` of the HTTPRoute was refused: $(head -3 "$log" | paste -sd' ' | sed 's/ *$//')"
		return 1
	fi
	for try in $(seq 100); do
		if [ -n "$(node_proxy_pids)" ] && in_pod "$INST" client shunt lab probe --http "$URL" --timeout 500ms >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	if [ -z "$(node_proxy_pids)" ]; then
		NODE_PROXY_SKIP="failed: no node proxy process in $CGROOT/$INST/proxy 20 s after the HTTPRoute was applied (see $OUT/shuntd.log and $OUT/proxy.log)"
	else
		NODE_PROXY_SKIP="failed: $URL does not answer through the node proxy 20 s after the HTTPRoute was applied (see $OUT/shuntd.log and $OUT/proxy.log)"
	fi
	route_off
	return 1
}

route_off() { $SHUNT --instance "$INST" delete -f "$ROUTE" >/dev/null 2>&1 || true; }

# accel_counter REASON: the sk_msg counter (direction sockmsg) of a reason.
accel_counter() {
	$SHUNT --instance "$INST" status -o json |
		jq -r --arg r "$1" '[.counters[]? | select(.direction == "sockmsg" and .reason == $r) | .packets] | add // 0'
}

# accel_on: acceleration on, then a new node proxy (`shunt proxy restart`:
# the new one takes over before the old one drains), so that the upstream
# connections of case (d) are opened accelerated, not reused from (b);
# returns once the route answers through the new proxy.
accel_on() {
	$SHUNT --instance "$INST" accel on >/dev/null || return 1
	$SHUNT --instance "$INST" proxy restart >"$OUT/proxy-restart.log" 2>&1 || return 1
	in_pod "$INST" client shunt lab probe --http "$URL" --timeout 2s >/dev/null 2>&1
}
accel_off() { $SHUNT --instance "$INST" accel off >/dev/null 2>&1 || true; }

# measure CASE N REP [PROXY PIDS...]: one load run; latency rows, and for
# the proxy cases their CPU and memory. Returns 1 when httpload failed.
measure() {
	local c=$1 n=$2 rep=$3
	shift 3
	local json=$OUT/httpload-$c-$n-$rep.json cpu0 cpu1 wait0 wait1 rss=0 pss=0 peers out0 outside steal0 steal
	cpu0=$(cpu_ticks "$@")
	wait0=$(run_delay_ns "$@")
	out0=$(outside_ms)
	steal0=$(steal_ms)
	# A plain command in the background, so LOAD_PID is the lab exec process
	# itself (cleanup stops it by that id; lab down kills what runs in pods).
	$SHUNT --instance "$INST" lab exec client -- timeout $((DURATION + WARMUP + 30)) taskset -c 0 \
		httpload -url "$URL" -qps "$QPS" -c "$CONNS" -duration "${DURATION}s" -warmup "${WARMUP}s" \
		${REQUESTS:+-requests "$(realpath "$OUT")/requests-$c-$n-$rep.txt"} >"$json" 2>"$json.err" &
	LOAD_PID=$!
	# Memory and the path in the middle of the measured window, while every
	# connection is open.
	sleep "$(awk -v w="$WARMUP" -v d="$DURATION" 'BEGIN { print w + d / 2 }')"
	if [ $# -gt 0 ]; then
		rss=$(mem_kib VmRSS "$@")
		pss=$(mem_kib Pss "$@")
	fi
	peers=$(server_peers | paste -sd, | sed 's/,/, /g')
	if ! wait "$LOAD_PID"; then
		LOAD_PID=
		tail -3 "$json.err" >&2
		return 1
	fi
	LOAD_PID=
	cpu1=$(cpu_ticks "$@")
	wait1=$(run_delay_ns "$@")
	outside=$(($(outside_ms) - out0))
	steal=$(($(steal_ms) - steal0))
	[ "$outside" -ge 0 ] || outside=0
	echo "n=$n rep $rep $c: server sockets: ${peers:-none}" >>"$OUT/path.txt"
	row "$c" p50 us "$(jq .p50_us "$json")" "$rep" "$n"
	row "$c" p90 us "$(jq .p90_us "$json")" "$rep" "$n"
	row "$c" p99 us "$(jq .p99_us "$json")" "$rep" "$n"
	row "$c" p99.9 us "$(jq .p999_us "$json")" "$rep" "$n"
	row "$c" steal ms "$steal" "$rep" "$n"
	local extra=""
	if [ $# -gt 0 ]; then
		local cpu_ms
		cpu_ms=$(awk -v t=$((cpu1 - cpu0)) -v hz="$HZ" 'BEGIN { printf "%.0f", t * 1000 / hz }')
		row "$c" proxy_cpu ms "$cpu_ms" "$rep" "$n"
		local wait_us
		wait_us=$(awk -v d=$((wait1 - wait0)) -v r="$(jq .requests "$json")" 'BEGIN { printf "%.1f", (r > 0 ? d / 1000 / r : 0) }')
		row "$c" proxy_wait us "$wait_us" "$rep" "$n"
		row "$c" proxy_rss MiB "$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')" "$rep" "$n"
		row "$c" proxy_pss MiB "$(awk -v k="$pss" 'BEGIN { printf "%.1f", k / 1024 }')" "$rep" "$n"
		extra=", $# proxies: CPU $cpu_ms ms, waiting for a CPU $wait_us µs/request, RSS $((rss / 1024)) MiB, PSS $((pss / 1024)) MiB"
		echo "$c $n $rep $# $cpu_ms" >>"$OUT/proxies.txt"
	fi
	jq -r --arg c "$c" --arg n "$n" --arg rep "$rep" --arg o "$outside" \
		'"\($c) \($n) \($rep) \(.requests) \(.errors) \(.qps) \($o)"' "$json" >>"$OUT/load.txt"
	printf 'n=%s rep %s %-10s p50 %8s µs  p99 %8s µs  p99.9 %8s µs  %s req/s, %s errors%s; CPU outside the lab %s ms, stolen by the hypervisor %s ms; above p99: %s in %s windows of 100 ms, %s in the worst\n' "$n" "$rep" "$c" \
		"$(jq .p50_us "$json")" "$(jq .p99_us "$json")" "$(jq .p999_us "$json")" "$(jq .qps "$json")" "$(jq .errors "$json")" "$extra" "$outside" "$steal" \
		"$(jq .slow "$json")" "$(jq .slow_windows "$json")" "$(jq .slow_in_worst_window "$json")"
}

run_case() {
	local c=$1 n=$2 rep=$3 pids
	case "$c" in
	no-proxy)
		measure no-proxy "$n" "$rep" || die "httpload failed for no-proxy, n=$n, repetition $rep (log: $OUT/httpload-no-proxy-$n-$rep.json.err)"
		grep -q "^n=$n rep $rep no-proxy: .*$PORT<-$CLIENT ×" "$OUT/path.txt" ||
			warn "n=$n rep $rep no-proxy: no connection from the client pod reached the server directly ($(tail -1 "$OUT/path.txt"))"
		;;
	node-proxy)
		[ -z "$NODE_PROXY_SKIP" ] || return 0
		route_on || { warn "case node-proxy: $NODE_PROXY_SKIP"; return 0; }
		mapfile -t pids < <(node_proxy_pids)
		echo "n=$n rep $rep node-proxy: proxy pids ${pids[*]}" >>"$OUT/path.txt"
		if ! measure node-proxy "$n" "$rep" "${pids[@]}"; then
			NODE_PROXY_SKIP="failed: httpload through the node proxy failed at n=$n, repetition $rep ($(tail -1 "$OUT/httpload-node-proxy-$n-$rep.json.err"))"
			warn "case node-proxy: $NODE_PROXY_SKIP"
		elif [ "$(tail -1 "$OUT/proxies.txt" | awk '{ print $5 }')" = 0 ]; then
			# The proxy did no work: the requests took another path.
			warn "n=$n rep $rep node-proxy: the node proxy used no CPU during the run: did the connections reach it? ($(tail -1 "$OUT/path.txt"))"
			echo "n=$n rep $rep node-proxy: NOT THROUGH THE PROXY (it used no CPU)" >>"$OUT/path.txt"
		elif grep -q "^n=$n rep $rep node-proxy: .*$PORT<-$CLIENT ×" "$OUT/path.txt"; then
			# The proxy dials from the node address: connections from the
			# client pod's own address went around it.
			warn "n=$n rep $rep node-proxy: the server sees connections from the client pod's address: some went around the proxy? ($(tail -1 "$OUT/path.txt"))"
		fi
		route_off
		;;
	node-proxy-accel)
		[ -z "$NODE_PROXY_SKIP" ] || return 0
		route_on || { warn "case node-proxy-accel: $NODE_PROXY_SKIP"; return 0; }
		if ! accel_on; then
			accel_off
			route_off
			die "case node-proxy-accel: turning acceleration on and restarting the node proxy failed (see $OUT/proxy-restart.log)"
		fi
		local added0 moved0 added moved
		added0=$(accel_counter accel-added)
		moved0=$(accel_counter accel-redirected)
		mapfile -t pids < <(node_proxy_pids)
		echo "n=$n rep $rep node-proxy-accel: proxy pids ${pids[*]}" >>"$OUT/path.txt"
		measure node-proxy-accel "$n" "$rep" "${pids[@]}" || { accel_off; route_off; die "httpload failed for node-proxy-accel, n=$n, repetition $rep (log: $OUT/httpload-node-proxy-accel-$n-$rep.json.err)"; }
		added=$(($(accel_counter accel-added) - added0))
		moved=$(($(accel_counter accel-redirected) - moved0))
		echo "n=$n rep $rep node-proxy-accel: accel-added +$added sockets, accel-redirected +$moved sends" >>"$OUT/path.txt"
		# Both legs: each of the client's $CONNS connections adds its two
		# ends (client, proxy), each upstream connection two more (proxy,
		# server); every request is two redirected sends per leg.
		[ "$added" -ge $((2 * CONNS + 2)) ] && [ "$moved" -ge "$((QPS * DURATION * 2))" ] ||
			warn "n=$n rep $rep node-proxy-accel: accel-added +$added, accel-redirected +$moved: want >= $((2 * CONNS + 2)) sockets and >= $((QPS * DURATION * 2)) sends (both legs accelerated)"
		accel_off
		route_off
		;;
	sidecars)
		mapfile -t pids < <(sidecar_pids)
		[ "${#pids[@]}" = "$n" ] || die "expected $n HAProxy sidecars (one per pod), found ${#pids[@]}: see bin/shunt --instance $INST lab logs POD -c sidecar"
		capture_on
		measure sidecars "$n" "$rep" "${pids[@]}" || { capture_off; die "httpload failed for sidecars, n=$n, repetition $rep (log: $OUT/httpload-sidecars-$n-$rep.json.err)"; }
		capture_off
		grep -q "^n=$n rep $rep sidecars: .*15006<-$CLIENT ×" "$OUT/path.txt" ||
			warn "n=$n rep $rep sidecars: nothing reached the server pod's inbound sidecar ($(tail -1 "$OUT/path.txt"))"
		;;
	esac
}

# --- the run ------------------------------------------------------------------------

echo "mesh: ${PODS[*]} pods; $REPS repetitions of $DURATION s (+ ${WARMUP} s warm-up) at $QPS requests/s over $CONNS connections; output in $OUT"
cat >"$OUT/commands.txt" <<EOT
# ${BENCH_INVOCATION:-bench/mesh.sh${ORIG_ARGS:+ $ORIG_ARGS}} (reps $REPS, duration $DURATION s)
# per pod count N (the lab grows: same instance, a superset manifest; service web, client, server, N-2 idle pods, each with an HAProxy sidecar container):
bin/shunt --instance $INST lab up --mode redirect-peer --pod-cidr $POD_CIDR --service-cidr $SVC_CIDR -f $OUT/pods-N.yaml
# sidecar container in every pod: haproxy -db -f $OUT/sidecar.cfg
# every case and repetition (order rotating), from the client pod to the service:
bin/shunt --instance $INST lab exec client -- taskset -c 0 httpload -url http://CLUSTER_IP:$PORT/ -qps $QPS -c $CONNS -duration ${DURATION}s -warmup ${WARMUP}s
# node-proxy (b), around the run:
bin/shunt --instance $INST apply -f $ROUTE     # ... delete -f $ROUTE after
# node-proxy-accel (d): as (b), and before the run (then accel off):
bin/shunt --instance $INST accel on && bin/shunt --instance $INST proxy restart
# sidecars (c), around the run (then iptables -t nat -F; nft delete table ip nat in both):
nsenter --net=$CLIENT_NETNS iptables -t nat -A OUTPUT -p tcp ! -d 127.0.0.0/8 -m owner ! --uid-owner haproxy -j REDIRECT --to-ports 15001
nsenter --net=$SERVER_NETNS iptables -t nat -A PREROUTING -p tcp --dport $PORT -j REDIRECT --to-ports 15006
# proxies' CPU: utime+stime of /proc/PID/stat before and after the run; memory: VmRSS (/proc/PID/status) and Pss (/proc/PID/smaps_rollup) summed, mid-run
# path check, mid-run: nsenter --net=$SERVER_NETNS ss -Htn state established
EOT

cases=(no-proxy node-proxy sidecars node-proxy-accel)
first=1
for n in "${PODS[@]}"; do
	m=$(manifest "$n")
	if [ -n "$first" ]; then
		# 9>&-: the agent this starts must not inherit (and keep) the run lock.
		lab_up "$INST" redirect-peer "$POD_CIDR" "$m" --service-cidr "$SVC_CIDR" 9>&-
		first=
		CLIENT=$(pod_ip "$INST" client)
		AGENT_PID=$($SHUNT --instance "$INST" status -o json | jq -r .pid)
		VIP=$($SHUNT --instance "$INST" get services web -o json | jq -r .spec.clusterIP)
		URL=http://$VIP:$PORT/
		echo "# CLUSTER_IP = $VIP (service web); client pod $CLIENT, server pod $(pod_ip "$INST" server)" >>"$OUT/commands.txt"
	else
		$SHUNT --instance "$INST" lab up -f "$m" >"$OUT/lab-up-$n.log" 2>&1 ||
			{ tail -5 "$OUT/lab-up-$n.log" >&2; die "growing the lab to $n pods failed"; }
	fi
	[ "$($SHUNT --instance "$INST" get pods -o json | jq '.items | length')" = "$n" ] || die "the lab does not have $n pods"
	wait_ready "$URL" || die "$URL does not answer from the client pod"
	echo "mesh: $n pods up; the lab settled (idle) after $(settle) s"
	for rep in $(seq "$REPS"); do
		for i in "${!cases[@]}"; do
			run_case "${cases[$(((i + rep - 1) % ${#cases[@]}))]}" "$n" "$rep"
		done
	done
done

# --- report -------------------------------------------------------------------------

# Medians first (benchreport writes medians.json; the report is rewritten by
# finish below), for the targets and the verdict.
jq -s . "$ROWS" >"$OUT/results.json"
go run ./bench/cmd/benchreport -in "$OUT/results.json" -baseline no-proxy >/dev/null
med() {
	jq -r --arg c "$1" --argjson n "$2" --arg m "$3" \
		'map(select(.case == $c and (.n // 0) == $n and .metric == $m)) | .[0].value // empty' "$OUT/medians.json"
}
# calc AWK-EXPRESSION: arithmetic on medians ("" when an operand is missing).
calc() { awk "BEGIN { printf \"%.2f\", $1 }"; }
# ratio A B: A / B with two decimals, or — when either is missing.
num() { [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; }
ratio() { if num "$1" && num "$2" && awk -v d="$2" 'BEGIN { exit (d == 0) }'; then calc "$1 / $2"; else echo —; fi; }
minus() { if num "$1" && num "$2"; then calc "$1 - $2"; else echo —; fi; }
# meets VALUE OP LIMIT: "met" or "missed" ("—" without a value).
meets() {
	num "$1" || { echo —; return; }
	awk -v v="$1" -v l="$3" -v op="$2" 'BEGIN { ok = (op == "<=") ? v <= l : v >= l; print ok ? "met" : "missed" }'
}

NOTES=$OUT/notes.md
LAST=${PODS[${#PODS[@]}-1]}
{
	cat <<EOT
Cases: **no-proxy** (a) = client pod → service ClusterIP → server pod, shunt's socket load balancing only (the baseline of the ratios); **node-proxy** (b) = the same with an HTTPRoute (parentRef: the service) so the socket hooks send the connections to shunt's node proxy, which forwards them; **sidecars** (c) = an HAProxy $(haproxy -v | awk 'NR == 1 { print $3 }') sidecar in every pod (HTTP mode, keep-alive both sides, \`http-reuse always\`, one thread, maxconn 1024), traffic captured by iptables REDIRECT in the pods' own namespaces: outbound in the client pod (to 127.0.0.1:15001, the sidecar's own uid excluded), inbound in the server pod (port $PORT to 15006). The outbound sidecar forwards to the original destination, read with SO_ORIGINAL_DST (\`server 0.0.0.0:0\`); shunt's connect hook has already translated the ClusterIP at that point, so that destination is the server pod's address and the sidecar does no load balancing of its own (an Envoy sidecar would pick the endpoint itself). HAProxy is a lean sidecar (≈ 14 MiB RSS, ≈ 3.5 MiB PSS idle, against tens of MiB for an Envoy sidecar): the memory baseline is a favourable one for the sidecar model.
**node-proxy-accel** (d) = (b) with socket acceleration on (\`shunt accel on\`, the node proxy restarted first so that its upstream connections are opened accelerated): client → proxy and proxy → server both through sk_msg redirects; path.txt records the accel-added and accel-redirected counters of each run.
Load: \`httpload\` (bench/cmd/httpload, fortio as a library) from the client pod, $QPS requests/s over $CONNS keep-alive connections, requests staggered evenly (fortio's uniform mode, no bursts), ${WARMUP} s warm-up left out, then $DURATION s measured; latencies are every successful request's, exactly (not fortio's histogram). Server: \`shunt lab serve --http $PORT\` (Go net/http), pinned to CPU 1; client pinned to CPU 0; proxies unpinned. One client/server pair carries all the load; n counts every pod of the lab (client, server and n-2 idle pods), each with its sidecar container (idle without capture rules).
proxy_cpu: user + system CPU time of the proxies over the whole load run (warm-up included, $((DURATION + WARMUP)) s): the node proxy for (b) and (d), all n sidecars for (c) (idle ones use ~0). proxy_rss: VmRSS summed; proxy_pss: proportional set size summed (pages the HAProxy processes share, such as their libraries, counted once), both sampled mid-run. proxy_wait: how long the proxies' threads waited on a run queue (runnable, not running: /proc/PID/task/TID/schedstat) over the load run, per request: the part of what a proxy adds to a request that is waiting for a CPU, not working. (a) runs no proxy: those cells are empty.
EOT
	if [ -n "$NODE_PROXY_SKIP" ]; then
		echo
		echo "**node-proxy (b): $NODE_PROXY_SKIP.**"
	fi
	echo
	echo "Targets and what the sidecars add (medians; added = p99 of the case minus p99 of no-proxy at the same n):"
	echo
	echo "| pods | p99 (a) µs | p99 (b) µs | (b) × (a) | p99 (c) µs | (c) × (a) | added by (b) µs | added by (c) µs | (b)/(c) added | CPU (b)/(c) | RSS (b)/(c) | PSS (b)/(c) |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
	for n in "${PODS[@]}"; do
		a=$(med no-proxy "$n" p99) b=$(med node-proxy "$n" p99) c=$(med sidecars "$n" p99)
		addb=$(minus "$b" "$a") addc=$(minus "$c" "$a")
		echo "| $n | ${a:-—} | ${b:-—} | $(ratio "$b" "$a") | ${c:-—} | $(ratio "$c" "$a") | $addb | $addc | $(ratio "${b:+$addb}" "${c:+$addc}") | $(ratio "$(med node-proxy "$n" proxy_cpu)" "$(med sidecars "$n" proxy_cpu)") | $(ratio "$(med node-proxy "$n" proxy_rss)" "$(med sidecars "$n" proxy_rss)") | $(ratio "$(med node-proxy "$n" proxy_pss)" "$(med sidecars "$n" proxy_pss)") |"
	done
	echo
	# Issue 31's targets, at every pod count of the run.
	for n in "${PODS[@]}"; do
		a=$(med no-proxy "$n" p99) b=$(med node-proxy "$n" p99) c=$(med sidecars "$n" p99)
		if [ -z "$b" ]; then
			echo "- Targets at n=$n: not measured (no node-proxy (b) rows)."
			continue
		fi
		cpu=$(ratio "$(med node-proxy "$n" proxy_cpu)" "$(med sidecars "$n" proxy_cpu)")
		echo "- Target: (b)'s CPU ≤ ½ of the sidecar pair's (c), at n=$n: $(meets "$cpu" "<=" 0.5) ($(med node-proxy "$n" proxy_cpu) vs $(med sidecars "$n" proxy_cpu) ms: $cpu)."
		echo "- Target: (b) p99 ≤ (c) p99 and ≤ 1.5× (a), at n=$n: $(meets "$(ratio "$b" "$c")" "<=" 1) and $(meets "$(ratio "$b" "$a")" "<=" 1.5) ($b µs against (c) $c and (a) $a: $(ratio "$b" "$c")× (c), $(ratio "$b" "$a")× (a))."
		d=$(med node-proxy-accel "$n" p50) c50=$(med sidecars "$n" p50)
		if [ -n "$d" ]; then
			echo "- Target: (d) p50 ≤ (c) p50, at n=$n: $(meets "$(ratio "$d" "$c50")" "<=" 1) ($d vs $c50 µs; (d) p99 $(med node-proxy-accel "$n" p99) µs; CPU (d)/(c) $(ratio "$(med node-proxy-accel "$n" proxy_cpu)" "$(med sidecars "$n" proxy_cpu)"), (d)/(b) $(ratio "$(med node-proxy-accel "$n" proxy_cpu)" "$(med node-proxy "$n" proxy_cpu)"))."
		else
			echo "- Target: (d) p50 ≤ (c) p50, at n=$n: not measured."
		fi
	done
	if [[ " ${PODS[*]} " == *" 150 "* ]]; then
		for m in proxy_rss:"memory (VmRSS)":MiB proxy_pss:"memory (PSS)":MiB; do
			IFS=: read -r m what unit <<<"$m"
			bv=$(med node-proxy 150 "$m") cv=$(med sidecars 150 "$m")
			if [ -n "$bv" ]; then
				echo "- Target: at 150 pods (b) uses ≤ 1/20 of (c)'s $what: $(meets "$(ratio "$bv" "$cv")" "<=" 0.05) ($bv vs $cv $unit: $(ratio "$bv" "$cv"))."
			else
				echo "- Target: at 150 pods (b) uses ≤ 1/20 of (c)'s $what: not measured. (c): ${cv:-—} $unit."
			fi
		done
	else
		echo "- Target at 150 pods ((b) ≤ 1/20 of (c)'s memory): not judged, 150 is not among the pod counts of this run (${PODS[*]})."
	fi
	echo
	echo "Load achieved (per case: requests measured, errors, lowest request rate of a repetition; CPU time the machine spent outside the lab during the runs, i.e. other work on a shared machine, which lands in the tail percentiles: median and largest per run, of $(((DURATION + WARMUP) * $(nproc) * 1000)) ms available):"
	for c in "${cases[@]}"; do
		sort -n -k7 "$OUT/load.txt" | awk -v c="$c" -v q="$QPS" '$1 == c { k++; r += $4; e += $5; if (k == 1 || $6 < min) min = $6; o[k] = $7; at[k] = "n=" $2 " rep " $3 }
			END { if (k) printf "- %s: %d requests, %d errors, lowest %.0f req/s%s; outside the lab: median %d ms, largest %d ms (%s)\n", c, r, e, min,
				(min < 0.95 * q ? " (BELOW the target rate: the client or the path could not keep up)" : ""), o[int((k + 1) / 2)], o[k], at[k] }'
	done
	echo
	echo "Path check: the server pod's established connections in the middle of each run (local port <- peer; client pod $CLIENT; no-proxy expects $PORT<-client, sidecars 15006<-client and $PORT<-127.0.0.1, node-proxy and node-proxy-accel $PORT<-the proxy's address; idle keep-alive connections of the sidecars' pools may linger into the next case):"
	echo
	sed 's/^/- /' "$OUT/path.txt"
	echo
	echo "Per-repetition values: results.json; min/max per median: medians.json; httpload output: httpload-CASE-N-REP.json; sidecar configuration: sidecar.cfg; manifests: pods-N.yaml, route.yaml."
} >"$NOTES"

# The verdict, in one line: what (b) costs against (a) and (c) at the largest n.
a=$(med no-proxy "$LAST" p99) b=$(med node-proxy "$LAST" p99) c=$(med sidecars "$LAST" p99)
if [ -n "$b" ]; then
	verdict="at n=$LAST, node-proxy p99 $(ratio "$b" "$a")× no-proxy (target ≤ 1.5×: $(meets "$(ratio "$b" "$a")" "<=" 1.5)) and $(ratio "$b" "$c")× the sidecars' (target ≤ 1: $(meets "$(ratio "$b" "$c")" "<=" 1)); CPU $(ratio "$(med node-proxy "$LAST" proxy_cpu)" "$(med sidecars "$LAST" proxy_cpu)")× the sidecar pair's (target ≤ 0.5), RSS $(ratio "$(med node-proxy "$LAST" proxy_rss)" "$(med sidecars "$LAST" proxy_rss)")× (target ≤ 0.05 at 150 pods)."
else
	verdict="node-proxy (b) $NODE_PROXY_SKIP; at n=$LAST the sidecars add $(minus "$c" "$a") µs to p99 ($(ratio "$c" "$a")× no-proxy) and $(minus "$(med sidecars "$LAST" p50)" "$(med no-proxy "$LAST" p50)") µs to p50; $LAST sidecars: CPU $(med sidecars "$LAST" proxy_cpu) ms over the run, RSS $(med sidecars "$LAST" proxy_rss) MiB, PSS $(med sidecars "$LAST" proxy_pss) MiB."
fi
# p50 and p99 per repetition against (a) beside both runs' steal (each
# case's "steal" row).
finish "HTTP through a node proxy vs a sidecar mesh" no-proxy -verdict "$verdict" \
	-paired p50,p99

# The node proxy was there but did not measure: the run failed.
if [ -n "$NODE_PROXY_EXPECTED" ] && { [ -n "$NODE_PROXY_SKIP" ] || grep -q "NOT THROUGH THE PROXY" "$OUT/path.txt"; }; then
	die "case node-proxy (b) did not measure what it should: ${NODE_PROXY_SKIP:-some runs did not go through the proxy (path.txt)}"
fi
