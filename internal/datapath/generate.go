package datapath

// The BPF objects and the Go types of every map key/value are generated from
// bpf/*.c and bpf/include/shunt.h; `make generate` reruns this and CI fails if
// the committed output differs.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -target bpfel -no-global-types -type endpoint_key -type endpoint_info -type metrics_value -type shunt_config -type shunt_fwd_mode -type tc_nat_key -type tc_nat_value -type ipcache_key -type ipcache_value -type policy_key -type policy_value -type policy_verdict -type ct_key -type ct_value -type shunt_identity -type endpoint_flags -type shunt_reason -type flow_event -type flow_config -type flow_stats -type flow_mode -type flow_verdict -type flow_event_type -type flow_point -type ct_flags podtc ../../bpf/pod_tc.c -- -I../../bpf/include -I../../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -target bpfel -no-global-types -type service_key -type service_value -type backend_value -type affinity_key -type affinity_value -type revnat_key -type revnat_value socklb ../../bpf/sock_lb.c -- -I../../bpf/include -I../../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -target bpfel -no-global-types -type gone_backend -type destroy_result sockdestroy ../../bpf/sock_destroy.c -- -I../../bpf/include -I../../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror
