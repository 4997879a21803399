/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Finding one option in a TCP header's options: the MSS of a backend's
 * SYN-ACK that DSR clamps (lib/nodeport.h, dsr_clamp_mss), the client's
 * identity in the node proxy's SYN (lib/carried_identity.h). */
#ifndef SHUNT_LIB_TCP_OPTIONS_H
#define SHUNT_LIB_TCP_OPTIONS_H

#include "common.h"

#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_MSS 2
#define TCPOLEN_MSS 4
/* The options of a TCP header fill at most 40 bytes, so at most 40 of them
 * (each at least one byte). */
#define TCP_OPTIONS_MAX 40

/* TCP_OPTION names the option tcp_option finds: its kind and length, and,
 * when exid is not 0, the experiment ID (RFC 6994, network order) in its
 * first two bytes of data, so that another experiment's option of the same
 * kind is passed over. One number rather than three arguments: see
 * tcp_option. */
#define TCP_OPTION(kind, len, exid) ((__u32)(kind) | (__u32)(len) << 8 | (__u32)(exid) << 16)

/* tcp_option finds the option named by want (TCP_OPTION) in the TCP header
 * at l4off. Returns the option's offset in the packet, 0 when there is
 * none, or the options end or are malformed before it.
 *
 * A global function, verified once on its own: its result is any number to
 * its callers, so what follows a call is verified once, not once per
 * option the walk could have stopped at (as a static function's, whose
 * exits the verifier follows into its caller, it took a program past the
 * verifier's million instructions). Every byte is read with
 * bpf_skb_load_bytes, whose offset the verifier need not know, so the
 * loop's paths reach equal states and it is verified once per option: all
 * 40 can be walked, and options outside the linear data are read too. Its
 * stack adds to the uplink program's, which has 32 bytes left: few values,
 * one buffer. */
__noinline __u32 tcp_option(struct __sk_buff *skb, __u32 l4off, __u32 want)
{
	__u8 b[4]; /* the data offset; then an option's kind, length, ExID */

	if (bpf_skb_load_bytes(skb, l4off + 12, b, 1) < 0)
		return 0;
	__u32 end = l4off + (b[0] >> 4) * 4;
	__u32 off = l4off + 20;

	for (int i = 0; i < TCP_OPTIONS_MAX; i++) {
		/* want stays one value: hoisted out of the loop, its parts
		 * were two more on the stack. */
		asm volatile("" : "+r"(want));
		if (off >= end || bpf_skb_load_bytes(skb, off, b, 1) < 0 || b[0] == TCPOPT_EOL)
			return 0;
		if (b[0] == TCPOPT_NOP) {
			off++;
			continue;
		}
		if (off + 2 > end || bpf_skb_load_bytes(skb, off, b, 2) < 0 || b[1] < 2 || off + b[1] > end)
			return 0;
		/* Kind and length, as TCP_OPTION puts them. */
		if ((b[0] | b[1] << 8) == (want & 0xffff)) {
			if (!(want >> 16))
				return off;
			/* Read again with the ExID, into the same buffer: the
			 * address of another would be one more value on the
			 * stack. */
			if (b[1] >= 4 && bpf_skb_load_bytes(skb, off, b, 4) == 0 && (b[2] | b[3] << 8) == want >> 16)
				return off;
		}
		off += b[1];
	}
	return 0;
}

#endif
