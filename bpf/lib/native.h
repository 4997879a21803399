/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Native routing between nodes, the other mode beside the overlay
 * (lib/encap.h): no encapsulation, the underlay routes pod CIDRs. A packet
 * for a pod of another node leaves the node's underlay interface as it is,
 * to the next hop the node's own routes give (the agent installs one per
 * other node's pod CIDR: `CIDR via NODE dev UNDERLAY`), found with
 * bpf_fib_lookup and sent with bpf_redirect or bpf_redirect_neigh, so it
 * never climbs the host stack. The receiving node's uplink program
 * (bpf/uplink_tc.c) judges it with the identity its ipcache gives the
 * source address. */
#ifndef SHUNT_LIB_NATIVE_H
#define SHUNT_LIB_NATIVE_H

#include "common.h"
#include "ipv4.h"
#include "pkt.h"
#include "forward.h"

/* Room for fib_xmit's helper arguments, one or the other as the lookup
 * went. Its caller gives it: on its stack, or, where the program's stack
 * is full, in a map (lib/encap.h's shunt_encap_scratch). */
union fib_xmit_room {
	struct bpf_redir_neigh nh; /* bpf_redirect_neigh's next hop */
	__u8 macs[2 * ETH_ALEN];   /* the Ethernet addresses, written in one store */
};

/* fib_xmit sends a packet with its Ethernet header at offset 0 to the next
 * hop a successful route lookup (ret: SUCCESS or NO_NEIGH) found: the next
 * hop's MAC written and the packet redirected (bpf_redirect), or, when the
 * next hop's MAC is not known yet, handed to bpf_redirect_neigh, which
 * resolves it as the stack does. Nothing counted: its callers report
 * differently. Returns the redirect helper's result (TC_ACT_REDIRECT when
 * set), or -1 when the MACs could not be written. */
static __always_inline long fib_xmit(struct __sk_buff *skb, const struct bpf_fib_lookup *fib, long ret,
				     union fib_xmit_room *room)
{
	if (ret == BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* The lookup left the next hop (the gateway, or the
		 * destination on a shared link) in ipv4_dst. */
		room->nh = (struct bpf_redir_neigh){ .nh_family = AF_INET, .ipv4_nh = fib->ipv4_dst };
		return bpf_redirect_neigh(fib->ifindex, &room->nh, sizeof(room->nh), 0);
	}
	__builtin_memcpy(room->macs, fib->dmac, ETH_ALEN);
	__builtin_memcpy(room->macs + ETH_ALEN, fib->smac, ETH_ALEN);
	if (bpf_skb_store_bytes(skb, 0, room->macs, sizeof(room->macs), 0) < 0)
		return -1;
	return bpf_redirect(fib->ifindex, 0);
}

/* fib_send is fib_redirect without the hop: for a packet this node built
 * itself (an encapsulation's outer header). */
static __always_inline int fib_send(struct __sk_buff *skb, struct pkt *p, struct bpf_fib_lookup *fib, long ret, __u32 reason)
{
	{
		/* Scoped, so that its stack is free again for drop() and
		 * done(): the pod and uplink programs have none to spare
		 * (room for the whole function cost them 8 bytes, over the
		 * limit). */
		union fib_xmit_room room;

		ret = fib_xmit(skb, fib, ret, &room);
	}
	if (ret < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	if (ret != TC_ACT_REDIRECT)
		return drop(skb, p, SHUNT_REASON_REDIRECT_FAILED);
	done(skb, p, FLOW_FORWARDED, reason);
	return TC_ACT_REDIRECT;
}

/* fib_redirect sends the packet to the next hop a successful route lookup
 * (ret: SUCCESS or NO_NEIGH) found: one hop (TTL), then the next hop's
 * MAC written and the packet redirected (bpf_redirect), or, when the next
 * hop's MAC is not known yet, handed to bpf_redirect_neigh, which
 * resolves it as the stack does. The outcome is counted and reported as
 * reason. Returns the program's verdict. */
static __always_inline int fib_redirect(struct __sk_buff *skb, struct pkt *p, struct bpf_fib_lookup *fib, long ret, __u32 reason)
{
	int verdict = forward_hop(skb, p);

	if (verdict >= 0)
		return verdict;
	return fib_send(skb, p, fib, ret, reason);
}

/* to_node_routed sends a packet for a pod of another node out of cfg's
 * underlay interface, routed: the route lookup of the node's namespace
 * (as the stack would forward it, from the pod's veth) names the next hop;
 * one hop (TTL), then the next hop's MAC written and the packet redirected
 * (bpf_redirect), or, when the next hop's MAC is not known yet, handed to
 * bpf_redirect_neigh, which resolves it as the stack does. A lookup that
 * finds no route out of the underlay (no route, an unreachable or
 * blackhole one, a packet over the route's MTU, another interface) hands
 * the packet to the stack untouched, counted as fib-lookup-failed: the
 * stack then answers it (ICMP unreachable, fragmentation needed) or routes
 * it as configured. Returns the program's verdict; the outcome is counted
 * and reported. */
static __always_inline int to_node_routed(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET, .l4_protocol = p->f.proto, .sport = p->f.sport, .dport = p->f.dport,
		.ifindex = skb->ingress_ifindex, .ipv4_src = p->f.saddr, .ipv4_dst = p->f.daddr,
	};
	__u8 tos = 0;
	long ret;

	bpf_skb_load_bytes(skb, IP_TOS_OFF, &tos, sizeof(tos));
	fib.tos = tos;
	/* tot_len stays 0: the helper then checks the packet against the
	 * route's MTU itself, knowing a GSO packet leaves as segments. */
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if ((ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH) || fib.ifindex != cfg->native_ifindex) {
		done(skb, p, FLOW_FORWARDED, SHUNT_REASON_FIB_LOOKUP_FAILED);
		return TC_ACT_OK;
	}
	return fib_redirect(skb, p, &fib, ret, SHUNT_REASON_FORWARDED);
}

#endif
