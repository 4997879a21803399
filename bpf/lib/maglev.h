/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maglev backend selection for traffic from outside (lib/nodeport.h).
 * The agent computes one lookup table per external service port in Go
 * (internal/maglev: M slots, M prime, each naming a backend) from
 * cluster-wide data only, so every node holds the same table, and writes
 * it as an array of M backend ids. A new flow's slot is its hash modulo M:
 * the same client tuple picks the same backend on every node, so a flow
 * keeps its backend when the route to a load balancer address moves to
 * another node.
 *
 * shunt_maglev maps a service id (slot 0's id, struct service_value) to
 * its table, a BPF array of its own (Cilium's cilium_lb4_maglev layout:
 * a hash of maps, so a service costs M × 4 bytes, nothing for services
 * without a table, and a table is replaced by one update of the outer
 * entry, never seen half-written). Frontends of one service port (a
 * NodePort on every node address, a load balancer address) share one
 * table. The inner maps are BPF_F_INNER_MAP, so a table of another size
 * (the agent restarted with another M) can be put in the same outer map. */
#ifndef SHUNT_LIB_MAGLEV_H
#define SHUNT_LIB_MAGLEV_H

#include "common.h"
#include "services.h"

/* The tables' size M (a prime) as the agent computed them; 0: no Maglev,
 * a new flow's backend is a random one (select_backend). A load-time
 * constant. */
volatile const __u32 MAGLEV_SIZE = 0;

struct maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32); /* backend id (shunt_backends) */
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32); /* service id */
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct maglev_inner);
} shunt_maglev SEC(".maps");

static __always_inline __u32 maglev_rol32(__u32 word, unsigned int shift)
{
	return (word << shift) | (word >> ((-shift) & 31));
}

/* maglev_hash is the flow's hash: the kernel's jhash_3words over the
 * client's address, both ports and the protocol (host byte order, so
 * nodes of either endianness agree). The frontend's address is left out:
 * within one table it is the same for every flow, and it differs between
 * the nodes of a NodePort, whose tables are the same. internal/maglev's
 * FlowHash is the same function. */
static __always_inline __u32 maglev_hash(__u32 saddr, __u16 sport, __u16 dport, __u8 proto)
{
	__u32 a = bpf_ntohl(saddr), b = ((__u32)bpf_ntohs(sport) << 16) | bpf_ntohs(dport), c = proto;
	__u32 init = 0xdeadbeef + (3 << 2);

	a += init, b += init, c += init;
	c ^= b; c -= maglev_rol32(b, 14);
	a ^= c; a -= maglev_rol32(c, 11);
	b ^= a; b -= maglev_rol32(a, 25);
	c ^= b; c -= maglev_rol32(b, 16);
	a ^= c; a -= maglev_rol32(c, 4);
	b ^= a; b -= maglev_rol32(a, 14);
	c ^= b; c -= maglev_rol32(b, 24);
	return c;
}

/* maglev_select is the backend of a new flow to service svc from the
 * client (saddr, sport) to port dport through its table; NULL when Maglev
 * is off, the service has no table, or the slot's backend is gone (a table
 * not yet rewritten after a backend went): the caller picks at random. */
static __always_inline struct backend_value *maglev_select(const struct service_value *svc, __u32 saddr, __u16 sport,
							   __u16 dport, __u8 proto)
{
	__u32 size = MAGLEV_SIZE;

	if (!size)
		return 0;
	__u32 id = svc->id;
	void *table = bpf_map_lookup_elem(&shunt_maglev, &id);
	if (!table)
		return 0;
	__u32 slot = maglev_hash(saddr, sport, dport, proto) % size;
	__u32 *backend_id = bpf_map_lookup_elem(table, &slot);
	if (!backend_id)
		return 0;
	__u32 bid = *backend_id;
	return bpf_map_lookup_elem(&shunt_backends, &bid);
}

#endif
