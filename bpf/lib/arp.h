/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ARP a pod sends. A pod may only speak for its own address, as with IPv4
 * sources: the node learns the sender of an ARP request addressed to it
 * (its gateway address) on the pod's veth, so a pod claiming other
 * addresses, one per frame, fills the node's neighbour table past
 * gc_thresh3 and the whole node then fails to resolve neighbours
 * ("neighbor table overflow"). Pods' traffic itself is not diverted: each
 * pod has a route of its own and a permanent neighbour entry on its own
 * veth, and pods reach their gateway through a permanent entry too. */
#ifndef SHUNT_LIB_ARP_H
#define SHUNT_LIB_ARP_H

#include "common.h"
#include "endpoints.h"
#include "pkt.h"

/* arp_from_pod judges an ARP frame a pod sent: -1 when the frame is not
 * ARP; otherwise the verdict. The sender address must be the pod's own
 * (arriving on its veth) or 0.0.0.0, an address probe (RFC 5227) that
 * nobody learns from; the frame must be Ethernet/IPv4 ARP, the only kind
 * the node reads. */
static __always_inline int arp_from_pod(struct __sk_buff *skb, struct pkt *p)
{
	struct ethhdr eth;
	struct arp_eth_ipv4 arp;

	/* The frame's protocol, as the device read it (eth_type_trans): no
	 * helper call for the packets that are not ARP, all but a few. */
	if (skb->protocol != bpf_htons(ETH_P_ARP))
		return -1;
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0 || eth.h_proto != bpf_htons(ETH_P_ARP))
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &arp, sizeof(arp)) < 0 ||
	    arp.hdr.ar_hrd != bpf_htons(ARPHRD_ETHER) || arp.hdr.ar_pro != bpf_htons(ETH_P_IP) ||
	    arp.hdr.ar_hln != ETH_ALEN || arp.hdr.ar_pln != 4)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	/* The flow event names the claimed address and the one asked for. */
	p->f.saddr = arp.spa;
	p->f.daddr = arp.tpa;
	if (arp.spa != 0) {
		struct endpoint_info *ep = lookup_endpoint(arp.spa);

		if (!ep || ep->ifindex != skb->ifindex)
			return drop(skb, p, SHUNT_REASON_ARP_SPOOFED);
	}
	count(SHUNT_REASON_NOT_IPV4, p->dir, skb->len);
	return TC_ACT_OK;
}

#endif
