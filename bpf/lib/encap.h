/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The overlay between nodes: a packet for a pod of another node leaves
 * through the node's collect-metadata VXLAN device, which builds the outer
 * headers from the tunnel key set here. The sender's identity rides in the
 * VNI, so the receiving node judges its ingress policy with no lookup
 * elsewhere. The one encapsulation helper: every sender calls it; and the
 * answer to a packet too big for the tunnel (ICMP fragmentation needed),
 * since pods' interfaces leave room for the encapsulation but a pod may
 * raise its own MTU. */
#ifndef SHUNT_LIB_ENCAP_H
#define SHUNT_LIB_ENCAP_H

#include "common.h"
#include "pkt.h"
#include "forward.h"
#include "icmp.h"

#define TUNNEL_TTL 64
#define VNI_LIMIT (1U << 24) /* a VNI has 24 bits */

/* tunnel_identity_ok says whether an identity can be a pod's on the wire:
 * it fits a VNI (so every pod identity does) and is a pod's, not a reserved
 * or CIDR identity, which no node would send. */
static __always_inline bool tunnel_identity_ok(__u32 identity)
{
	return identity >= SHUNT_ID_FIRST_POD && identity < VNI_LIMIT;
}

/* encap_to_node sends the packet to the node whose underlay address is
 * tunnel_ip4 (network byte order) through cfg's tunnel device, the VNI
 * carrying src_identity. Returns 0 when the redirect is set (the program
 * returns TC_ACT_REDIRECT), else the drop reason. */
static __always_inline __u32 encap_to_node(struct __sk_buff *skb, const volatile struct shunt_config *cfg,
					   __u32 tunnel_ip4, __u32 src_identity)
{
	struct bpf_tunnel_key key = {
		.tunnel_id = src_identity,
		.remote_ipv4 = bpf_ntohl(tunnel_ip4), /* the helper wants host order */
		.tunnel_ttl = TUNNEL_TTL,
	};

	if (!tunnel_identity_ok(src_identity))
		return SHUNT_REASON_TUNNEL_KEY_FAILED;
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), 0) < 0)
		return SHUNT_REASON_TUNNEL_KEY_FAILED;
	if (bpf_redirect(cfg->tunnel_ifindex, 0) != TC_ACT_REDIRECT)
		return SHUNT_REASON_REDIRECT_FAILED;
	return 0;
}

/* encap_too_big says whether the packet must not go into the tunnel but be
 * answered with ICMP fragmentation needed instead, as a router would answer
 * it (ip_forward): it has DF set and does not fit the tunnel device's MTU,
 * the underlay's less the encapsulation (EnsureVXLAN sets it), so that
 * encapsulated it would not fit the underlay either: fragmented outside
 * (the outer header has no DF), or, where the underlay drops fragments,
 * lost, and either way its sender would never learn the path's MTU. *mtu
 * is set to the device's MTU, the next-hop MTU the answer gives.
 * bpf_check_mtu rather than a length here: it judges a GSO packet (a pod's
 * TCP sends up to 64 KiB at once) by the segments it will be cut into, as
 * ip_forward does (skb_gso_validate_network_len), knowing their L4 header
 * length, which a program cannot read (gso_type), and it reads the
 * device's MTU when the packet passes, so an MTU changed on the device
 * holds at once. Never answered (they go on as before): a packet whose TTL
 * runs out here (the hop answers time exceeded first, as ip_forward does),
 * a non-first fragment, an ICMP error (RFC 1122 3.2.2: no error about an
 * error), and a packet the helper cannot judge (it failed). */
static __always_inline bool encap_too_big(struct __sk_buff *skb, const volatile struct shunt_config *cfg, __u32 *mtu)
{
	struct iphdr ip;
	__u32 dev_mtu = 0;
	__u8 icmp_type;
	long ret;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return false;
	if (!(ip.frag_off & bpf_htons(IP_DF)) || (ip.frag_off & bpf_htons(IP_OFFSET)) || ip.ttl <= 1)
		return false;
	ret = bpf_check_mtu(skb, cfg->tunnel_ifindex, &dev_mtu, 0, BPF_MTU_CHK_SEGS);
	if (ret != BPF_MTU_CHK_RET_FRAG_NEEDED && ret != BPF_MTU_CHK_RET_SEGS_TOOBIG)
		return false;
	if (ip.protocol == IPPROTO_ICMP &&
	    (bpf_skb_load_bytes(skb, ETH_HLEN + ip.ihl * 4, &icmp_type, sizeof(icmp_type)) < 0 || icmp_is_error(icmp_type)))
		return false;
	*mtu = dev_mtu;
	return true;
}

/* encap_answer_too_big answers a packet from a pod that encap_too_big kept
 * out of the tunnel: it becomes ICMP fragmentation needed with next-hop MTU
 * mtu, from cfg's node address on the pod network (the pod's gateway, the
 * source the host stack would answer from) and goes back into the pod it
 * came from, whose host veth the program runs on, the way deliveries to
 * local pods go. The packet itself is not sent: it is counted and reported
 * dropped as frag-needed, at its own length. Returns the program's
 * verdict. */
static __always_inline int encap_answer_too_big(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg, __u32 mtu)
{
	__u32 len = skb->len, ifindex = skb->ifindex;

	if (icmp4_frag_needed(skb, cfg->node_ip4, mtu, p->orig_daddr, p->orig_dport) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	if (redirect_into_pod(ifindex, cfg->fwd_mode) != TC_ACT_REDIRECT)
		return drop(skb, p, SHUNT_REASON_REDIRECT_FAILED);
	done_len(skb, p, FLOW_DROPPED, SHUNT_REASON_FRAG_NEEDED, len);
	return TC_ACT_REDIRECT;
}

#endif
