/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The overlay between nodes: a packet for a pod of another node is
 * encapsulated in VXLAN (RFC 7348) to the node hosting it. The sender's
 * identity rides in the VNI, so the receiving node judges its ingress
 * policy with no lookup elsewhere. The one encapsulation helper: every
 * sender calls it; and the answer to a packet too big for the tunnel (ICMP
 * fragmentation needed), since pods' interfaces leave room for the
 * encapsulation but a pod may raise its own MTU.
 *
 * Where it is built: here, in BPF, and sent out of the underlay interface
 * (encap_in_bpf), or by the node's collect-metadata VXLAN device from the
 * tunnel key set here. BPF first: the packet skips the device's transmit
 * path (its route lookup, the node's own UDP/IP output and netfilter
 * hooks, the per-packet tunnel metadata), as shunt_from_overlay_wire skips
 * its receive path. Whatever BPF does not build goes to the device, which
 * has always been able to send it: a packet whose segments would not fit
 * (the device fragments the outer header), a UDP GSO packet, a packet
 * already carrying an encapsulation, one whose way to the other node is
 * not out of the underlay interface, a kernel without the helper flags
 * used here, and every packet with shuntd --overlay-encap-in-device. */
#ifndef SHUNT_LIB_ENCAP_H
#define SHUNT_LIB_ENCAP_H

#include "common.h"
#include "pkt.h"
#include "forward.h"
#include "icmp.h"
#include "native.h"

#define TUNNEL_TTL 64
#define VNI_LIMIT (1U << 24) /* a VNI has 24 bits */

/* What encapsulation puts between the outer Ethernet header and a pod's
 * packet: outer IPv4 (no options), UDP, VXLAN and the inner Ethernet
 * header. VXLANOverhead in Go. */
struct vxlan_outer {
	struct iphdr ip;
	struct udphdr udp;
	__be32 flags; /* I (0x08) in the first byte, the rest reserved */
	__be32 vni;   /* the VNI in the first 24 bits, 8 reserved */
	struct ethhdr eth;
} __attribute__((packed));

#define VXLAN_OUTER_LEN ((__u32)sizeof(struct vxlan_outer))
#define VXLAN_FLAGS_VNI bpf_htonl(0x08000000)

/* The outer UDP source port, from the inner flow's hash as Linux VXLAN
 * chooses it (udp_flow_src_port): one flow keeps one outer tuple, and
 * flows spread over the underlay's ECMP paths and the receiver's queues.
 * Linux's default local port range, which the device uses when none is
 * configured. */
#define VXLAN_SPORT_MIN 32768
#define VXLAN_SPORT_RANGE (61000 - 32768)

#define INET_ECN_ECT_0 2

/* The flags that make bpf_skb_adjust_room leave the packet as the device
 * would: encapsulated (skb->encapsulation, inner offsets) in UDP over
 * IPv4 with an inner Ethernet header, so that a GSO packet is cut into
 * VXLAN segments where it leaves and checksum offload finds the inner
 * header. FIXED_GSO: the segments keep their size, which fits once
 * encapsulated (checked first: by encap_in_bpf, or by its caller). */
#define VXLAN_ADJ_ROOM_FLAGS                                                                                           \
	(BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |                    \
	 BPF_F_ADJ_ROOM_ENCAP_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN))

/* Per CPU room for what encapsulating needs beside the packet: the
 * route lookup, the headers encap_in_bpf builds, fib_xmit's helper
 * arguments, the device's tunnel key. The programs that encapsulate have
 * little stack left (the pod and uplink programs' are nearly full). Every
 * field is written before it is read. */
struct encap_scratch {
	struct bpf_fib_lookup fib;
	struct bpf_tunnel_key key;
	union fib_xmit_room xmit;
	struct iphdr inner;
	__u32 mtu;
	struct vxlan_outer outer;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct encap_scratch);
	__uint(max_entries, 1);
} shunt_encap_scratch SEC(".maps");

/* What encap_too_big found out about a packet's size. */
#define ENCAP_SIZE_UNJUDGED 0 /* not found to fit: encap_in_bpf checks it itself */
#define ENCAP_SIZE_FITS 1     /* fits the tunnel device's MTU, every segment of it */
#define ENCAP_SIZE_TOO_BIG 2  /* to be answered (encap_answer_too_big), not sent */

/* How encap_in_bpf ends. */
#define ENCAP_SENT 0	  /* encapsulated, the redirect set */
#define ENCAP_TO_DEVICE 1 /* left as it was, for the VXLAN device */
#define ENCAP_FAILED (-1) /* a helper failed after the packet changed: it is dropped */

