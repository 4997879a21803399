/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Forwarding in BPF, as a router would, without the host IP stack: one hop
 * (TTL) and the hand-over to a pod of this node. Used by every program that
 * delivers to a local pod (from another pod, from the overlay, from the
 * uplink). */
#ifndef SHUNT_LIB_FORWARD_H
#define SHUNT_LIB_FORWARD_H

#include "common.h"
#include "ipv4.h"
#include "pkt.h"
#include "policy.h"
#include "steer.h"

/* forward_hop makes one routing hop of the packet: the TTL is
 * decremented. Helpers may have moved the packet, so the header is read
 * again. Returns -1 to go on, else the verdict to return: TC_ACT_OK when
 * the TTL would expire (the stack answers ICMP time exceeded), TC_ACT_SHOT
 * for a packet that cannot be patched. The outcome is counted either way. */
static __always_inline int forward_hop(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;

	if ((void *)(ip + 1) > data_end)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	if (ip->ttl <= 1) {
		done(skb, p, FLOW_FORWARDED, SHUNT_REASON_TTL_EXCEEDED);
		return TC_ACT_OK;
	}
	if (ip_dec_ttl(skb, ip) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	return -1;
}

/* redirect_into_pod sets the packet's way into the pod whose host veth is
 * ifindex: straight into its namespace (bpf_redirect_peer) or out of its
 * host veth (bpf_redirect), as fwd_mode (enum shunt_fwd_mode) says. The
 * helper's result: TC_ACT_REDIRECT when set. */
static __always_inline long redirect_into_pod(__u32 ifindex, __u32 fwd_mode)
{
	if (fwd_mode == SHUNT_FWD_REDIRECT_PEER)
		return bpf_redirect_peer(ifindex, 0);
	return bpf_redirect(ifindex, 0);
}

/* to_local_pod hands the packet to a pod of this node: one hop, the pod's
 * MACs written (its own as destination, its gateway's as source), then
 * straight into its namespace (bpf_redirect_peer) or out of its host veth
 * (bpf_redirect), as fwd_mode (enum shunt_fwd_mode) says. Returns the
 * program's verdict; the outcome is counted and reported. */
static __always_inline int to_local_pod(struct __sk_buff *skb, struct pkt *p, struct endpoint_info *ep, __u32 fwd_mode)
{
	/* Copy what we need before helpers invalidate packet pointers. */
	__u32 ifindex = ep->ifindex;
	__u8 macs[12];
	int verdict;

	__builtin_memcpy(macs, ep->pod_mac, 6);
	__builtin_memcpy(macs + 6, ep->node_mac, 6);
	verdict = forward_hop(skb, p);
	if (verdict >= 0)
		return verdict;
	if (bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	if (redirect_into_pod(ifindex, fwd_mode) != TC_ACT_REDIRECT)
		return drop(skb, p, SHUNT_REASON_REDIRECT_FAILED);
	done(skb, p, FLOW_FORWARDED, SHUNT_REASON_FORWARDED);
	return TC_ACT_REDIRECT;
}

/* admit_to_local_pod_found judges a packet that came from off the node (another
 * node's pod or the node itself, outside) for the pod ep of this node: the
 * pod's ingress policy with src_identity for the sender, then, admitted
 * (and tracked: its replies pass back through shunt_from_pod), handed to
 * the pod as from a pod of this node, or to the node proxy when the pod's
 * port has HTTP rules, or to the pod's own proxy's port when it has one
 * for that port (lib/steer.h). Returns the program's verdict. */
static __always_inline int admit_to_local_pod_found(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
						    __u32 src_identity, struct endpoint_info *ep, const struct ct_found *found)
{
	struct policy_side src = { .addr = p->f.saddr, .identity = src_identity };
	struct policy_side dst = {
		.addr = p->f.daddr, .identity = ep->identity, .flags = ep->flags, .local = true,
	};
	__u32 reason;

	p->dst_identity = ep->identity;
	reason = policy_admit_found(skb, p, cfg, &src, &dst, found);
	if (reason)
		return drop(skb, p, reason);
	int verdict = steer_to_proxy(skb, p, cfg, src_identity);
	if (verdict >= 0)
		return verdict;
	if (ep->flags & ENDPOINT_F_OWN_PROXY) {
		reason = pod_proxy_in(skb, p);
		if (reason)
			return drop(skb, p, reason);
	}
	return to_local_pod(skb, p, ep, cfg->fwd_mode);
}

/* admit_to_local_pod is admit_to_local_pod_found with the packet's
 * conntrack lookup made here. */
static __always_inline int admit_to_local_pod(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
					      __u32 src_identity, struct endpoint_info *ep)
{
	struct ct_found found;

	ct_find(&p->f, &found);
	return admit_to_local_pod_found(skb, p, cfg, src_identity, ep, &found);
}

#endif
