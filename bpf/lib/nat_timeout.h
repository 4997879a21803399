/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* How long a translated flow holds its entries (and its port), by the TCP
 * state its packets showed (enum masq_flags: the inside end's FIN is
 * "out", the outside end's "in"): the conntrack timeouts. Shared by the
 * masquerade (lib/masq.h) and NodePort's SNAT (lib/nodeport.h). */
#ifndef SHUNT_LIB_NAT_TIMEOUT_H
#define SHUNT_LIB_NAT_TIMEOUT_H

#include "common.h"
#include "conntrack.h"

/* nat_now is the clock of the translated flows' stamps (masquerade,
 * NodePort): conntrack's coarse clock (ct_now), read from memory where
 * bpf_ktime_get_ns reads the hardware clock on every packet. Their ages are
 * read as no time when a stamp is ahead (a finer stamp an older build
 * wrote, up to a tick). */
static __always_inline __u64 nat_now(void)
{
	return ct_now();
}

/* nat_closed: the TCP connection was reset, or FIN went both ways. */
static __always_inline bool nat_closed(__u32 flags)
{
	return (flags & MASQ_F_RST) || ((flags & MASQ_F_FIN_OUT) && (flags & MASQ_F_FIN_IN));
}

/* nat_reopened says whether a TCP packet with tcp_flags, of a flow whose
 * entries hold flags, starts a new connection on the flow's tuple (a
 * client reusing its port after the last connection ended): its flags
 * start over, as the pod conntrack's do (tcp_syn_reopens), and the new
 * connection gets an open one's lifetime, not the old one's closing
 * timeout. */
static __always_inline bool nat_reopened(__u32 flags, __u8 proto, __u8 tcp_flags)
{
	return tcp_syn_reopens(proto, tcp_flags, flags & (MASQ_F_RST | MASQ_F_FIN_OUT | MASQ_F_FIN_IN));
}

/* A flow's entries live as long as conntrack keeps a connection of its
 * protocol and state: the same timeouts (CT_TIMEOUT_* in conntrack.h). */
static __always_inline __u64 nat_timeout(__u32 flags, __u8 proto)
{
	if (proto != IPPROTO_TCP)
		return CT_TIMEOUT_OTHER;
	if (nat_closed(flags))
		return CT_TIMEOUT_TCP_CLOSING;
	if (!(flags & MASQ_F_REPLY_SEEN))
		return CT_TIMEOUT_TCP_OPENING;
	return CT_TIMEOUT_TCP_ESTABLISHED;
}

/* A TCP connection that closed (RST, or FIN both ways) keeps its entries
 * for CT_TIMEOUT_TCP_CLOSING, for its own late packets, but gives its
 * port to a new flow after this grace: enough for the last ACK and a
 * retransmitted FIN. Otherwise a destination's ports would be held 10 s
 * after every short connection, and one busy client would exhaust them
 * (4536 ports / 10 s = 450 connections a second); Linux's NAT likewise
 * reuses the port of a connection in TIME_WAIT for a new SYN. The
 * outside end, if it closed first, accepts a new SYN on a tuple in
 * TIME_WAIT (RFC 6191). */
#define NAT_CLOSED_REUSE (1 * NSEC_PER_SEC)

#endif
