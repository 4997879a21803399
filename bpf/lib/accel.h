/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket acceleration maps: the sockhash of accelerated sockets and the
 * run-time switch. */
#ifndef SHUNT_LIB_ACCEL_H
#define SHUNT_LIB_ACCEL_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(key_size, sizeof(struct sock_key));
	__uint(value_size, sizeof(__u64));
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_sockhash SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct accel_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_accel_config SEC(".maps");

static __always_inline bool accel_enabled(void)
{
	__u32 zero = 0;
	struct accel_config *c = bpf_map_lookup_elem(&shunt_accel_config, &zero);

	return c && c->enabled;
}

static __always_inline bool is_loopback(__u32 ip)
{
	return (bpf_ntohl(ip) >> 24) == 127;
}

#endif
