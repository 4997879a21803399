/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Identity-based network policy. A new connection is admitted by the egress
 * policy of the sending pod and the ingress policy of the receiving pod
 * (each only when the pod is isolated in that direction), then tracked, so
 * its later packets cost one conntrack lookup. Every lookup is a hash or an
 * LPM trie lookup: the cost does not grow with the number of rules. */
#ifndef SHUNT_LIB_POLICY_H
#define SHUNT_LIB_POLICY_H

#include "common.h"
#include "flow_tuple.h"
#include "conntrack.h"
#include "pkt.h"

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_ipcache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_cidr_identities SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_policy SEC(".maps");

/* ipcache_lookup: the ipcache entry of an address (identity, and the node
 * hosting it when that is behind the overlay), NULL when the ipcache does
 * not know it. */
static __always_inline struct ipcache_value *ipcache_lookup(__u32 addr)
{
	struct ipcache_key k = { .prefixlen = 32, .ip4 = addr };

	return bpf_map_lookup_elem(&shunt_ipcache, &k);
}

/* identity_of: the identity of an address that is not a local pod. */
static __always_inline __u32 identity_of(__u32 addr)
{
	struct ipcache_value *v = ipcache_lookup(addr);

	return v ? v->identity : SHUNT_ID_WORLD;
}

/* pod_identity says whether an identity is a pod's: not a reserved one
 * (host, world, remote-node) nor a policy prefix's (CIDR). Only a pod's
 * travels between nodes as its sender's: in the VNI (lib/encap.h) and in
 * the node proxy's SYN option (lib/carried_identity.h). */
static __always_inline bool pod_identity(__u32 identity)
{
	return identity >= SHUNT_ID_FIRST_POD && identity < SHUNT_ID_FIRST_CIDR;
}

/* cidr_identity_of: the identity of the longest policy prefix holding addr,
 * 0 when no policy names one. */
static __always_inline __u32 cidr_identity_of(__u32 addr)
{
	struct ipcache_key k = { .prefixlen = 32, .ip4 = addr };
	struct ipcache_value *v = bpf_map_lookup_elem(&shunt_cidr_identities, &k);

	return v ? v->identity : 0;
}

static __always_inline __u8 policy_lookup(__u32 endpoint, __u8 egress, __u32 identity, struct flow *f,
					  __u16 dport, __u32 *rule)
{
	struct policy_key k = {
		.prefixlen = POLICY_PREFIX_PROTO + 16,
		.endpoint = endpoint,
		.identity = identity,
		.egress = egress,
		.proto = f->proto,
		.dport = f->has_ports ? dport : 0,
	};
	struct policy_value *v = bpf_map_lookup_elem(&shunt_policy, &k);

	if (!v)
		return POLICY_NONE;
	*rule = v->rule_id;
	return v->verdict;
}

/* policy_verdict looks the peer up by its identity, its CIDR identity and
 * as "any peer"; a deny from any of them wins, then an allow. */
static __always_inline __u8 policy_verdict(__u32 endpoint, __u8 egress, __u32 peer, __u32 peer_addr,
					   struct flow *f, __u16 dport, __u32 *rule)
{
	__u32 r_id = 0, r_cidr = 0, r_any = 0;
	__u32 cidr = cidr_identity_of(peer_addr);
	__u8 v_id = policy_lookup(endpoint, egress, peer, f, dport, &r_id);
	__u8 v_cidr = cidr ? policy_lookup(endpoint, egress, cidr, f, dport, &r_cidr) : POLICY_NONE;
	__u8 v_any = policy_lookup(endpoint, egress, SHUNT_ID_ANY, f, dport, &r_any);

	if (v_id == POLICY_DENY || v_cidr == POLICY_DENY || v_any == POLICY_DENY) {
		*rule = v_id == POLICY_DENY ? r_id : v_cidr == POLICY_DENY ? r_cidr : r_any;
		return POLICY_DENY;
	}
	if (v_id == POLICY_ALLOW || v_cidr == POLICY_ALLOW || v_any == POLICY_ALLOW) {
		*rule = v_id == POLICY_ALLOW ? r_id : v_cidr == POLICY_ALLOW ? r_cidr : r_any;
		return POLICY_ALLOW;
	}
	*rule = 0;
	return POLICY_NONE;
}

/* One side of a connection as policy sees it. A local pod has its endpoint
 * entry; anything else is known by address only. */
struct policy_side {
	__u32 addr;
	__u32 identity;
	__u32 flags;    /* enum endpoint_flags; 0 when not a local pod */
	bool local;
	/* dst only: the node proxy, reached through a socket hook's L7
	 * redirect to a service. The proxy's upstream connection is what
	 * policy judges, as this client; this leg is only tracked. */
	bool proxy;
	/* dst only, non-zero: the port policy judges instead of the packet's
	 * (a pod's own proxy receives what was dialled at this port). */
	__u16 judged_dport;
};

static __always_inline __u32 verdict_reason(__u8 v)
{
	return v == POLICY_DENY ? SHUNT_REASON_POLICY_DENIED : SHUNT_REASON_POLICY_NOT_ALLOWED;
}

/* policy_judge decides a new connection from src to dst's port dport (network
 * order) at L3/L4: the egress policy of src and the ingress policy of dst,
 * where each is a local pod with rules. Returns 0 to admit, or the drop
 * reason; *rule is the rule that decided (0: none). */
