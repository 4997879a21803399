/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow events to the agent. The ring buffer is created by the agent at the
 * size it is told (not pinned: a restart may choose another size) and
 * shared by every program of the instance. Emitting never waits: when the
 * buffer is full the event is counted as lost and the packet goes on. */
#ifndef SHUNT_LIB_FLOW_EVENTS_H
#define SHUNT_LIB_FLOW_EVENTS_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22); /* the agent sets the size before loading */
} shunt_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_flow_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_stats);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_flow_stats SEC(".maps");

/* flow_mode is the current sampling (an array lookup the verifier inlines). */
static __always_inline __u32 flow_mode(void)
{
	__u32 zero = 0;
	struct flow_config *c = bpf_map_lookup_elem(&shunt_flow_config, &zero);

	return c ? c->mode : FLOW_MODE_OFF;
}

/* flow_wanted says whether an event of this type is sent in this mode. */
static __always_inline bool flow_wanted(__u32 mode, __u8 event)
{
	if (mode == FLOW_MODE_OFF)
		return false;
	return mode == FLOW_MODE_ALL || event != FLOW_EV_PACKET;
}

/* flow_reserve takes room for one event in the ring buffer and zeroes
 * it, or counts the event as lost and returns NULL when the buffer is
 * full. The event is written in place, not built on the stack and copied:
 * a program's 512 bytes of stack (counted in 32-byte frames before Linux
 * 6.9) keep no room for it in the programs with the deepest paths (the
 * pod's and the uplink's, TestStackFitsOlderVerifiers). Every path from
 * here goes through flow_submit. */
static __always_inline struct flow_event *flow_reserve(void)
{
	struct flow_event *e = bpf_ringbuf_reserve(&shunt_flows, sizeof(*e), 0);

	if (!e) {
		__u32 zero = 0;
		struct flow_stats *st = bpf_map_lookup_elem(&shunt_flow_stats, &zero);

		if (st)
			st->lost++;
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	return e;
}

/* flow_submit sends an event flow_reserve gave. Waking the agent for
 * every event would cost more than the event (a wakeup per packet on a
 * busy node): the agent polls, and is woken only for drops or when the
 * buffer is a quarter full. */
static __always_inline void flow_submit(struct flow_event *e)
{
	__u32 zero = 0;
	struct flow_stats *st = bpf_map_lookup_elem(&shunt_flow_stats, &zero);
	__u64 wake = BPF_RB_NO_WAKEUP;

	if (e->verdict == FLOW_DROPPED ||
	    bpf_ringbuf_query(&shunt_flows, BPF_RB_AVAIL_DATA) * 4 > bpf_ringbuf_query(&shunt_flows, BPF_RB_RING_SIZE))
		wake = BPF_RB_FORCE_WAKEUP;
	e->ts_ns = bpf_ktime_get_ns();
	bpf_ringbuf_submit(e, wake);
	if (st)
		st->emitted++;
}

#endif
