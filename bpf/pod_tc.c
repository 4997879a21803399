// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc programs on the host side of pod veths.
 *
 * shunt_from_pod runs at ingress of the host veth, i.e. on every packet a pod
 * sends. It checks the source is the pod's own address, translates service
 * traffic no socket hook translated, applies policy (the sender's egress and,
 * for a local destination, the receiver's ingress) to new connections, and
 * routes a packet for another local pod here, in BPF: MACs rewritten, TTL
 * decremented, handed straight to the destination's veth, so it never enters
 * the host IP stack. Anything else (node addresses, outside) goes to the
 * host stack.
 *
 * shunt_to_pod runs at egress of the host veth: on packets the host stack
 * (or bpf_redirect) delivers to the pod. It applies the pod's ingress policy
 * to connections that did not come through shunt_from_pod: from the node
 * and from outside.
 */
#include "lib/common.h"
#include "lib/metrics.h"
#include "lib/endpoints.h"
#include "lib/flow.h"
#include "lib/tc_nat.h"
#include "lib/policy.h"

char __license[] SEC("license") = "Dual BSD/GPL";

volatile const struct shunt_config CONFIG = {};

/* Never read: they put these enums into the object's BTF, so bpf2go
 * generates their values for the agent instead of a hand-kept copy. */
const volatile enum shunt_identity _btf_identity = 0;
const volatile enum policy_verdict _btf_verdict = 0;
const volatile enum endpoint_flags _btf_endpoint_flags = 0;
const volatile enum shunt_reason _btf_reason = 0;

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

static __always_inline int drop(struct __sk_buff *skb, __u32 reason, __u32 dir)
{
	count(reason, dir, skb->len);
	return TC_ACT_SHOT;
}

SEC("tc")
int shunt_from_pod(struct __sk_buff *skb)
{
	struct endpoint_info *ep;
	struct iphdr *ip;
	struct flow f;
	int verdict;
	long ret;

	ip = ipv4_header(skb, SHUNT_DIR_FROM_POD, &verdict);
	if (!ip)
		return verdict;
	if (parse_flow(skb, ip, &f) < 0)
		return drop(skb, SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_FROM_POD);

	/* A pod may only send from its own address: policy trusts the
	 * source identity, so a forged one must not get through. */
	ep = lookup_endpoint(f.saddr);
	if (!ep || ep->ifindex != skb->ifindex)
		return drop(skb, SHUNT_REASON_SPOOFED, SHUNT_DIR_FROM_POD);
	struct policy_side src = {
		.addr = f.saddr, .identity = ep->identity, .flags = ep->flags, .local = true,
	};

	verdict = tc_service_nat(skb, ip, &f);
	if (verdict >= 0)
		return verdict;

	struct policy_side dst = { .addr = f.daddr };
	ep = lookup_endpoint(f.daddr);
	if (ep) {
		dst.identity = ep->identity;
		dst.flags = ep->flags;
		dst.local = true;
	} else {
		dst.identity = identity_of(f.daddr);
	}
	__u32 rule;
	__u32 reason = policy_admit(&f, &src, &dst, &rule);
	if (reason)
		return drop(skb, reason, SHUNT_DIR_FROM_POD);

	if (!ep) {
		count(SHUNT_REASON_TO_STACK, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_OK;
	}
	/* Copy what we need before helpers invalidate packet pointers. */
	__u32 ifindex = ep->ifindex;
	__u8 macs[12];
	__builtin_memcpy(macs, ep->pod_mac, 6);
	__builtin_memcpy(macs + 6, ep->node_mac, 6);

	/* Helpers may have moved the packet: reload the header. */
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > data_end)
		return drop(skb, SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_FROM_POD);
	/* Let the stack generate ICMP time exceeded. */
	if (ip->ttl <= 1) {
		count(SHUNT_REASON_TTL_EXCEEDED, SHUNT_DIR_FROM_POD, skb->len);
		return TC_ACT_OK;
	}
	if (ip_dec_ttl(skb, ip) < 0 || bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) < 0)
		return drop(skb, SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_FROM_POD);

	if (CONFIG.fwd_mode == SHUNT_FWD_REDIRECT_PEER)
		ret = bpf_redirect_peer(ifindex, 0);
	else
		ret = bpf_redirect(ifindex, 0);
	if (ret != TC_ACT_REDIRECT)
		return drop(skb, SHUNT_REASON_REDIRECT_FAILED, SHUNT_DIR_FROM_POD);
	count(SHUNT_REASON_FORWARDED, SHUNT_DIR_FROM_POD, skb->len);
	return TC_ACT_REDIRECT;
}

SEC("tc")
int shunt_to_pod(struct __sk_buff *skb)
{
	struct endpoint_info *ep;
	struct iphdr *ip;
	struct flow f;
	int verdict;

	ip = ipv4_header(skb, SHUNT_DIR_TO_POD, &verdict);
	if (!ip)
		return verdict;
	if (parse_flow(skb, ip, &f) < 0)
		return drop(skb, SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_TO_POD);
	ep = lookup_endpoint(f.daddr);
	if (!ep) {
		/* Not addressed to the pod (broadcast, a stale route): the
		 * pod's stack decides, policy has nothing to protect. */
		count(SHUNT_REASON_TO_STACK, SHUNT_DIR_TO_POD, skb->len);
		return TC_ACT_OK;
	}
	struct policy_side dst = {
		.addr = f.daddr, .identity = ep->identity, .flags = ep->flags, .local = true,
	};
	struct policy_side src = { .addr = f.saddr, .identity = identity_of(f.saddr) };
	__u32 rule;
	__u32 reason = policy_admit(&f, &src, &dst, &rule);
	if (reason)
		return drop(skb, reason, SHUNT_DIR_TO_POD);
	count(SHUNT_REASON_FORWARDED, SHUNT_DIR_TO_POD, skb->len);
	return TC_ACT_OK;
}
