/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Masquerade: the NAT table of pods' flows to outside the cluster and the
 * packet rewrites of both directions (bpf/uplink_tc.c runs them on the
 * node's uplink). A flow has two entries in shunt_masq_nat (struct
 * masq_key in shunt.h): its tuple as the pod sent it (MASQ_OUT) and its
 * reply tuple as it comes back to the node's address (MASQ_IN), each
 * naming the other side's address and port.
 *
 * Entries live as long as their connection, by their own clock: every
 * packet of either direction refreshes both (at most once a second), TCP
 * FIN/RST shorten the timeout, and an entry idle past its timeout no
 * longer holds its port. The table keeps no pointer into shunt_ct, whose
 * layout may change; an LRU makes room when it is full. */
#ifndef SHUNT_LIB_MASQ_H
#define SHUNT_LIB_MASQ_H

#include "common.h"
#include "lru.h"
#include "flow_tuple.h"
#include "ipv4.h"
#include "tc_nat.h"
#include "conntrack.h"
#include "policy.h"
#include "nat_timeout.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct masq_key);
	__type(value, struct masq_value);
	__uint(max_entries, 131072); /* two per flow */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_masq_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct masq_exclude_value);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_masq_exclude SEC(".maps");

/* Ports tried for a new flow: the pod's own first when it is in range, then
 * pseudo-random ones. 16 tries fail only when about half the range or more
 * is in use towards one destination address, port and protocol (0.5^16);
 * a failure is counted as masq-port-exhausted. */
#define MASQ_PORT_TRIES 16

/* masq_idle is how long the flow of entry v has been quiet. Another CPU
 * may have refreshed it after this one read the clock: that is no idle
 * time, not an underflow to "idle for ages". */
static __always_inline __u64 masq_idle(const struct masq_value *v, __u64 now)
{
	__u64 seen = v->last_seen_ns;

	return now > seen ? now - seen : 0;
}

static __always_inline bool masq_expired(const struct masq_value *v, __u8 proto, __u64 now)
{
	return masq_idle(v, now) > nat_timeout(v->flags, proto);
}


/* masq_reusable says whether the flow of entry v no longer holds its
 * port against a new flow. */
static __always_inline bool masq_reusable(const struct masq_value *v, __u8 proto, __u64 now)
{
	if (proto == IPPROTO_TCP && nat_closed(v->flags) && masq_idle(v, now) > NAT_CLOSED_REUSE)
		return true;
	return masq_expired(v, proto, now);
}

/* masq_excluded says whether a destination stays untranslated: the
 * ipcache knows it (a pod of any node, a node address) or the agent
 * listed it (cluster, service and node ranges, --masquerade-exclude). */
static __always_inline bool masq_excluded(__u32 daddr)
{
	struct ipcache_key k = { .prefixlen = 32, .ip4 = daddr };

	return bpf_map_lookup_elem(&shunt_ipcache, &k) || bpf_map_lookup_elem(&shunt_masq_exclude, &k);
}

/* masq_partner gives the key of the other direction's entry of the flow
 * whose entry is (k, v). ICMP echo carries its identifier as both ports. */
static __always_inline void masq_partner(const struct masq_key *k, const struct masq_value *v, struct masq_key *p)
{
	__builtin_memset(p, 0, sizeof(*p));
	p->proto = k->proto;
	if (k->dir == MASQ_OUT) {
		/* pod:port -> out:port, translated to node:v.port: replies come
		 * from out:port to node:v.port. */
		p->saddr = k->daddr, p->sport = k->dport, p->daddr = v->addr, p->dport = v->port, p->dir = MASQ_IN;
	} else {
		p->saddr = v->addr, p->sport = v->port, p->daddr = k->saddr, p->dport = k->sport, p->dir = MASQ_OUT;
	}
	if (k->proto == IPPROTO_ICMP)
		p->sport = p->dport = v->port;
}

/* masq_partner_value is what the partner of the entry keyed k names: the
 * address and port k holds on the side its own value does not. */
static __always_inline void masq_partner_value(const struct masq_key *k, struct masq_value *pv)
{
	if (k->dir == MASQ_OUT)
		pv->addr = k->saddr, pv->port = k->sport;
	else
		pv->addr = k->daddr, pv->port = k->dport;
}

