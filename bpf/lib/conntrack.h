/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking for policy: a connection admitted once passes in both
 * directions, with ICMP errors about it, until it closes or idles out. An
 * LRU map: a full table evicts the least recently used entry instead of
 * refusing, and an insert that still fails drops the packet (fail closed). */
#ifndef SHUNT_LIB_CONNTRACK_H
#define SHUNT_LIB_CONNTRACK_H

#include "common.h"
#include "flow.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_ct SEC(".maps");

#define NSEC_PER_SEC 1000000000ULL
#define CT_TIMEOUT_TCP_OPENING (60 * NSEC_PER_SEC)   /* no reply seen yet */
#define CT_TIMEOUT_TCP_ESTABLISHED (21600 * NSEC_PER_SEC)
#define CT_TIMEOUT_TCP_CLOSING (10 * NSEC_PER_SEC) /* RST, or FIN both ways */
#define CT_TIMEOUT_OTHER (60 * NSEC_PER_SEC)       /* UDP, ICMP, SCTP */

/* ct_key_of orders the two ends so both directions build the same key;
 * *src_is_a says which end sent this packet. */
static __always_inline void ct_key_of(__u32 saddr, __u32 daddr, __u16 sport, __u16 dport, __u8 proto,
				      struct ct_key *k, bool *src_is_a)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->proto = proto;
	*src_is_a = saddr < daddr || (saddr == daddr && sport <= dport);
	if (*src_is_a) {
		k->addr_a = saddr, k->addr_b = daddr, k->port_a = sport, k->port_b = dport;
	} else {
		k->addr_a = daddr, k->addr_b = saddr, k->port_a = dport, k->port_b = sport;
	}
}

static __always_inline __u64 ct_timeout(__u32 flags, __u8 proto)
{
	if (proto != IPPROTO_TCP)
		return CT_TIMEOUT_OTHER;
	if ((flags & CT_F_RST) || ((flags & CT_F_FIN_A) && (flags & CT_F_FIN_B)))
		return CT_TIMEOUT_TCP_CLOSING;
	if (!(flags & CT_F_REPLY_SEEN))
		return CT_TIMEOUT_TCP_OPENING;
	return CT_TIMEOUT_TCP_ESTABLISHED;
}

/* ct_lookup finds the live connection a packet belongs to and notes what
 * the packet says about its state. An expired entry, or a closing TCP
 * connection whose tuple a new SYN reuses, is no connection: policy decides
 * again. *closing is set when this packet is the connection's first FIN or
 * RST (reported once as the connection's end). */
static __always_inline struct ct_value *ct_lookup(struct flow *f, __u64 now, bool *closing)
{
	struct ct_key k;
	bool src_is_a;
	struct ct_value *ct;

	ct_key_of(f->saddr, f->daddr, f->sport, f->dport, f->proto, &k, &src_is_a);
	ct = bpf_map_lookup_elem(&shunt_ct, &k);
	if (!ct)
		return NULL;
	__u32 flags = ct->flags;
	if (now - ct->last_seen_ns > ct_timeout(flags, f->proto))
		return NULL;
	if (f->proto == IPPROTO_TCP) {
		bool syn = (f->tcp_flags & (SHUNT_TCPF_SYN | SHUNT_TCPF_ACK)) == SHUNT_TCPF_SYN;

		if (syn && (flags & (CT_F_RST | CT_F_FIN_A | CT_F_FIN_B)))
			return NULL;
		if (f->tcp_flags & SHUNT_TCPF_FIN)
			flags |= src_is_a ? CT_F_FIN_A : CT_F_FIN_B;
		if (f->tcp_flags & SHUNT_TCPF_RST)
			flags |= CT_F_RST;
	}
	if (!!(flags & CT_F_ORIG_IS_A) != src_is_a)
		flags |= CT_F_REPLY_SEEN;
	__u32 closed = CT_F_RST | CT_F_FIN_A | CT_F_FIN_B;
	*closing = (flags & closed) && !(ct->flags & closed);
	/* Write only on change, and refresh the timestamp at most once a
	 * second: most packets of a connection only read the entry. */
	if (flags != ct->flags)
		ct->flags = flags;
	if (now - ct->last_seen_ns > NSEC_PER_SEC)
		ct->last_seen_ns = now;
	return ct;
}

/* ct_related says whether an ICMP error is about a tracked connection. */
static __always_inline bool ct_related(struct flow *f)
{
	struct ct_key k;
	bool src_is_a;

	if (!f->icmp_error)
		return false;
	ct_key_of(f->inner.saddr, f->inner.daddr, f->inner.sport, f->inner.dport, f->inner.proto, &k, &src_is_a);
	return bpf_map_lookup_elem(&shunt_ct, &k) != NULL;
}

/* ct_create records a connection whose first packet policy admitted. */
static __always_inline int ct_create(struct flow *f, __u32 rule_id, __u64 now)
{
	struct ct_key k;
	bool src_is_a;

	ct_key_of(f->saddr, f->daddr, f->sport, f->dport, f->proto, &k, &src_is_a);
	struct ct_value v = {
		.last_seen_ns = now, .created_ns = now, .rule_id = rule_id,
		.flags = src_is_a ? CT_F_ORIG_IS_A : 0,
	};
	if (f->proto == IPPROTO_TCP && (f->tcp_flags & SHUNT_TCPF_RST))
		v.flags |= CT_F_RST;
	return bpf_map_update_elem(&shunt_ct, &k, &v, BPF_ANY);
}

#endif
