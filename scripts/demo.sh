#!/usr/bin/env bash
# The lab demo behind `make demo`: a node of pods built from examples/demo,
# traffic between them through shunt's BPF datapath, and what it counted.
set -euo pipefail
cd "$(dirname "$0")/.."
# DEMO_INSTANCE and DEMO_NODES_INSTANCE (environment): the two labs'
# instance names (default: the default instance, and "nodes");
# DEMO_LAB_FLAGS: more `lab up` flags for the first (its pod CIDR, say);
# DEMO_BIN: where the shunt binaries are (default: bin, make build's). The
# test suite runs the demo under names and addresses of its own
# (test/e2e's TestDemo), beside whatever labs the machine has.
BIN=${DEMO_BIN:-bin}
NODES=${DEMO_NODES_INSTANCE:-nodes}
shunt() { "$BIN/shunt" ${DEMO_INSTANCE:+--instance "$DEMO_INSTANCE"} "$@"; }
# First lines of a command's output with `sed -n 1,Np`, never `head`: head
# exits early, the writer dies of SIGPIPE if it writes after that, and
# pipefail fails the demo (a flake: 1 run in 3 lost this race).
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "starting the lab (forwarding mode ${MODE:-redirect-peer}) with examples/demo"
# shellcheck disable=SC2086 # DEMO_LAB_FLAGS is a list of flags
shunt lab up -f examples/demo/ ${MODE:+--mode "$MODE"} ${DEMO_LAB_FLAGS:-}

step "pods"
shunt get pods -A -o wide

ip_of() { shunt get pods -n "$1" "$2" -o json | jq -r .status.podIP; }
v1=$(ip_of shop backend-v1)
v2=$(ip_of shop backend-v2)
fe=$(ip_of shop frontend)
node=$(shunt status -o json | jq -r .nodeIP)

step "frontend -> backends: TCP, UDP (unconnected socket) and HTTP, pod to pod on the node"
shunt lab exec -n shop frontend -- shunt lab probe \
	--tcp "$v1:9000" --udp "$v1:9000" --http "http://$v1:8080/" \
	--tcp "$v2:9000" --udp "$v2:9000" --http "http://$v2:8080/"

step "services: the backend ClusterIP, translated at connect time in the socket layer"
shunt get svc -n shop -o wide
shunt map dump services
vip=$(shunt get svc -n shop backend -o json | jq -r .spec.clusterIP)
shunt lab exec -n shop frontend -- shunt lab probe --tcp "$vip:9000" --count 10 | tail -n 1
shunt lab exec -n shop frontend -- shunt lab probe --udp "$vip:9000" --count 10 | tail -n 1
shunt lab exec -n shop frontend -- shunt lab probe --http "http://$vip/" --count 10 | tail -n 1
echo "(the application sees the ClusterIP as its peer:)"
shunt lab exec -n shop frontend -- shunt lab probe --tcp "$vip:9000" -o json | jq -c '{peer, remote}'

step "monitoring/scraper -> frontend (HTTP) and -> backend-v1 (ICMP)"
shunt lab exec -n monitoring scraper -- shunt lab probe --http "http://$fe/" --count 3
shunt lab exec -n monitoring scraper -- ping -c 2 -W 1 "$v1" | tail -n 2

step "pod -> node ($node) and node -> pod"
shunt lab exec -n shop frontend -- ping -c 1 -W 1 "$node" | tail -n 2
"$BIN/shunt" lab probe --http "http://$fe/"

step "network policy (examples/policy): backends take their API only from the frontend"
shunt apply -f examples/policy/
shunt get identities
shunt map dump policy shop/backend-v1
echo "frontend -> backend ClusterIP (allowed):"
shunt lab exec -n shop frontend -- shunt lab probe --tcp "$vip:9000" --count 4 | tail -n 1
echo "scraper -> backend-v1 API (denied: dropped at the backend's veth):"
shunt lab exec -n monitoring scraper -- shunt lab probe --tcp "$v1:9000" --timeout 500ms --expect timeout
echo "scraper -> backend-v1 HTTP (allowed by the namespace rule):"
shunt lab exec -n monitoring scraper -- shunt lab probe --http "http://$v1:8080/"
echo "why (computed from the same state the datapath holds, no traffic sent):"
shunt policy trace --from monitoring/scraper --to shop/backend-v1 --port 9000 || true
shunt policy trace --from shop/frontend --to shop/backend-v1 --port 9000
shunt policy trace --from monitoring/scraper --to shop/frontend --port 8443 || true

step "L7 (examples/l7): a 90/10 split of reviews and HTTP policy, in the node proxy (no sidecars)"
shunt apply -f examples/l7/
shunt get httproutes -o wide
for i in $(seq 50); do
	st=$(shunt proxy status)
	case "$st" in healthy*) break ;; esac
	sleep 0.1