/* masq_refresh notes a packet of the flow whose entry is (k, v): the TCP
 * flags it carries and, at most once a second, the time, in both entries,
 * so that either direction keeps the flow and its port alive. A partner
 * the LRU evicted is written again. A SYN that reuses the tuple of an
 * ended connection starts the flags over (nat_reopened). */
static __always_inline void masq_refresh(const struct masq_key *k, struct masq_value *v, __u8 tcp_flags, __u64 now)
{
	bool reopened = nat_reopened(v->flags, k->proto, tcp_flags);
	__u32 flags = reopened ? 0 : v->flags;

	if (k->dir == MASQ_IN)
		flags |= MASQ_F_REPLY_SEEN;
	if (k->proto == IPPROTO_TCP) {
		if (tcp_flags & SHUNT_TCPF_FIN)
			flags |= k->dir == MASQ_OUT ? MASQ_F_FIN_OUT : MASQ_F_FIN_IN;
		if (tcp_flags & SHUNT_TCPF_RST)
			flags |= MASQ_F_RST;
	}
	if (flags == v->flags && masq_idle(v, now) <= NSEC_PER_SEC)
		return;
	v->flags = flags;
	v->last_seen_ns = now;

	struct masq_key pk;
	masq_partner(k, v, &pk);
	struct masq_value *pv = bpf_map_lookup_elem(&shunt_masq_nat, &pk);
	if (pv) {
		pv->flags = reopened ? flags : pv->flags | flags;
		pv->last_seen_ns = now;
		return;
	}
	struct masq_value again = { .last_seen_ns = now, .created_ns = v->created_ns, .flags = flags };
	masq_partner_value(k, &again);
	lru_insert(&shunt_masq_nat, &pk, &again, BPF_NOEXIST);
}

/* masq_forget removes the partner of an expired entry (k, v) when it still
 * names k's flow, so a port taken over later finds no stale owner. */
static __always_inline void masq_forget(const struct masq_key *k, const struct masq_value *v)
{
	struct masq_key pk;
	struct masq_value want = {};

	masq_partner(k, v, &pk);
	masq_partner_value(k, &want);
	struct masq_value *pv = bpf_map_lookup_elem(&shunt_masq_nat, &pk);
	if (pv && pv->addr == want.addr && pv->port == want.port)
		map_delete(&shunt_masq_nat, &pk);
}

/* masq_lookup finds the live entry of key k, NULL when there is none; an
 * expired one is removed with its partner (their port is free again). */
static __always_inline struct masq_value *masq_lookup(const struct masq_key *k, __u64 now)
{
	struct masq_value *v = bpf_map_lookup_elem(&shunt_masq_nat, k);

	if (!v || !masq_expired(v, k->proto, now))
		return v;
	masq_forget(k, v);
	map_delete(&shunt_masq_nat, k);
	return NULL;
}

/* masq_claim tries to make the reply tuple in (one candidate port) the
 * flow's, recording it with the value inv. Returns 0 when claimed (or it
 * already was this flow's), 1 when a live flow holds it, -1 when the
 * insert failed. A flow idle past its timeout, or closed a while ago,
 * gives its port up here. */
static __always_inline int masq_claim(struct masq_key *in, struct masq_value *inv, __u64 now)
{
	if (lru_insert(&shunt_masq_nat, in, inv, BPF_NOEXIST) == 0)
		return 0;
	struct masq_value *cur = bpf_map_lookup_elem(&shunt_masq_nat, in);
	if (!cur)
		/* Gone meanwhile (the LRU), or the insert failed outright. */
		return lru_insert(&shunt_masq_nat, in, inv, BPF_NOEXIST) == 0 ? 0 : -1;
	if (cur->addr == inv->addr && cur->port == inv->port)
		return 0; /* this flow's own: another CPU was first, or it is re-translated */
	if (!masq_reusable(cur, in->proto, now))
		return 1;
	masq_forget(in, cur);
	return lru_insert(&shunt_masq_nat, in, inv, BPF_ANY) == 0 ? 0 : -1;
}

