/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The run-time switch of socket acceleration, which also holds the node's
 * own network namespace, and the network namespaces of this node's pods:
 * read by sockops (bpf/sock_ops.c) and by the socket address hooks
 * (bpf/sock_addr.c: which sockets the node's services apply to). */
#ifndef SHUNT_LIB_ACCEL_CONFIG_H
#define SHUNT_LIB_ACCEL_CONFIG_H

#include "common.h"

/* The network namespaces of this node's pods (cookie -> pod address):
 * loopback connections are accelerated only inside a pod's namespace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_netns_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct accel_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_accel_config SEC(".maps");

/* accel_config is the switch, or NULL when acceleration is off. */
static __always_inline const struct accel_config *accel_on(void)
{
	__u32 zero = 0;
	struct accel_config *c = bpf_map_lookup_elem(&shunt_accel_config, &zero);

	return c && c->enabled ? c : NULL;
}

#endif
