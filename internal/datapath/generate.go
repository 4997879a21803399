package datapath

// The BPF objects and the Go types of every map key/value are generated from
// bpf/*.c and bpf/include/shunt.h; `make generate` reruns this and CI fails if
// the committed output differs.
//
// Hermetic: -nostdinc means the programs see only bpf/include (kernel UAPI
// and libbpf headers vendored there, shunt's own) and bpf/, never the
// machine's /usr/include, so a libc or distribution header cannot sneak in
// and the objects are byte-identical wherever they are built. The compiler
// is pinned to Debian 12's clang-14 (scripts/setup.sh installs it), because
// another clang emits other bytes.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type endpoint_key -type endpoint_info -type metrics_value -type shunt_config -type shunt_fwd_mode -type tc_nat_key -type tc_nat_value -type ipcache_key -type ipcache_value -type policy_key -type policy_value -type policy_verdict -type ct_key -type ct_value -type shunt_identity -type endpoint_flags -type shunt_reason -type shunt_direction -type shunt_metrics_layout -type flow_event -type flow_config -type flow_stats -type flow_mode -type flow_verdict -type flow_event_type -type flow_icmp_error -type flow_point -type ct_flags -type proxy_origin_flags -type identity_endpoint -type shunt_tcp_option podtc ../../bpf/pod_tc.c -- -nostdinc -I../../bpf/include -I../../bpf -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type shunt_config overlaytc ../../bpf/overlay_tc.c -- -nostdinc -I../../bpf/include -I../../bpf -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type shunt_config -type masq_config -type masq_key -type masq_value -type masq_exclude_value -type masq_dir -type masq_flags -type nodeport_nat_value -type service_flags -type nodeport_mode -type lb_source_range_key -type lb_source_range_value -type dsr_node_key -type dsr_node_value uplinktc ../../bpf/uplink_tc.c -- -nostdinc -I../../bpf/include -I../../bpf -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type service_key -type service_value -type backend_value -type affinity_key -type affinity_value -type affinity_client_kind -type revnat_key -type revnat_value -type l7_redirect_key -type l7_redirect_value sockaddr ../../bpf/sock_addr.c -- -nostdinc -I../../bpf/include -I../../bpf -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type sock_key -type accel_config -type accel_sock -type proxy_origin -type proxy_origin_key sockops ../../bpf/sock_ops.c -- -nostdinc -I../../bpf/include -I../../bpf -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types skmsg ../../bpf/sk_msg.c -- -nostdinc -I../../bpf/include -I../../bpf -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types sockopt ../../bpf/sockopt.c -- -nostdinc -I../../bpf/include -I../../bpf -O2 -g -Wall -Werror
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type gone_backend -type destroy_result sockdestroy ../../bpf/sock_destroy.c -- -nostdinc -I../../bpf/include -I../../bpf -O2 -g -Wall -Werror