/* masq_new translates a new flow, out being its tuple as the pod sent it:
 * it picks a port of cfg's range for the reply tuple (the pod's own port
 * first, then pseudo-random ones, within MASQ_PORT_TRIES) and records both
 * entries. Returns 0 with *port set (network byte order), else the drop
 * reason. */
static __always_inline __u32 masq_new(const volatile struct masq_config *cfg, const struct masq_key *out, __u64 now,
				      __u16 *port)
{
	__u16 lo = cfg->port_min, hi = cfg->port_max;
	__u32 span = (__u32)hi - lo + 1;
	__u16 own = bpf_ntohs(out->sport);
	struct masq_value inv = { .last_seen_ns = now, .created_ns = now, .addr = out->saddr, .port = out->sport };
	struct masq_key in = { .saddr = out->daddr, .daddr = cfg->addr, .sport = out->dport, .proto = out->proto,
			       .dir = MASQ_IN };

	for (int i = 0; i < MASQ_PORT_TRIES; i++) {
		__u16 p = (i == 0 && own >= lo && own <= hi) ? own : lo + bpf_get_prandom_u32() % span;

		in.dport = bpf_htons(p);
		if (in.proto == IPPROTO_ICMP)
			in.sport = in.dport; /* the identifier, both ways */
		int r = masq_claim(&in, &inv, now);
		if (r < 0)
			return SHUNT_REASON_MASQ_INSERT_FAILED;
		if (r > 0)
			continue;
		struct masq_value outv = { .last_seen_ns = now, .created_ns = now, .addr = cfg->addr, .port = in.dport };
		if (lru_insert(&shunt_masq_nat, out, &outv, BPF_ANY) < 0) {
			/* Half a record would translate replies of a flow
			 * whose packets go out untranslated. */
			map_delete(&shunt_masq_nat, &in);
			return SHUNT_REASON_MASQ_INSERT_FAILED;
		}
		/* The reply entry, which that write may have evicted
		 * (lib/lru.h). */
		if (lru_restore(&shunt_masq_nat, &in, &inv, SHUNT_DIR_TO_UPLINK, 0) < 0)
			return SHUNT_REASON_MASQ_INSERT_FAILED;
		*port = in.dport;
		return 0;
	}
	return SHUNT_REASON_MASQ_PORT_EXHAUSTED;
}

#define ICMP_CSUM_OFF(l4off) ((l4off) + __builtin_offsetof(struct icmphdr, checksum))
#define ICMP_ID_OFF(l4off) ((l4off) + __builtin_offsetof(struct icmphdr, un.echo.id))

/* rewrite_addr replaces the source or destination address of the IPv4
 * header, fixing its checksum (only: the caller fixes a transport
 * checksum that covers it). */
static __always_inline int rewrite_addr(struct __sk_buff *skb, bool is_dst, __u32 old_ip, __u32 new_ip)
{
	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, sizeof(new_ip)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, is_dst ? IP_DST_OFF : IP_SRC_OFF, &new_ip, sizeof(new_ip), 0);
}

/* rewrite_icmp_echo replaces an echo's address (source or destination)
 * and identifier. The ICMP checksum has no pseudo-header: only the
 * identifier counts in it. */
static __always_inline int rewrite_icmp_echo(struct __sk_buff *skb, __u32 l4off, bool is_dst, __u32 old_ip,
					     __u32 new_ip, __u16 old_id, __u16 new_id)
{
	if (bpf_l4_csum_replace(skb, ICMP_CSUM_OFF(l4off), old_id, new_id, sizeof(new_id)) < 0 ||
	    bpf_skb_store_bytes(skb, ICMP_ID_OFF(l4off), &new_id, sizeof(new_id), 0) < 0)
		return -1;
	return rewrite_addr(skb, is_dst, old_ip, new_ip);
}

/* masq_icmp_error rewrites an ICMP error about a masqueraded flow. The
 * quoted packet is one the other end received: at ingress the node's
 * (its source is the node's address and port, given back to the pod's),
 * at egress the pod's (its destination becomes the node's). The outer
 * address on the same side (destination at ingress, source at egress)
 * changes alike. Every checksum the change touches is fixed: the quoted
 * IPv4 header's, the quoted TCP/UDP/ICMP checksum when the quote holds it,
 * the ICMP checksum (no pseudo-header: every changed byte of the quote is
 * a term of it) and the outer IPv4 header's. */
