/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The overlay between nodes: a packet for a pod of another node leaves
 * through the node's collect-metadata VXLAN device, which builds the outer
 * headers from the tunnel key set here. The sender's identity rides in the
 * VNI, so the receiving node judges its ingress policy with no lookup
 * elsewhere. The one encapsulation helper: every sender calls it. */
#ifndef SHUNT_LIB_ENCAP_H
#define SHUNT_LIB_ENCAP_H

#include "common.h"

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

#endif
