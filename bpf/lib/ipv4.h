/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The IPv4 header of an Ethernet frame as the tc programs read and patch
 * it: found once per packet, its TTL decremented as a router would. */
#ifndef SHUNT_LIB_IPV4_H
#define SHUNT_LIB_IPV4_H

#include "common.h"
#include "metrics.h"

#define IP_DST_OFF (ETH_HLEN + __builtin_offsetof(struct iphdr, daddr))
#define IP_SRC_OFF (ETH_HLEN + __builtin_offsetof(struct iphdr, saddr))
#define IP_CSUM_OFF (ETH_HLEN + __builtin_offsetof(struct iphdr, check))
#define IP_TTL_OFF (ETH_HLEN + __builtin_offsetof(struct iphdr, ttl))
#define IP_TOS_OFF (ETH_HLEN + __builtin_offsetof(struct iphdr, tos))

/* skb_ctx_ptr reads a packet pointer of struct __sk_buff (data,
 * data_end) by an instruction of its own: a plain read at the top of a
 * program lets the compiler keep the field's address (skb + 80) in a
 * register and read through it again later, a dereference of a modified
 * context pointer the verifier refuses. For a peek before the program's
 * ipv4_header. */
#define skb_ctx_ptr(skb, field)                                                                            \
	({                                                                                                 \
		void *ptr_;                                                                                \
		asm volatile("%[ptr] = *(u32 *)(%[ctx] + %[off])"                                          \
			     : [ptr] "=r"(ptr_)                                                            \
			     : [ctx] "r"(skb), [off] "i"(__builtin_offsetof(struct __sk_buff, field)));     \
		ptr_;                                                                                      \
	})

static __always_inline void *skb_linear_data(const struct __sk_buff *skb) { return skb_ctx_ptr(skb, data); }
static __always_inline void *skb_linear_end(const struct __sk_buff *skb) { return skb_ctx_ptr(skb, data_end); }

/* ipv4_header returns the IPv4 header of an Ethernet frame, or NULL with
 * *verdict set: TC_ACT_OK for what is not IPv4, TC_ACT_SHOT for malformed. */
static __always_inline struct iphdr *ipv4_header(struct __sk_buff *skb, __u32 dir, int *verdict)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;

	if ((void *)(eth + 1) > data_end) {
		count(SHUNT_REASON_INVALID_PACKET, dir, skb->len);
		*verdict = TC_ACT_SHOT;
		return NULL;
	}
	if (eth->h_proto != bpf_htons(ETH_P_IP)) {
		count(SHUNT_REASON_NOT_IPV4, dir, skb->len);
		*verdict = TC_ACT_OK;
		return NULL;
	}
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->ihl < 5) {
		count(SHUNT_REASON_INVALID_PACKET, dir, skb->len);
		*verdict = TC_ACT_SHOT;
		return NULL;
	}
	return ip;
}

/* Decrement the TTL as a router would; the checksum is patched incrementally
 * over the 16-bit word that holds TTL and protocol. */
static __always_inline int ip_dec_ttl(struct __sk_buff *skb, struct iphdr *ip)
{
	__u16 old = bpf_htons((__u16)ip->ttl << 8 | ip->protocol);
	__u16 new = bpf_htons((__u16)(ip->ttl - 1) << 8 | ip->protocol);
	__u8 ttl = ip->ttl - 1;

	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, old, new, sizeof(__u16)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, IP_TTL_OFF, &ttl, sizeof(ttl), 0);
}

#endif
