/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* loadBalancerSourceRanges: which clients from outside may open a flow to
 * a load balancer frontend (struct lb_source_range_key in shunt.h).
 *
 * One trie for every frontend, keyed by (service id, client address),
 * rather than a per-frontend list or an inner map per Service: one lookup
 * decides however many ranges there are, a Service's ranges change with
 * a few writes and no map is created at run time, and a frontend without
 * ranges (nearly all) costs no entry. Checked once per new flow: the
 * flow's later packets find their translation first. */
#ifndef SHUNT_LIB_SOURCE_RANGES_H
#define SHUNT_LIB_SOURCE_RANGES_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb_source_range_key);
	__type(value, struct lb_source_range_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_lb_source_ranges SEC(".maps");

/* lb_source_allowed says whether client (network byte order) may open a
 * flow to the frontend whose slot 0 has id service_id. */
static __always_inline bool lb_source_allowed(__u32 service_id, __u32 client)
{
	struct lb_source_range_key k = { .prefixlen = 64, .service_id = bpf_htonl(service_id), .addr = client };
	struct lb_source_range_value *v = bpf_map_lookup_elem(&shunt_lb_source_ranges, &k);

	return !v || v->allow;
}

#endif
