// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc programs on the host side of pod veths. shunt_from_pod runs at ingress of
 * the host veth, i.e. on every packet a pod sends. A packet for another local
 * pod is routed here, in BPF: MACs rewritten, TTL decremented, and handed
 * straight to the destination's veth, so it never enters the host IP stack.
 * Anything else (node addresses, outside) goes to the host stack unchanged.
 */
#include "lib/common.h"
#include "lib/metrics.h"
#include "lib/endpoints.h"
#include "lib/tc_nat.h"

char __license[] SEC("license") = "Dual BSD/GPL";

volatile const struct shunt_config CONFIG = {};

#define IP_TTL_OFF (ETH_HLEN + __builtin_offsetof(struct iphdr, ttl))

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

SEC("tc")
int shunt_from_pod(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct endpoint_info *ep;
	long ret;

	if ((void *)(eth + 1) > data_end) {
		count(SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_SHOT;
	}
	if (eth->h_proto != bpf_htons(ETH_P_IP)) {
		count(SHUNT_REASON_NOT_IPV4, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_OK;
	}
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->ihl < 5) {
		count(SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_SHOT;
	}

	__u32 daddr = ip->daddr;
	int verdict = tc_service_nat(skb, ip, &daddr);
	if (verdict >= 0)
		return verdict;
	/* Helpers may have moved the packet: reload the pointers. */
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end) {
		count(SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_SHOT;
	}

	ep = lookup_endpoint(daddr);
	if (!ep) {
		count(SHUNT_REASON_TO_STACK, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_OK;
	}
	/* Let the stack generate ICMP time exceeded. */
	if (ip->ttl <= 1) {
		count(SHUNT_REASON_TTL_EXCEEDED, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_OK;
	}

	/* Copy what we need before helpers invalidate packet pointers. */
	__u32 ifindex = ep->ifindex;
	__u8 macs[12];
	__builtin_memcpy(macs, ep->pod_mac, 6);
	__builtin_memcpy(macs + 6, ep->node_mac, 6);

	if (ip_dec_ttl(skb, ip) < 0 ||
	    bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) < 0) {
		count(SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_SHOT;
	}

	if (CONFIG.fwd_mode == SHUNT_FWD_REDIRECT_PEER)
		ret = bpf_redirect_peer(ifindex, 0);
	else
		ret = bpf_redirect(ifindex, 0);
	if (ret != TC_ACT_REDIRECT) {
		count(SHUNT_REASON_REDIRECT_FAILED, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_SHOT;
	}
	count(SHUNT_REASON_FORWARDED, SHUNT_DIR_FROM_POD, skb->len);
	return TC_ACT_REDIRECT;
}
