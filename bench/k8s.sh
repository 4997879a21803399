#!/usr/bin/env bash
# Kubernetes benchmark: shunt against the real kube-proxy (iptables and
# nftables modes, built from the same k8s.io/kubernetes release as the
# control plane) on one real API server and controller-manager, side by side
# in one run. Every dataplane watches the same API server and programs the
# same selector-less Services, each with a hand-written EndpointSlice of the
# same ten endpoint addresses:
#   shunt                 `shunt lab up --kubeconfig`, its pods run by the
#                         lab's kubelet through shunt-cni
#   kube-proxy-iptables   kube-proxy in its own network namespace (its rules
#   kube-proxy-nftables   never leave it), ten pods there on veths
# Per scale N (Services) and repetition: cold sync (create N Services and
# slices with 32 workers, then time until a late Service answers through
# each dataplane, from the end of the creation), one Service created ->
# first answered connection p50/p99, new connections per second through a
# ClusterIP, a cold start of each (kube-proxy restarted with its rules
# removed; shuntd restarted), and the resident memory of shuntd and each
# kube-proxy with 1 000 NetworkPolicies loaded too (selecting no pod).
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE_OPT=--n
SCALE_LIST="1000 10000"
SMOKE_SCALE_LIST=10
source bench/lib.sh

bench_out k8s
scripts/kube-build.sh >/dev/null
CHANGES=20 POLICIES=1000 SETTLE=30s
[ -z "$SMOKE" ] || CHANGES=2 POLICIES=10 SETTLE=1s
go build -o bin/ ./bench/cmd/k8sbench ./bench/cmd/connrate

cat >"$OUT/commands.txt" <<EOT
bin/k8sbench -n $(echo $SCALE_LIST | tr ' ' ,) -reps $REPS -duration ${DURATION}s -changes $CHANGES -policies $POLICIES -settle $SETTLE -bin bin -rows $ROWS -out $OUT/logs
# inside: the control plane (internal/kubecluster: etcd, kube-apiserver, kube-controller-manager), then
bin/shunt lab up --kubeconfig KUBECONFIG --node-name shunt-node --service-cidr 10.96.0.0/16
ip netns exec NS kube-proxy --kubeconfig KC --hostname-override kp-MODE --proxy-mode MODE --cluster-cidr 10.221.0.0/16   # MODE = iptables, nftables
ip netns exec CLIENT_NS taskset -c 0 bin/connrate -target CLUSTER_IP:80 -workers 4 -duration ${DURATION}s
EOT
bin/k8sbench -n "$(echo $SCALE_LIST | tr ' ' ,)" -reps "$REPS" -duration "${DURATION}s" -changes "$CHANGES" -policies "$POLICIES" -settle "$SETTLE" -bin bin -rows "$ROWS" -out "$OUT/logs" 2>&1 | tee "$OUT/k8sbench.log"

NOTES=$OUT/notes.md
cat >"$NOTES" <<'EOT'
cold_sync: from the moment the last of the N Services and slices was created until a connection through the last Service's ClusterIP is answered (each dataplane programs while the objects arrive; api_create is how long the API server took to accept them). change_p50/p99: one new Service, from the create call to its first answered connection (committed_to_answer: from when the API server held the Service and its slice, i.e. without the API server's own time). cold_start: kube-proxy stopped, its rules removed (the namespace's ruleset flushed with nft: `kube-proxy --cleanup` itself restores the whole iptables table, minutes at 10 000 Services), started again, until the late Service answers (capped at 120 s, recorded as the cap); shuntd stopped and started again until ready (listed every object, a sync covered them; its pinned maps answer meanwhile). kube-proxy runs with its default settings, whose minimum time between syncs (--iptables-min-sync-period / --nftables-min-sync-period, 1 s) bounds its change latency; shunt coalesces events for at most a few milliseconds. rss: VmRSS after the cold sync, with 1 000 NetworkPolicies (selecting no pod) loaded as well.
EOT
finish "shunt vs kube-proxy on a real control plane" kube-proxy-iptables
