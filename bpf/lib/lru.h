/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Writing into the LRU hashes that hold flows' state (NAT, conntrack,
 * affinity, the proxies' original destinations).
 *
 * The kernel's LRU (kernel/bpf/bpf_lru_list.c) marks an entry used only
 * when it is looked up, and evicts unmarked entries first: written and not
 * yet looked up, an entry goes to the head of the inactive list when its
 * CPU next refills its free nodes, and eviction scans that list from its
 * tail. In a full table whose older inactive entries are used up, the
 * entries just written for flows whose next packet has not come yet are
 * the victims: a NodePort flow's reply entry, gone before its SYN-ACK,
 * which then left with the pod's address and was reset by the client
 * (bench/run nodeport's local collapse; TestNodePortFullTableKeepsNewReplies:
 * 225 of 6 000 new flows in a table full of flows in use). lru_insert looks the entry up once
 * written, which marks it used, so it ages like the entries of flows in
 * use; lru_restore writes an entry again should the flow's own later
 * writes have evicted it. */
#ifndef SHUNT_LIB_LRU_H
#define SHUNT_LIB_LRU_H

#include "common.h"
#include "metrics.h"

/* lru_insert writes key -> value into the LRU hash map (flags as
 * bpf_map_update_elem's) and marks the entry used. Returns 0, or the
 * update's error (negative on every kernel: map_update, lib/common.h). */
static __always_inline int lru_insert(void *map, const void *key, const void *value, __u64 flags)
{
	int err = map_update(map, key, value, flags);

	if (err == 0)
		bpf_map_lookup_elem(map, key);
	return err;
}

/* lru_restore makes sure key -> value, written for a flow a moment ago,
 * is still in map after the flow's other writes, and writes it again when
 * it is gone, counted as nat-entry-lost in direction dir (bytes: the
 * packet's length, or 0). Returns 0, or negative when that write failed. */
static __always_inline int lru_restore(void *map, const void *key, const void *value, __u32 dir, __u32 bytes)
{
	if (bpf_map_lookup_elem(map, key))
		return 0;
	count(SHUNT_REASON_NAT_ENTRY_LOST, dir, bytes);
	return lru_insert(map, key, value, BPF_ANY) < 0 ? -1 : 0;
}

#endif
