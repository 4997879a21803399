/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* A client's identity carried to another node in the node proxy's SYN,
 * with native routing.
 *
 * The node proxy connects for its clients from the node's address, its
 * socket marked with the client's identity (lib/proxy.h). With the overlay
 * the VNI carries that identity to the server's node. With native routing
 * nothing does: the connection would arrive as the remote-node identity,
 * so a policy admitting the client would refuse its requests through a
 * route or a traffic split, and one admitting remote-node would admit
 * every client of that node. So the proxy's SYN carries it in a TCP option
 * (enum shunt_tcp_option): the sockops program asks the kernel for room in
 * the SYN of a marked socket connecting to another node's pod and writes
 * the option there (the kernel builds the header, MSS included: nothing to
 * rewrite in tc), and the receiving node's uplink program judges a SYN from
 * another node's address (remote-node) that has the option as the identity
 * in it. Only a pod's identity is taken; only the SYN carries it, since
 * policy judges a connection at its first packet and conntrack admits the
 * rest.
 *
 * Trust: as the VNI, the option is believed from another node's address
 * only. A pod cannot send from its node's address (spoof checks), and a
 * process of the node cannot add a TCP option without raw sockets; whoever
 * can forge either already holds the node, which can claim any identity
 * through the overlay too. */
#ifndef SHUNT_LIB_CARRIED_IDENTITY_H
#define SHUNT_LIB_CARRIED_IDENTITY_H

#include "common.h"
#include "metrics.h"
#include "policy.h"

#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
/* The options of a TCP header fill at most 40 bytes, so at most 40 of them
 * (each at least one byte). */
#define TCP_OPTIONS_MAX 40

/* The option as it is written: kind, length, ExID, identity. */
struct identity_tcp_option {
	__u8 kind;
	__u8 len;
	__u16 exid;     /* network byte order */
	__u32 identity; /* network byte order */
} __attribute__((packed));

_Static_assert(sizeof(struct identity_tcp_option) == SHUNT_TCPOPT_IDENTITY_LEN, "the identity option's size");

/* carried_identity reads the identity option of the TCP header at l4off,
 * 0 when there is none (or it is malformed, or not a pod's identity). A
 * function of its own, not inlined: its few bytes of stack are not added
 * to the uplink program's, which has little left. The offsets are read with
 * bpf_skb_load_bytes, whose offset the verifier need not know, so the
 * states of the loop's paths compare equal and the loop is verified once
 * per option, not once per path through the options before it. (Unused
 * in the sockops object, which writes the option.) */
static __noinline __attribute__((unused)) __u32 carried_identity(struct __sk_buff *skb, __u32 l4off)
{
	__u8 doff;

	if (bpf_skb_load_bytes(skb, l4off + 12, &doff, 1) < 0)
		return 0;
	__u32 end = l4off + (doff >> 4) * 4;
	__u32 off = l4off + 20;

	for (int i = 0; i < TCP_OPTIONS_MAX; i++) {
		__u8 kind_len[2];

		if (off >= end || bpf_skb_load_bytes(skb, off, kind_len, 1) < 0 || kind_len[0] == TCPOPT_EOL)
			return 0;
		if (kind_len[0] == TCPOPT_NOP) {
			off++;
			continue;
		}
		if (off + 2 > end || bpf_skb_load_bytes(skb, off, kind_len, 2) < 0 || kind_len[1] < 2 ||
		    off + kind_len[1] > end)
			return 0;
		if (kind_len[0] == SHUNT_TCPOPT_IDENTITY_KIND && kind_len[1] == SHUNT_TCPOPT_IDENTITY_LEN) {
			struct identity_tcp_option o;

			if (bpf_skb_load_bytes(skb, off, &o, sizeof(o)) < 0)
				return 0;
			/* Another experiment's option of this kind is skipped. */
			if (o.exid == bpf_htons(SHUNT_TCPOPT_IDENTITY_EXID)) {
				__u32 identity = bpf_ntohl(o.identity);

				return pod_identity(identity) ? identity : 0;
			}
		}
		off += kind_len[1];
	}
	return 0;
}

#endif
