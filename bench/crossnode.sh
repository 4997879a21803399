#!/usr/bin/env bash
# Cross-node benchmark (issue 18): two nodes on this machine, each a network
# namespace joined by an underlay bridge, one real control plane; a client
# pod on node 1, ten server pods on node 2, side by side in one run:
#   floor            flannel-style VXLAN (a Linux VXLAN device, static
#                    FDB/neighbour entries, a bridge, host routes), no rules:
#                    the baseline of the ratios
#   calico-iptables  floor + the real kube-proxy (iptables) in both nodes +
#                    Calico-shaped iptables policy (a chain per pod, one rule
#                    per allowed peer, 100 policies) on the server's node
#   nftables         floor + the real kube-proxy (nftables) in both nodes
#   shunt-vxlan      shunt's agent per node, --tunnel vxlan, the same 100
#                    policies as NetworkPolicies
#   shunt-native     the same with --routing native (no encapsulation: the
#                    nodes route each other's pod CIDRs, tc forwards with
#                    bpf_fib_lookup), two more Nodes on shunt-vxlan's underlay
# At N other Services (10 endpoints each): sockperf TCP ping-pong (14-byte
# messages) to the pod IP and through a ClusterIP (avg, p50, p99, trans/s,
# machine-wide softirq CPU per transaction), new connections/s through the
# ClusterIP (bench/cmd/connrate), iperf3 single-stream throughput.
# bench/cmd/crossnode builds, measures and removes everything.
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE_OPT=--n
SCALE_LIST="0 1000"
SMOKE_SCALE_LIST=10 # --smoke: one small scale (N > 0 takes every path N = 0 takes, and more)
source bench/lib.sh

bench_out crossnode
for tool in sockperf iperf3 iptables-restore nft conntrack nsenter taskset bridge jq; do
	command -v "$tool" >/dev/null || { echo "crossnode: $tool is missing: run scripts/setup.sh" >&2; exit 1; }
done
scripts/kube-build.sh >/dev/null
go build -o bin/ ./bench/cmd/crossnode ./bench/cmd/connrate
SCALES=$(echo $SCALE_LIST | tr ' ' ,)
POLICIES=100 SETTLE=5s SMOKE_FLAG=
# --smoke: nothing to let settle, the cases measured at once (the numbers
# mean nothing; every case's path still runs end to end)
[ -z "$SMOKE" ] || POLICIES=10 SETTLE=0s SMOKE_FLAG=-smoke

cat >"$OUT/commands.txt" <<EOT
# ${BENCH_INVOCATION:-bench/crossnode.sh} (reps $REPS, duration $DURATION s, N = $SCALES)
bin/crossnode -n $SCALES -reps $REPS -duration ${DURATION}s -settle $SETTLE $SMOKE_FLAG -policies $POLICIES -bin bin -rows $ROWS -out $OUT
# every command it ran, exactly and in order: commands-run.txt (Nodes, Pods, Services, slices and NetworkPolicies go through the API with client-go); in short:
# inside: the control plane (internal/kubecluster), per case an underlay namespace (bridge br0) and two node namespaces (ul0 192.168.U.1/.2), an API relay on each node's loopback, then
nsenter --net=/run/netns/NODE bin/shunt --instance INST lab up --kubeconfig KC --node-name INST --service-cidr 10.96.0.0/16 --mode redirect-peer --tunnel vxlan --cluster-cidr 10.252.0.0/16   # shunt-vxlan, per node
nsenter --net=/run/netns/NODE bin/shunt --instance INST lab up --kubeconfig KC --node-name INST --service-cidr 10.96.0.0/16 --mode redirect-peer --routing native --cluster-cidr 10.252.0.0/16   # shunt-native, per node (ul0 192.168.77.3/.4, on shunt-vxlan's bridge)
ip -n NODE link add flannel.1 type vxlan id 1 local UNDERLAY dev ul0 dstport 8472 nolearning; ip -n NODE addr add PODNET.0/32 dev flannel.1   # floor, calico-iptables, nftables, per node
ip -n NODE neigh add PEERNET.0 lladdr PEERMAC dev flannel.1 nud permanent; bridge -n NODE fdb append PEERMAC dev flannel.1 dst PEER_UNDERLAY self permanent
ip -n NODE route add PEER_POD_CIDR via PEERNET.0 dev flannel.1 onlink; ip -n NODE link add cni0 type bridge; pods on veths (MTU 1450) in cni0, gateway PODNET.1
nsenter --net=/run/netns/NODE kube-proxy --kubeconfig KC --hostname-override NAME --proxy-mode MODE --cluster-cidr 10.252.0.0/16 --conntrack-max-per-core 0 ...   # MODE = iptables (calico-iptables), nftables; both nodes
nsenter --net=/run/netns/SERVER_NODE iptables-restore --noflush $OUT/calico-policy.rules   # calico-iptables
nsenter --net=SERVER_POD taskset -c 1 sockperf server --tcp -i 0.0.0.0 -p 11111; taskset -c 1 bin/shunt lab serve --tcp 8080; taskset -c 1 iperf3 -s -p 5201   # (shunt: the pods' containers)
nsenter --net=CLIENT_POD timeout T taskset -c 0 sockperf ping-pong --tcp -i SERVER_POD_IP|CLUSTER_IP -p 11111 -t $DURATION --msg-size 14 --full-rtt
nsenter --net=CLIENT_POD timeout T taskset -c 0 bin/connrate -target CLUSTER_IP:80 -workers 4 -duration ${DURATION}s   # floor: -target the 10 SERVER_POD_IP:8080
nsenter --net=CLIENT_POD timeout T taskset -c 0 iperf3 -c SERVER_POD_IP -p 5201 -t $DURATION -J
EOT
# In the background, so that an interrupt of this script reaches the driver,
# which then removes what it built before exiting.
bin/crossnode -n "$SCALES" -reps "$REPS" -duration "${DURATION}s" -settle "$SETTLE" $SMOKE_FLAG -policies "$POLICIES" -bin bin -rows "$ROWS" -out "$OUT" \
	> >(tee "$OUT/crossnode.log") 2>&1 &
