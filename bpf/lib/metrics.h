/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU packet/byte counters by (reason, direction), shared by every
 * program of the instance (pinned by name: the tc programs and the socket
 * hooks find the same map): an array, so counting never inserts and never
 * fails; the agent sums the CPUs when it exports them. */
#ifndef SHUNT_LIB_METRICS_H
#define SHUNT_LIB_METRICS_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct metrics_value);
	__uint(max_entries, SHUNT_METRICS_REASONS * SHUNT_METRICS_DIRECTIONS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_metrics SEC(".maps");

static __always_inline void count(__u32 reason, __u32 dir, __u32 bytes)
{
	__u32 idx = reason * SHUNT_METRICS_DIRECTIONS + dir;
	struct metrics_value *val = bpf_map_lookup_elem(&shunt_metrics, &idx);

	if (val) {
		val->packets++;
		val->bytes += bytes;
	}
}

#endif
