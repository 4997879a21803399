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
#include "tcp_options.h"

/* carried_identity reads the identity option (struct identity_tcp_option)
 * of the TCP header at l4off, 0 when there is none (or it is malformed,
 * or not a pod's identity). */
static __always_inline __u32 carried_identity(struct __sk_buff *skb, __u32 l4off)
{
	__u32 off = tcp_option(skb, l4off,
			       TCP_OPTION(SHUNT_TCPOPT_IDENTITY_KIND, SHUNT_TCPOPT_IDENTITY_LEN,
					  bpf_htons(SHUNT_TCPOPT_IDENTITY_EXID)));
	__u32 identity;

	if (!off || bpf_skb_load_bytes(skb, off + __builtin_offsetof(struct identity_tcp_option, identity), &identity,
				       sizeof(identity)) < 0)
		return 0;
	identity = bpf_ntohl(identity);
	return pod_identity(identity) ? identity : 0;
}

#endif
