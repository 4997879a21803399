/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking for policy: a connection admitted once passes in both
 * directions, with ICMP errors about it, until it closes or idles out.
 *
 * Two LRU tables, so that new connections never push out established ones
 * (what nf_conntrack's early_drop does: unassured entries go first). A
 * connection starts in shunt_ct_new and moves to shunt_ct once it is
 * assured: a TCP connection when the originator acknowledges the reply (the
 * handshake completed), any other when a reply was seen and it is still in
 * use 2 s after it began (nf_conntrack's rule for UDP: a DNS-like exchange,
 * one tuple per query, is not a stream worth keeping). A SYN flood from one
 * pod, to open ports (SYN-ACK, then the flooder's RST) or closed ones (RST),
 * never assures anything: it only churns shunt_ct_new, where an entry just
 * has to outlive its handshake. A full table evicts its least recently used
 * entry instead of refusing; an insert that still fails drops the packet
 * (fail closed), a promotion that fails leaves the connection in
 * shunt_ct_new (counted; the next packet tries again). shunt_ct keeps the
 * name and layout it had when it was the only table, so the connections of
 * a running node survive an upgrade. */
#ifndef SHUNT_LIB_CONNTRACK_H
#define SHUNT_LIB_CONNTRACK_H

#include "common.h"
#include "flow_tuple.h"
#include "lru.h"

/* Assured connections. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_ct SEC(".maps");

/* Connections not assured yet. Each needs an entry only for its handshake
 * (or its first 2 s): a flood of N new connections a second evicts one
 * after about max_entries / N seconds. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 32768);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_ct_new SEC(".maps");

#define NSEC_PER_SEC 1000000000ULL
#define CT_TIMEOUT_TCP_OPENING (60 * NSEC_PER_SEC)   /* no reply seen yet */
#define CT_TIMEOUT_TCP_ESTABLISHED (21600 * NSEC_PER_SEC)
#define CT_TIMEOUT_TCP_CLOSING (10 * NSEC_PER_SEC) /* RST, or FIN both ways */
#define CT_TIMEOUT_OTHER (60 * NSEC_PER_SEC)       /* UDP, ICMP, SCTP */
#define CT_ASSURE_OTHER_AFTER (2 * NSEC_PER_SEC)   /* UDP, ICMP, SCTP: replied and in use this long */

/* ct_now is the clock of every timestamp in shunt_ct and shunt_ct_new: the
 * coarse monotonic clock (CLOCK_MONOTONIC_COARSE, advanced every tick),
 * which is all that timeouts of seconds and a refresh at most once a second
 * need, and is read from memory: bpf_ktime_get_ns reads the hardware clock,
 * a sizable share of what a packet of a known connection costs. A stamp
 * from another clock may be ahead of it: ct_elapsed reads that as no time. */
static __always_inline __u64 ct_now(void)
{
	return bpf_ktime_get_coarse_ns();
}

/* ct_elapsed is the time from then to now, negative when then is later (a
 * stamp of a finer clock, written by an older agent, up to a tick ahead). */
static __always_inline __s64 ct_elapsed(__u64 now, __u64 then)
{
	return (__s64)(now - then);
}

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

/* tcp_syn_reopens says whether a TCP packet with tcp_flags starts a new
 * connection on a tuple whose connection ended (ended: a FIN or RST of it
 * was seen): a SYN without ACK, as a client that reuses its port sends.
 * Every table that tracks TCP state by tuple (this one, the masquerade's
 * and NodePort's, lib/nat_timeout.h) starts over on it, so that the new
 * connection does not inherit the old one's closing timeout. */
static __always_inline bool tcp_syn_reopens(__u8 proto, __u8 tcp_flags, bool ended)
{
	return ended && tcp_opens(proto, tcp_flags);
}

/* ct_refresh notes in entry ct what the packet says about its connection;
 * false when the entry is no connection (any more): expired, or a closing
 * TCP connection whose tuple a new SYN reuses. *closing is set when this
 * packet is the connection's first FIN or RST (reported once as the
 * connection's end). */
static __always_inline bool ct_refresh(struct ct_value *ct, struct flow *f, bool src_is_a, __u64 now, bool *closing)
{
	__u32 flags = ct->flags;
	if (ct_elapsed(now, ct->last_seen_ns) > (__s64)ct_timeout(flags, f->proto))
		return false;
	/* A SYN without ACK reopens a tuple whose connection ended; from the
	 * end that did not open the connection it belongs to none of this
	 * entry's either, whose recorded opener it would otherwise ride on
	 * (an entry recorded from an answer, CT_F_ANSWER: a peer's stray
	 * segment must not let its SYN past the policy it was judged by). */
	if (tcp_syn_reopens(f->proto, f->tcp_flags,
			    (flags & (CT_F_RST | CT_F_FIN_A | CT_F_FIN_B)) || !!(flags & CT_F_ORIG_IS_A) != src_is_a))
		return false;
	if (f->proto == IPPROTO_TCP) {
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
	if (ct_elapsed(now, ct->last_seen_ns) > (__s64)NSEC_PER_SEC)
		ct->last_seen_ns = now;
	return true;
}

/* ct_assured says whether this packet makes the connection of a (refreshed)
 * shunt_ct_new entry assured: for TCP, a plain ACK from the originator
 * after the reply (the handshake's last step; a flooder's RST is not one),
 * for anything else a packet after a reply, 2 s or more into it. */
static __always_inline bool ct_assured(const struct ct_value *ct, struct flow *f, bool src_is_a, __u64 now)
{
	__u32 flags = ct->flags;

	if (!(flags & CT_F_REPLY_SEEN))
		return false;
	if (f->proto != IPPROTO_TCP)
		return ct_elapsed(now, ct->created_ns) >= (__s64)CT_ASSURE_OTHER_AFTER;
	bool from_originator = !!(flags & CT_F_ORIG_IS_A) == src_is_a;
	__u8 handshake = SHUNT_TCPF_SYN | SHUNT_TCPF_ACK | SHUNT_TCPF_RST | SHUNT_TCPF_FIN;
	return from_originator && (f->tcp_flags & handshake) == SHUNT_TCPF_ACK &&
	       !(flags & (CT_F_RST | CT_F_FIN_A | CT_F_FIN_B));
}

/* ct_lookup finds the live connection a packet belongs to, in shunt_ct or
 * shunt_ct_new, notes what the packet says about its state (see ct_refresh)
 * and moves a connection this packet assures to shunt_ct. A dead entry in
 * shunt_ct is removed, so the connection that reuses its tuple is found in
 * shunt_ct_new. *failed is set to the reason of a move that failed (the
 * connection stays in shunt_ct_new, the packet is still its). */
static __always_inline struct ct_value *ct_lookup(struct flow *f, __u64 now, bool *closing, __u32 *failed)
{
	struct ct_key k;
	bool src_is_a;
	struct ct_value *ct;

	ct_key_of(f->saddr, f->daddr, f->sport, f->dport, f->proto, &k, &src_is_a);
	ct = bpf_map_lookup_elem(&shunt_ct, &k);
	if (ct) {
		if (ct_refresh(ct, f, src_is_a, now, closing))
			return ct;
		map_delete(&shunt_ct, &k);
	}
	ct = bpf_map_lookup_elem(&shunt_ct_new, &k);
	if (!ct || !ct_refresh(ct, f, src_is_a, now, closing))
		return NULL;
	if (!ct_assured(ct, f, src_is_a, now))
		return ct;
	struct ct_value assured = *ct;
	/* Not lru_insert: the lookup below marks the entry used. */
	if (map_update(&shunt_ct, &k, &assured, BPF_ANY) < 0) {
		*failed = SHUNT_REASON_CT_PROMOTE_FAILED;
		return ct;
	}
	map_delete(&shunt_ct_new, &k);
	/* Another CPU may have moved and closed it meanwhile: the copy in
	 * shunt_ct_new is gone, the packet was admitted all the same. */
	ct = bpf_map_lookup_elem(&shunt_ct, &k);
	return ct ? ct : bpf_map_lookup_elem(&shunt_ct_new, &k);
}

/* ct_related says whether an ICMP error is about a tracked connection. */
static __always_inline bool ct_related(struct flow *f)
{
	struct ct_key k;
	bool src_is_a;

	if (!f->icmp_error)
		return false;
	ct_key_of(f->inner.saddr, f->inner.daddr, f->inner.sport, f->inner.dport, f->inner.proto, &k, &src_is_a);
	return bpf_map_lookup_elem(&shunt_ct, &k) || bpf_map_lookup_elem(&shunt_ct_new, &k);
}

/* ct_is_reply says whether packet f belongs to a tracked connection (of
 * either table) that f's destination opened: f goes the reply way. It
 * only reads; the packet's own program has refreshed the entry. */
static __always_inline bool ct_is_reply(const struct flow *f)
{
	struct ct_key k;
	bool src_is_a;

	ct_key_of(f->saddr, f->daddr, f->sport, f->dport, f->proto, &k, &src_is_a);
	struct ct_value *ct = bpf_map_lookup_elem(&shunt_ct, &k);
	if (!ct)
		ct = bpf_map_lookup_elem(&shunt_ct_new, &k);
	return ct && !!(ct->flags & CT_F_ORIG_IS_A) != src_is_a;
}

/* ct_create records a connection whose first packet policy admitted, with
 * the extra flags given: in shunt_ct_new until it is assured, or straight
 * in shunt_ct with single_table (the behaviour before shunt_ct_new, kept as
 * the baseline benchmarks compare with). With CT_F_ANSWER the packet is
 * the answer of a connection its destination opened (a TCP segment of a
 * connection whose entry was lost, policy_admit_found): the opener recorded
 * is the destination, and a reply is seen. */
static __always_inline int ct_create(struct flow *f, __u32 rule_id, __u64 now, bool single_table, __u32 flags)
{
	struct ct_key k;
	bool src_is_a;

	ct_key_of(f->saddr, f->daddr, f->sport, f->dport, f->proto, &k, &src_is_a);
	struct ct_value v = {
		.last_seen_ns = now, .created_ns = now, .rule_id = rule_id,
		/* Branch-free (the pod program has no stack for another live
		 * value): CT_F_ANSWER (bit 7) flips the opener and sets
		 * CT_F_REPLY_SEEN (bit 1). */
		.flags = flags | ((src_is_a ^ (flags >> 7)) & CT_F_ORIG_IS_A) | ((flags >> 6) & CT_F_REPLY_SEEN),
	};
	if (f->proto == IPPROTO_TCP && (f->tcp_flags & SHUNT_TCPF_RST))
		v.flags |= CT_F_RST;
	if (single_table)
		return lru_insert(&shunt_ct, &k, &v, BPF_ANY);
	return lru_insert(&shunt_ct_new, &k, &v, BPF_ANY);
}

#endif