static __always_inline __u32 policy_judge(struct flow *f, struct policy_side *src, struct policy_side *dst,
					  __u16 dport, __u32 *rule)
{
	__u8 v;

	*rule = 0;
	if (src->local && (src->flags & (ENDPOINT_F_EGRESS_ISOLATED | ENDPOINT_F_EGRESS_RULES))) {
		v = policy_verdict(src->addr, 1, dst->identity, dst->addr, f, dport, rule);
		if (v == POLICY_DENY || (v == POLICY_NONE && (src->flags & ENDPOINT_F_EGRESS_ISOLATED)))
			return verdict_reason(v);
	}
	if (dst->local && (dst->flags & (ENDPOINT_F_INGRESS_ISOLATED | ENDPOINT_F_INGRESS_RULES))) {
		v = policy_verdict(dst->addr, 0, src->identity, src->addr, f, dport, rule);
		if (v == POLICY_DENY || (v == POLICY_NONE && (dst->flags & ENDPOINT_F_INGRESS_ISOLATED)))
			return verdict_reason(v);
	}
	return 0;
}

/* What conntrack says about one packet (ct_find): looked up once, by
 * whoever needs it first (shunt_from_pod: before the service
 * translation), and handed to policy_admit_found. */
struct ct_found {
	__u8 flags;   /* its connection's flags (enum ct_flags, as pkt's ct_flags) */
	__u8 live;    /* the packet belongs to a live connection */
	__u8 closing; /* ct_lookup's *closing */
	__u8 pad;
	__u32 failed; /* ct_lookup's *failed */
};

/* ct_find looks up the connection of the packet f (ct_lookup) into found. */
static __always_inline void ct_find(struct flow *f, struct ct_found *found)
{
	bool closing = false;
	__u32 failed = 0;
	struct ct_value *ct = ct_lookup(f, ct_now(), &closing, &failed);

	found->live = ct != NULL;
	found->flags = ct ? ct->flags : 0;
	found->failed = failed;
	found->closing = closing;
}

/* policy_admit_new judges packet p of no known connection from src to dst
 * and records its connection when admitted (policy_admit_found): returns 0
 * or the drop reason, and sets p->rule (and p->ct_flags when admitted).
 *
 * A TCP segment that opens nothing (no SYN, or a SYN-ACK) of a connection
 * no table holds (its entry flushed, evicted or lost) may be the answer of
 * a connection its destination opened: when policy refuses it its own way
 * and admits that way, it passes and is recorded as such (CT_F_ANSWER).
 * Either end may speak first after the loss, so a connection policy admits
 * one way goes on either way, and one it refuses both ways ends. A SYN
 * always needs its own way (and may not ride on an entry recorded from an
 * answer: ct_refresh).
 *
 * A program whose stack is full defines POLICY_JUDGE_OWN_FRAME before its
 * includes (bpf/pod_tc.c): this is then a subprogram, policy's lookups in a
 * frame of their own; elsewhere it is inlined. */
#ifdef POLICY_JUDGE_OWN_FRAME
static __noinline
#else
static __always_inline
#endif
__u32 policy_admit_new(struct pkt *p, const volatile struct shunt_config *cfg, struct policy_side *src, struct policy_side *dst)
{
	struct flow *f = &p->f;
	__u32 rule = 0;

	if (!dst->proxy) {
		__u32 reason = policy_judge(f, src, dst, dst->judged_dport ? dst->judged_dport : f->dport, &rule);

		if (reason && f->proto == IPPROTO_TCP && !tcp_opens(f->proto, f->tcp_flags)) {
			__u32 answer_rule = 0;

			if (!policy_judge(f, dst, src, f->sport, &answer_rule)) {
				reason = 0;
				rule = answer_rule;
				p->ct_new_flags |= CT_F_ANSWER;
				p->event = FLOW_EV_CONN_ANSWER;
			}
		}
		p->rule = rule;
		if (reason)
			return reason;
	}
	if (ct_create(f, rule, ct_now(), cfg->ct_single_table, p->ct_new_flags) < 0)
		return SHUNT_REASON_CT_FULL;
	p->ct_flags = p->ct_new_flags;
	return 0;
}

/* policy_admit_found decides a packet p between src and dst: a packet of a
 * known connection (or an ICMP error about one) passes; a new connection
 * needs the egress policy of src and the ingress policy of dst, and is
 * recorded. A direction with entries is looked up; a deny drops; no match
 * drops only when the pod is isolated for that direction (deny-only
 * policies take away without isolating). Returns 0 to pass, or the drop
 * reason; sets p->rule to the rule that decided, p->event to what the
 * packet is to its connection (new, end, or just a packet), p->ct_flags to
 * its connection's flags (a new one's: p->ct_new_flags), and p->failed
 * when a conntrack record could not be made on the way (counted here).
 * found is the packet's conntrack lookup (ct_find). */
static __always_inline __u32 policy_admit_found(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
						struct policy_side *src, struct policy_side *dst, const struct ct_found *found)
{
	struct flow *f = &p->f;

	p->rule = 0;
	p->event = FLOW_EV_PACKET;
	if (found->live) {
		p->ct_flags = found->flags;
		if (found->failed) {
			count(found->failed, p->dir, skb->len);
			p->failed = found->failed;
		}
		if (found->closing)
			p->event = FLOW_EV_CONN_END;
		return 0;
	}
	if (ct_related(f)) {
		p->event = FLOW_EV_ICMP_ERROR;
		return 0;
	}
	p->event = FLOW_EV_CONN_NEW;
	return policy_admit_new(p, cfg, src, dst);
}

/* policy_admit is policy_admit_found with the conntrack lookup made here. */
static __always_inline __u32 policy_admit(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
					  struct policy_side *src, struct policy_side *dst)
{
	struct ct_found found;

	ct_find(&p->f, &found);
	return policy_admit_found(skb, p, cfg, src, dst, &found);
}

#endif