done
shunt proxy status
reviews=$(shunt get svc reviews -o json | jq -r .spec.clusterIP)
backend=$(shunt get svc backend -o json | jq -r .spec.clusterIP)
shunt lab exec frontend -- shunt lab probe --http "http://$reviews:9080/" >/dev/null 2>&1 || true # wait for the servers
echo "1000 requests from frontend to reviews over one keep-alive connection, split per request:"
shunt lab exec frontend -- shunt lab http-load --url "http://$reviews:9080/" -n 1000 -c 1 | jq -c '{byPod, byStatus}'
echo "the same with the canary header (the route's header match wins over the weights):"
shunt lab exec frontend -- shunt lab http-load --url "http://$reviews:9080/" -n 20 -c 1 -H 'x-canary: true' | jq -c '{byPod}'
echo "frontend may only GET /metrics on backend; monitoring may do anything:"
shunt lab exec frontend -- shunt lab http-get "http://$backend:8080/metrics" | sed -n 1p
shunt lab exec frontend -- shunt lab http-get "http://$backend:8080/admin"
shunt lab exec monitoring -- shunt lab http-get "http://$backend:8080/admin" | sed -n 1p
echo "the 403 as a flow, with the rule that decided:"
shunt observe --protocol http --http-status 403 --last 1

step "socket acceleration: local TCP skips the stack (sockops + sk_msg), once tc admitted the connection"
shunt accel on
shunt lab exec -n shop frontend -- shunt lab probe --tcp "$v2:9000" --send "hello" --hold 2s >/dev/null &
sleep 1
shunt accel
shunt map dump shunt_sockhash
wait
sleep 0.5
echo "the connection's flows: accelerated at its start, each end's bytes when it closed:"
shunt observe --last 100 | grep -E 'accelerated' | tail -n 3
shunt accel off

step "flows: what the datapath reported (connection starts and ends, translations, drops with their reason)"
shunt observe --last 12 -o table
echo
echo "only the drops:"
shunt observe --verdict DROPPED

step "the agent: health, programs, map pressure, counters by reason (also as Prometheus metrics: shunt metrics)"
shunt status

# A second lab, of two nodes: each node its own agent in a network
# namespace of its own, joined by an underlay; a host outside the cluster.
nodes() { "$BIN/shunt" --instance "$NODES" "$@"; }
step "two nodes (examples/nodes): an agent each in its own network namespace, joined by an underlay, VXLAN in tc between them"
nodes lab up --nodes 2 -f examples/nodes/pods.yaml
nodes get nodes -o wide
nodes get pods -o wide
web=$(nodes get pods web -o json | jq -r .status.podIP)
webvip=$(nodes get svc web -o json | jq -r .spec.clusterIP)
echo "client (node-1) -> web (node-2) through its ClusterIP: translated at connect on node-1, encapsulated by tc, delivered by tc on node-2:"
nodes lab exec client -- shunt lab probe --http "http://$webvip/" --count 3
sleep 0.3 # the agents read flow events every 100 ms
echo "the same connections as both nodes saw them (flows merged by time, each with its node):"
nodes observe --last 8

step "a cross-node drop: web takes connections from the client only (examples/nodes/policy.yaml)"
nodes apply -f examples/nodes/policy.yaml
echo "intruder (node-1) -> web (node-2): dropped on node-2, which knows the intruder by the identity in the VNI:"
nodes lab exec intruder -- shunt lab probe --http "http://$web:8080/" --timeout 500ms --expect timeout
sleep 0.3
nodes observe --node node-2 --verdict DROPPED --last 1
nodes lab exec client -- shunt lab probe --http "http://$web:8080/"

step "masquerade in BPF: client -> a host outside the cluster, which sees node-1's address"
# The shunt binary itself in the background (not the shell function
# `nodes`), so $! is its PID: the kill below reaches it, and it passes
# SIGTERM on.
"$BIN/shunt" --instance "$NODES" lab exec --external -- shunt lab serve --tcp 7000 >/dev/null 2>&1 &
outside=$!
sleep 0.5
"$BIN/shunt" --instance "$NODES" lab exec client -- shunt lab probe --tcp 192.168.123.254:7000 --hold 1s >/dev/null &
held=$!
sleep 0.5
echo "the outside host's connections (peer = node-1's underlay address, port from the masquerade range):"
nodes lab exec --external -- ss -tn state established '( sport = :7000 )'
wait "$held" || true
kill "$outside" 2>/dev/null || true
wait "$outside" 2>/dev/null || true
nodes map dump shunt_masq_nat | sed -n 1,5p
nodes status | grep -E '^(== |tunnel|peer|masquerade)'

cat <<EOT

The lab stays up. Try:
  bin/shunt get pods -A -o wide
  bin/shunt lab exec -n shop frontend -- shunt lab probe --tcp $v2:9000 --count 5
  bin/shunt lab logs -n shop backend-v1
  bin/shunt observe -f --namespace shop          (follow flows; --verdict DROPPED, -o json, ...)
  bin/shunt map list; bin/shunt map dump shunt_ct
  bin/shunt --instance $NODES observe -f               (the two-node lab's flows, every node's)
  bin/shunt --instance $NODES lab exec --external -- ping -c1 192.168.123.2
Remove them with: make demo-down   (or bin/shunt lab down; bin/shunt --instance $NODES lab down)
EOT