XB=$!
trap 'kill -TERM $XB 2>/dev/null; wait $XB; exit 130' INT TERM
wait $XB || { echo "crossnode: bin/crossnode failed (log: $OUT/crossnode.log)" >&2; exit 1; }
trap - INT TERM

NOTES=$OUT/notes.md
cat >"$NOTES" <<'EOT'
Two nodes on one machine: each node is a network namespace, joined by a bridge in a third (the underlay); every case has its own three namespaces (shunt-native: two, on shunt-vxlan's underlay) and the same pod addresses (shunt's IPAM places its pods first, the baselines copy the addresses; shunt-native's pods have their own). Client pod on node 1 (CPU 0), ten server pods on node 2 (CPU 1); the pod-IP metrics target server-0. `n` = Services besides the measured one, each with the ten server pods as endpoints.

- floor: flannel's vxlan backend by hand: flannel.1 (VNI 1, port 8472, nolearning) with static neighbour + FDB entries for the other node, cni0 bridge, a route to the other node's pod /24 through flannel.1; no rules. No services: its rr_svc is a second sockperf run straight to the server pod (the floor the ClusterIP paths compare with) and its conn_rate goes to the ten pod IPs directly.
- calico-iptables: floor + the real kube-proxy in iptables mode in both node namespaces + Calico-shaped filter rules on the server's node (cali-FORWARD -> cali-to-wl-dispatch -> a cali-tw chain per pod: ESTABLISHED accepted first, then 100 policy chains, one /32 peer rule each, the client's last, else DROP). The layout is Calico's, written by this benchmark (no Felix; Felix would match ipsets and dispatch by interface); the routing is flannel's (Canal-like), not Calico's routed veths with BGP/IPIP.
- nftables: floor + the real kube-proxy in nftables mode in both node namespaces; no policy.
- shunt-vxlan: shunt's agent on each node (`lab up --mode redirect-peer --tunnel vxlan`), pods through shunt-cni, the same 100 policies as NetworkPolicies (enforced on the server's node, client identity from the VNI). ClusterIPs are translated at connect() by the socket hooks.
- shunt-native: shunt's agent on each node with native routing (`lab up --mode redirect-peer --routing native`): no encapsulation, each agent routes the other Nodes' pod CIDRs via their InternalIPs on ul0, a pod's packet leaves through bpf_fib_lookup + a redirect to ul0 and arrives through the uplink program, which judges it with the sender's identity from the ipcache and hands it to the pod with bpf_redirect_peer; pods get the underlay's full 1500-byte MTU (the other cases 1450). Its two nodes are two more Nodes of the same cluster on shunt-vxlan's underlay bridge (.3, .4: nodes routed natively share a network), with their own client and server pods (addresses from their Nodes' pod CIDRs, not the other cases') and their own measured Service (xbench-native, the same ports). At n > 0 the other Services' endpoints are shunt-vxlan's servers: shunt-native waits only for its own Service to answer before measuring.

rr_*: sockperf ping-pong over one persistent TCP connection, 14-byte messages (sockperf's smallest), full round trip; avg/p50/p99 in µs; tps = received messages / the measured part of the run. rr_*_softirq: softirq time of the whole machine (/proc/stat, all CPUs) over the sockperf run divided by its round trips, in µs per transaction: machine-wide, so other work on the machine lands in it too. conn_rate: connect, 4-byte request, reply, close; 4 workers. throughput: iperf3, one TCP stream, end.sum_received. *_steal: the CPU time (ms, all CPUs) the hypervisor took from this machine during that measurement (/proc/stat): a rate or tail that stands out in one repetition is read against it.
EOT
finish "Cross-node pod to pod: flannel-style VXLAN, + kube-proxy/Calico iptables, + kube-proxy nftables, shunt VXLAN, shunt native routing" floor \
	-paired conn_rate,rr_svc_p50