/* encap_in_bpf encapsulates the packet in VXLAN with vni to the node whose
 * underlay address is tunnel_ip4, from cfg's tunnel endpoint, and sends it
 * out of the underlay interface to the next hop the node's routes give
 * (bpf_fib_lookup, as the device's own output would route it; its MAC
 * written, or bpf_redirect_neigh when not known yet). The outer header is
 * the device's: TTL 64, no DF (a router may fragment it, as the
 * device's), the inner ECN bits (CE as ECT(0), RFC 6040), a source port
 * from the inner flow's hash. The outer UDP checksum is 0, which IPv4
 * allows and every VXLAN receiver takes (Linux requires one only over
 * IPv6): the inner packet's own checksums cover what the pod receives, as
 * in Katran's encapsulation. Returns ENCAP_SENT, ENCAP_TO_DEVICE
 * (untouched: see the top of this file) or ENCAP_FAILED. s is the CPU's
 * shunt_encap_scratch. fits: the caller has found the packet fits the
 * tunnel device's MTU, every segment of it (encap_too_big said
 * ENCAP_SIZE_FITS), so it is not checked again. */
static __always_inline int encap_in_bpf(struct __sk_buff *skb, const volatile struct shunt_config *cfg,
					struct encap_scratch *s, __u32 tunnel_ip4, __u32 vni, bool fits)
{
	long ret;

	if (!cfg->tunnel_uplink_ifindex)
		return ENCAP_TO_DEVICE;
	if (bpf_skb_load_bytes(skb, 0, &s->outer.eth, sizeof(s->outer.eth)) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, &s->inner, sizeof(s->inner)) < 0)
		return ENCAP_TO_DEVICE;
	/* A GSO packet of anything but TCP (UDP_SEGMENT) stays with the
	 * device: adjust_room makes tunnel segments of TCP's only. */
	if (skb->gso_size && s->inner.protocol != IPPROTO_TCP)
		return ENCAP_TO_DEVICE;
	/* It fits the tunnel device's MTU (the underlay's less the
	 * encapsulation), every segment of a GSO packet too: so it fits the
	 * underlay once encapsulated. A bigger one goes to the device, which
	 * fragments the outer header. Checked here unless the caller did (a
	 * pod's DF packet, judged for fragmentation needed): the same check,
	 * and nothing since has changed the packet's length. */
	if (!fits) {
		s->mtu = 0;
		if (bpf_check_mtu(skb, cfg->tunnel_ifindex, &s->mtu, 0, BPF_MTU_CHK_SEGS) != BPF_MTU_CHK_RET_SUCCESS)
			return ENCAP_TO_DEVICE;
	}
	s->fib = (struct bpf_fib_lookup){
		.family = AF_INET, .l4_protocol = IPPROTO_UDP, .dport = cfg->tunnel_port,
		.ifindex = cfg->tunnel_uplink_ifindex, .ipv4_src = cfg->tunnel_local_ip4, .ipv4_dst = tunnel_ip4,
	};
	ret = bpf_fib_lookup(skb, &s->fib, sizeof(s->fib), BPF_FIB_LOOKUP_OUTPUT);
	if ((ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH) ||
	    s->fib.ifindex != cfg->tunnel_uplink_ifindex)
		return ENCAP_TO_DEVICE;

	struct vxlan_outer *o = &s->outer;
	__u16 payload = bpf_ntohs(s->inner.tot_len); /* a GSO packet's outer lengths are rewritten per segment */
	__u8 ecn = s->inner.tos & INET_ECN_MASK;
	__u32 hash = bpf_get_hash_recalc(skb);

	o->ip.version = 4;
	o->ip.ihl = 5;
	o->ip.tos = ecn == INET_ECN_CE ? INET_ECN_ECT_0 : ecn;
	o->ip.tot_len = bpf_htons(payload + VXLAN_OUTER_LEN);
	o->ip.id = (__u16)bpf_get_prandom_u32(); /* no DF: a fragment's datagram is told by it */
	o->ip.frag_off = 0;
	o->ip.ttl = TUNNEL_TTL;
	o->ip.protocol = IPPROTO_UDP;
	o->ip.check = 0;
	o->ip.saddr = cfg->tunnel_local_ip4;
	o->ip.daddr = tunnel_ip4;
	o->ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)(void *)&o->ip, sizeof(o->ip), 0));
	o->udp.source = bpf_htons(VXLAN_SPORT_MIN + (__u16)(((__u64)hash * VXLAN_SPORT_RANGE) >> 32));
	o->udp.dest = cfg->tunnel_port;
	o->udp.len = bpf_htons(payload + VXLAN_OUTER_LEN - sizeof(struct iphdr));
	o->udp.check = 0;
	o->flags = VXLAN_FLAGS_VNI;
	o->vni = bpf_htonl(vni << 8);
	/* It fails with the packet unchanged (a kernel without these flags,
	 * a packet already encapsulated): the device sends it. */
	if (bpf_skb_adjust_room(skb, VXLAN_OUTER_LEN, BPF_ADJ_ROOM_MAC, VXLAN_ADJ_ROOM_FLAGS) < 0)
		return ENCAP_TO_DEVICE;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, o, sizeof(*o), 0) < 0)
		return ENCAP_FAILED;
	/* fib_send's last step; not fib_send, which reports through a
	 * struct pkt, and its room in s: no stack left for it. */
	return fib_xmit(skb, &s->fib, ret, &s->xmit) == TC_ACT_REDIRECT ? ENCAP_SENT : ENCAP_FAILED;
}

