/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Local pod endpoints: pod IPv4 -> host veth + MACs. Written only by the agent
 * (internal/datapath), read on every packet. */
#ifndef SHUNT_LIB_ENDPOINTS_H
#define SHUNT_LIB_ENDPOINTS_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint_info);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_endpoints SEC(".maps");

static __always_inline struct endpoint_info *lookup_endpoint(__u32 ip4)
{
	struct endpoint_key key = { .ip4 = ip4 };

	return bpf_map_lookup_elem(&shunt_endpoints, &key);
}

#endif