static __always_inline int masq_icmp_error(struct __sk_buff *skb, __u32 l4off, bool ingress, __u32 old_ip,
					   __u32 new_ip, __u16 old_port, __u16 new_port)
{
	__u32 icmp_csum = ICMP_CSUM_OFF(l4off);
	__u32 qip = l4off + sizeof(struct icmphdr);
	struct iphdr quoted;

	if (bpf_skb_load_bytes(skb, qip, &quoted, sizeof(quoted)) < 0 || quoted.ihl < 5)
		return -1;
	__u32 ql4 = qip + quoted.ihl * 4;
	__u32 addr_off = qip + (ingress ? __builtin_offsetof(struct iphdr, saddr) : __builtin_offsetof(struct iphdr, daddr));
	__u32 qcsum_ip = qip + __builtin_offsetof(struct iphdr, check);
	__u32 port_off, qcsum_l4;
	bool pseudo = true; /* the quoted checksum covers the addresses */
	__u64 mangled0 = 0;

	switch (quoted.protocol) {
	case IPPROTO_TCP:
		port_off = ql4 + (ingress ? 0 : 2);
		qcsum_l4 = ql4 + __builtin_offsetof(struct tcphdr, check);
		break;
	case IPPROTO_UDP:
		port_off = ql4 + (ingress ? 0 : 2);
		qcsum_l4 = ql4 + __builtin_offsetof(struct udphdr, check);
		mangled0 = BPF_F_MARK_MANGLED_0; /* 0: the datagram had no checksum */
		break;
	case IPPROTO_ICMP:
		port_off = ICMP_ID_OFF(ql4);
		qcsum_l4 = ICMP_CSUM_OFF(ql4);
		pseudo = false;
		break;
	default:
		return -1;
	}

	__u16 old_qcsum_ip = quoted.check, new_qcsum_ip, old_qcsum_l4, new_qcsum_l4;
	if (bpf_l3_csum_replace(skb, qcsum_ip, old_ip, new_ip, sizeof(new_ip)) < 0 ||
	    bpf_skb_load_bytes(skb, qcsum_ip, &new_qcsum_ip, sizeof(new_qcsum_ip)) < 0)
		return -1;
	/* RFC 792 quotes only 8 bytes of the transport header: a TCP
	 * checksum beyond the quote stays as it is (nobody checks it). */
	bool has_l4csum = bpf_skb_load_bytes(skb, qcsum_l4, &old_qcsum_l4, sizeof(old_qcsum_l4)) == 0;
	if (has_l4csum) {
		if (pseudo && bpf_l4_csum_replace(skb, qcsum_l4, old_ip, new_ip, sizeof(new_ip) | mangled0) < 0)
			return -1;
		if (bpf_l4_csum_replace(skb, qcsum_l4, old_port, new_port, sizeof(new_port) | mangled0) < 0 ||
		    bpf_skb_load_bytes(skb, qcsum_l4, &new_qcsum_l4, sizeof(new_qcsum_l4)) < 0)
			return -1;
	}
	if (bpf_l4_csum_replace(skb, icmp_csum, old_ip, new_ip, sizeof(new_ip)) < 0 ||
	    bpf_l4_csum_replace(skb, icmp_csum, old_qcsum_ip, new_qcsum_ip, sizeof(new_qcsum_ip)) < 0 ||
	    bpf_l4_csum_replace(skb, icmp_csum, old_port, new_port, sizeof(new_port)) < 0)
		return -1;
	if (has_l4csum && bpf_l4_csum_replace(skb, icmp_csum, old_qcsum_l4, new_qcsum_l4, sizeof(new_qcsum_l4)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, addr_off, &new_ip, sizeof(new_ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, port_off, &new_port, sizeof(new_port), 0) < 0)
		return -1;
	return rewrite_addr(skb, ingress, old_ip, new_ip);
}

#endif