/* A pod's identity is what a VNI carries (pod_identity: a reserved or CIDR
 * identity no node sends), and every one fits. */
_Static_assert(SHUNT_ID_FIRST_CIDR <= VNI_LIMIT, "every pod identity fits a VNI");

/* encap_to_node sends the packet to the node whose underlay address is
 * tunnel_ip4 (network byte order), the VNI carrying vni (a pod's identity,
 * or the remote-node identity for the node's own traffic): encapsulated
 * here (encap_in_bpf), else through cfg's tunnel device. fits: as
 * encap_in_bpf's. Returns 0 when the redirect is set (the program returns
 * TC_ACT_REDIRECT), else the drop reason. */
static __always_inline __u32 encap_to_node(struct __sk_buff *skb, const volatile struct shunt_config *cfg,
					   __u32 tunnel_ip4, __u32 vni, bool fits)
{
	__u32 zero = 0;
	struct encap_scratch *s = bpf_map_lookup_elem(&shunt_encap_scratch, &zero);

	if (!s)
		return SHUNT_REASON_TUNNEL_KEY_FAILED;
	int sent = encap_in_bpf(skb, cfg, s, tunnel_ip4, vni, fits);
	if (sent == ENCAP_SENT)
		return 0;
	if (sent == ENCAP_FAILED)
		return SHUNT_REASON_TUNNEL_KEY_FAILED;
	s->key = (struct bpf_tunnel_key){
		.tunnel_id = vni,
		.remote_ipv4 = bpf_ntohl(tunnel_ip4), /* the helper wants host order */
		.tunnel_ttl = TUNNEL_TTL,
	};
	if (bpf_skb_set_tunnel_key(skb, &s->key, sizeof(s->key), 0) < 0)
		return SHUNT_REASON_TUNNEL_KEY_FAILED;
	if (bpf_redirect(cfg->tunnel_ifindex, 0) != TC_ACT_REDIRECT)
		return SHUNT_REASON_REDIRECT_FAILED;
	return 0;
}

/* encap_too_big says whether the packet must not go into the tunnel but be
 * answered with ICMP fragmentation needed instead (ENCAP_SIZE_TOO_BIG),
 * as a router would answer it (ip_forward): it has DF set and does not fit
 * the tunnel device's MTU, the underlay's less the encapsulation
 * (EnsureVXLAN sets it), so that encapsulated it would not fit the
 * underlay either: fragmented outside (the outer header has no DF), or,
 * where the underlay drops fragments, lost, and either way its sender
 * would never learn the path's MTU. *mtu is set to the device's MTU, the
 * next-hop MTU the answer gives.
 * bpf_check_mtu rather than a length here: it judges a GSO packet (a pod's
 * TCP sends up to 64 KiB at once) by the segments it will be cut into, as
 * ip_forward does (skb_gso_validate_network_len), knowing their L4 header
 * length, which a program cannot read (gso_type), and it reads the
 * device's MTU when the packet passes, so an MTU changed on the device
 * holds at once. Never answered (they go on as before): a packet whose TTL
 * runs out here (the hop answers time exceeded first, as ip_forward does),
 * a non-first fragment, an ICMP error (RFC 1122 3.2.2: no error about an
 * error), and a packet the helper cannot judge (it failed). The check is
 * encap_in_bpf's own: ENCAP_SIZE_FITS when it passed, so that a pod's DF
 * packet is checked once, else ENCAP_SIZE_UNJUDGED (not checked, or not
 * fitting but not answered), which encap_in_bpf checks again. */
static __always_inline int encap_too_big(struct __sk_buff *skb, const volatile struct shunt_config *cfg, __u32 *mtu)
{
	struct iphdr ip;
	__u32 dev_mtu = 0;
	__u8 icmp_type;
	long ret;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return ENCAP_SIZE_UNJUDGED;
	if (!(ip.frag_off & bpf_htons(IP_DF)) || (ip.frag_off & bpf_htons(IP_OFFSET)) || ip.ttl <= 1)
		return ENCAP_SIZE_UNJUDGED;
	ret = bpf_check_mtu(skb, cfg->tunnel_ifindex, &dev_mtu, 0, BPF_MTU_CHK_SEGS);
	if (ret == BPF_MTU_CHK_RET_SUCCESS)
		return ENCAP_SIZE_FITS;
	if (ret != BPF_MTU_CHK_RET_FRAG_NEEDED && ret != BPF_MTU_CHK_RET_SEGS_TOOBIG)
		return ENCAP_SIZE_UNJUDGED;
	if (ip.protocol == IPPROTO_ICMP &&
	    (bpf_skb_load_bytes(skb, ETH_HLEN + ip.ihl * 4, &icmp_type, sizeof(icmp_type)) < 0 || icmp_is_error(icmp_type)))
		return ENCAP_SIZE_UNJUDGED;
	*mtu = dev_mtu;
	return ENCAP_SIZE_TOO_BIG;
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
