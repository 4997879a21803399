/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* One packet's way through a tc program (a pod veth's, the overlay
 * device's): what its flow event will report, filled in along the way, and
 * the one place its outcome is counted and reported. */
#ifndef SHUNT_LIB_PKT_H
#define SHUNT_LIB_PKT_H

#include "common.h"
#include "metrics.h"
#include "flow_tuple.h"
#include "flow_events.h"
#include "ipv4.h"

/* What one packet's flow event reports, filled in along the way. */
struct pkt {
	struct flow f;
	__u32 dir;         /* enum shunt_direction: where it is counted */
	__u8 point;        /* enum flow_point: where its flow event says it was seen */
	__u8 ct_flags;     /* policy_admit: the flags (enum ct_flags) of the tracked connection it belongs to */
	__u32 orig_daddr;  /* before the tc service translation */
	__u16 orig_dport;
	__u32 src_identity;
	__u32 dst_identity;
	__u32 rule;
	__u8 event;        /* enum flow_event_type */
	__u8 ct_new_flags; /* policy_admit: flags a connection this packet opens is recorded with */
	__u32 failed;      /* a record that could not be made on the way (enum shunt_reason), 0 if none */
};

/* pkt_reported says whether done_len reports a packet that ends with
 * this verdict (a packet's event is sent in the sampling, or something
 * failed on its way and flows are on). */
static __always_inline bool pkt_reported(struct pkt *p, __u8 verdict)
{
	__u8 event = verdict == FLOW_DROPPED ? FLOW_EV_DROP : p->event;
	__u32 mode = flow_mode();

	return flow_wanted(mode, event) || (p->failed && mode != FLOW_MODE_OFF);
}

/* icmp_error_of is the ICMP error the packet carries, as an event's
 * tcp_flags hold it (enum flow_icmp_error), or 0 when its IPv4 header
 * (read again: it may have been rewritten) is not an ICMP error's. Read
 * only for the event, which ICMP errors seldom need. */
static __always_inline __u8 icmp_error_of(struct __sk_buff *skb)
{
	__u8 vihl, proto, tc[2];

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &vihl, 1) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, protocol), &proto, 1) < 0 || proto != IPPROTO_ICMP ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + (vihl & 0x0f) * 4, tc, sizeof(tc)) < 0)
		return 0;
	__u8 kind = tc[0] == ICMP_DEST_UNREACH ? FLOW_ICMP_DEST_UNREACH :
		    tc[0] == ICMP_TIME_EXCEEDED ? FLOW_ICMP_TIME_EXCEEDED :
		    tc[0] == ICMP_PARAMETERPROB ? FLOW_ICMP_PARAMETER_PROBLEM : 0;
	return kind ? kind | (tc[1] & FLOW_ICMP_CODE_MASK) : 0;
}

/* pkt_report sends the flow event of a packet done_len reports, built in
 * the ring buffer (flow_reserve), outcome being its verdict | reason << 8.
 * A subprogram: one copy of the event's code however many places a
 * program ends a packet, in a frame of its own of at most 32 bytes
 * (TestStackFitsOlderVerifiers). Why outcome packs two values: the four
 * arguments still needed after the ring buffer's helper call fit the four
 * registers such a call keeps (r6-r9); a fifth would be spilled to this
 * frame. Called only for an event that is sent. */
_Static_assert(SHUNT_REASON_MAX <= 0x100, "pkt_report: a reason no longer fits the 8 bits of outcome (and flow_event.reason)");

static __noinline void pkt_report(struct __sk_buff *skb, struct pkt *p, __u32 outcome, __u32 len)
{
	struct flow_event *e = flow_reserve();

	if (!e)
		return;
	__u8 verdict = outcome & 0xff;
	__u8 event = verdict == FLOW_DROPPED ? FLOW_EV_DROP : p->event;
	e->saddr = p->f.saddr, e->daddr = p->f.daddr, e->sport = p->f.sport, e->dport = p->f.dport;
	e->proto = p->f.proto, e->tcp_flags = p->f.tcp_flags, e->verdict = verdict, e->reason = outcome >> 8;
	e->point = p->point, e->event = event, e->ifindex = skb->ifindex, e->src_identity = p->src_identity;
	e->dst_identity = p->dst_identity, e->rule_id = p->rule, e->len = len;
	if (p->orig_daddr != p->f.daddr || p->orig_dport != p->f.dport) {
		e->orig_daddr = p->orig_daddr;
		e->orig_dport = p->orig_dport;
	}
	if (event == FLOW_EV_ICMP_ERROR)
		e->tcp_flags = icmp_error_of(skb);
	flow_submit(e);
}

/* done_len counts a packet's outcome and, when the sampling wants it,
 * reports it, the packet being len bytes long. A record that could not be
 * made on the way (counted where it failed) is news even when the packet
 * went on: the event names it as its reason and is sent whenever flows are
 * on. */
static __always_inline void done_len(struct __sk_buff *skb, struct pkt *p, __u8 verdict, __u32 reason, __u32 len)
{
	count(reason, p->dir, len);
	if (!pkt_reported(p, verdict))
		return;
	if (verdict != FLOW_DROPPED && p->failed)
		reason = p->failed;
	pkt_report(skb, p, verdict | (reason & 0xff) << 8, len);
}

/* done counts and reports a packet's outcome (done_len) at its length now. */
static __always_inline void done(struct __sk_buff *skb, struct pkt *p, __u8 verdict, __u32 reason)
{
	done_len(skb, p, verdict, reason, skb->len);
}

static __always_inline int drop(struct __sk_buff *skb, struct pkt *p, __u32 reason)
{
	done(skb, p, FLOW_DROPPED, reason);
	return TC_ACT_SHOT;
}

/* pkt_begin reads the IPv4 header and the flow of the packet p is about,
 * and remembers the destination before any translation: the header, or
 * NULL with *verdict set (what is not IPv4 passes; a malformed packet is
 * dropped, counted and reported). */
static __always_inline struct iphdr *pkt_begin(struct __sk_buff *skb, struct pkt *p, int *verdict)
{
	struct iphdr *ip = ipv4_header(skb, p->dir, verdict);

	if (!ip)
		return NULL;
	if (parse_flow(skb, ip, &p->f) < 0) {
		*verdict = drop(skb, p, SHUNT_REASON_INVALID_PACKET);
		return NULL;
	}
	p->orig_daddr = p->f.daddr;
	p->orig_dport = p->f.dport;
	return ip;
}

#endif
