/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* DSR (direct server return) for flows from outside, with native routing
 * or the VXLAN overlay: the wire format and its two ends. lib/nodeport.h
 * decides which flows go this way and records them.
 *
 * The ingress node keeps the client's address, translates the destination
 * to the backend (client -> backend, as for a backend of its own) and
 * carries the packet to the backend's node in IPIP built here with
 * bpf_skb_adjust_room (the kernel needs no IPIP device): an outer IPv4
 * header from this node's underlay address to the backend's node's, with
 * one IP option naming the service address and port the client dialled
 * (Cilium's DSR option layout: type 0x9a, length 8, port, address). The
 * backend's node strips the outer header (dsr_decap), records the flow
 * (its reply entry gives the reply the service address and port as its
 * source, as for a backend of the ingress node) and hands the packet to
 * the pod: the reply leaves from the backend's node straight to the
 * client, never crossing the ingress node.
 *
 * The service address rides in the outer header rather than the inner,
 * so the backend's node removes one block of 28 bytes and the pod gets
 * the packet as the client sent it, translated. The cost: 28 bytes per
 * packet on the way in (replies carry none). A GSO packet is cut into
 * smaller segments (adjust_room lowers its gso_size by the 28 bytes); a
 * single packet that no longer fits is answered with ICMP fragmentation
 * needed (DF) or dropped, counted as dsr-too-big (dsr_too_big).
 *
 * With the overlay the same IPIP goes between the same underlay
 * addresses, out of the uplink, never into the VXLAN device: the
 * underlay that carries VXLAN's UDP carries IPIP between the nodes just
 * as well, and every node takes DSR packets at its underlay address
 * whatever its routing. Inside VXLAN there is no room for the service:
 * the VNI's 24 bits carry the sender's identity (lib/encap.h), and
 * VXLAN-GBP's group has 16, so the address and port would need an inner
 * header of their own (IPIP inside VXLAN: 50 + 28 bytes) for nothing the
 * underlay cannot carry directly. What the overlay changes is the room
 * left: its pods have the VXLAN device's MTU (the underlay's less 50),
 * less than the 28 bytes IPIP takes from the underlay's, so a packet for
 * a pod must fit the tunnel device's MTU (the backend's pod MTU, every
 * node's the same) as well as the uplink's less 28 (dsr_room). Replies
 * leave the backend's node by its uplink, as with native routing: a
 * client outside is no pod of any node, so the overlay never takes them.
 *
 * A router between the nodes that cannot carry a DSR packet answers the
 * ingress node (the outer source) with fragmentation needed quoting the
 * IPIP packet: the ingress node sends the client fragmentation needed
 * from the service, naming that MTU less the 28 bytes, about the client's
 * packet as it sent it (lib/nodeport.h: dsr_path_error), so the client's
 * path MTU covers the way between the nodes too.
 *
 * An ICMP error a router sends about a reply (fragmentation needed on
 * the way to the client) is addressed to the service address, so it
 * reaches the ingress node, which holds the flow's client entry: it goes
 * to the backend's node in the same IPIP, untranslated, the option naming
 * the service, and is translated there for the pod (lib/nodeport.h:
 * nodeport_from_dsr). */
#ifndef SHUNT_LIB_DSR_H
#define SHUNT_LIB_DSR_H

#include "common.h"
#include "pkt.h"
#include "native.h"
#include "icmp.h"

#ifndef IPPROTO_IPIP
#define IPPROTO_IPIP 4
#endif
/* Linux 6.3's flag (bpf_skb_adjust_room), not in the vendored UAPI header:
 * the removed outer header was IPv4, so the packet is no longer an
 * encapsulated one (GSO type, inner offsets). */
#define DSR_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)

/* Set from Go before the object is loaded (kernel fallback
 * dsr-no-gso-decap): the kernel has no BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (before
 * Linux 6.3). Such a kernel takes the outer header off a single packet
 * without the flag, but a GSO packet would keep its encapsulation's GSO
 * type and be cut wrongly: it is dropped, counted dsr-gso-decap. */
volatile const __u32 DSR_NO_GSO_DECAP = 0;

/* dsr_decap's answer for a GSO packet that the kernel cannot decapsulate. */
#define DSR_DECAP_GSO_UNSUPPORTED (-2)
/* dsr_decap's answer for a DSR packet whose outer source is no node of the
 * cluster (shunt_dsr_nodes). */
#define DSR_DECAP_UNKNOWN_NODE (-3)

/* The cluster's other nodes' underlay addresses (bpf/include/shunt.h),
 * written by the agent from the Node objects. The backend's node takes
 * DSR's IPIP only from them: the inner packet is delivered to a pod with
 * the client's source kept and judged by the pod's ingress policy as that
 * client, and the ingress node is where a load balancer address's source
 * ranges were checked, so a host of the underlay that could send IPIP
 * itself would choose the source a pod sees and skip those checks. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct dsr_node_key);
	__type(value, struct dsr_node_value);
	__uint(max_entries, 8192); /* Kubernetes' largest supported cluster is 5000 nodes */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_dsr_nodes SEC(".maps");

#define DSR_OPT_TYPE 0x9a /* copied, class 0, number 26: Cilium's */
#define DSR_OUTER_TTL 64

struct dsr_opt {
	__u8 type;
	__u8 len;
	__u16 port; /* network byte order */
	__u32 addr; /* network byte order */
};

struct dsr_outer {
	struct iphdr ip;
	struct dsr_opt opt;
};

#define DSR_OUTER_LEN ((__u32)sizeof(struct dsr_outer))

/* dsr_wanted says whether a new flow of proto to a backend on another
 * node, of a service with svc_flags, goes by DSR: the node routes to other
 * nodes' pods (natively or by the overlay: either way the IPIP leaves by
 * the uplink), and the Service's forwarding mode asks for it, or, without
 * one, the node's mode does (hybrid: TCP only). */
static __always_inline bool dsr_wanted(const volatile struct shunt_config *cfg, __u8 proto, __u16 svc_flags)
{
	if (!cfg->nodeport_dsr_ip4 || (!cfg->native_ifindex && !cfg->tunnel_ifindex) || (svc_flags & SERVICE_F_FWD_SNAT))
		return false;
	if ((svc_flags & SERVICE_F_FWD_DSR) || cfg->nodeport_mode == NODEPORT_MODE_DSR)
		return true;
	return cfg->nodeport_mode == NODEPORT_MODE_HYBRID && proto == IPPROTO_TCP;
}

/* dsr_room is the largest packet (IPv4 length) of the client's that
 * reaches a backend on another node by DSR: the uplink's MTU less the
 * outer header, and with the overlay no more than the tunnel device's MTU,
 * which its pods have (a larger one would be dropped at the pod's veth
 * once decapsulated). The MTUs are the devices' when the packet passes
 * (bpf_check_mtu), so a changed MTU holds at once. 0 when the uplink
 * cannot be read. Inlined: as a call of its own in dsr_clamp_mss the
 * verifier went past its million instructions on shunt_from_pod. */
static __always_inline __u32 dsr_room(struct __sk_buff *skb, __u32 uplink_ifindex, __u32 tunnel_ifindex)
{
	__u32 mtu = 0, tunnel_mtu = 0;

	if (bpf_check_mtu(skb, uplink_ifindex, &mtu, 0, 0) < 0 || mtu <= DSR_OUTER_LEN)
		return 0;
	mtu -= DSR_OUTER_LEN;
	if (tunnel_ifindex && bpf_check_mtu(skb, tunnel_ifindex, &tunnel_mtu, 0, 0) >= 0 && tunnel_mtu && tunnel_mtu < mtu)
		mtu = tunnel_mtu;
	return mtu;
}

/* dsr_too_big says whether the packet would not fit on its way to the
 * backend (dsr_room): a single packet only (a GSO packet's segments are
 * cut 28 bytes smaller by the encapsulation, and with the overlay they
 * are the client's, no larger than the MSS the pod announced). *mtu is
 * set to the room, the next-hop MTU to answer with. */
static __always_inline bool dsr_too_big(struct __sk_buff *skb, const volatile struct shunt_config *cfg, __u32 *mtu)
{
	__u32 room = dsr_room(skb, cfg->uplink_ifindex, cfg->tunnel_ifindex);

	if (!room || skb->gso_size || skb->len <= ETH_HLEN + room)
		return false;
	*mtu = room;
	return true;
}

/* dsr_answer_too_big answers a client's packet dsr_too_big kept back: with
 * DF, ICMP fragmentation needed from the node's underlay address, quoting
 * the packet as the client sent it (not translated yet), sent back out of
 * the uplink to the hop it came from; without DF it is dropped as
 * dsr-too-big. Returns the verdict. */
static __always_inline int dsr_answer_too_big(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg, __u32 mtu)
{
	__u32 len = skb->len;
	__u16 frag_off = 0;

	bpf_skb_load_bytes(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, frag_off), &frag_off, sizeof(frag_off));
	if (!(frag_off & bpf_htons(IP_DF)))
		return drop(skb, p, SHUNT_REASON_DSR_TOO_BIG);
	if (icmp4_frag_needed(skb, cfg->nodeport_dsr_ip4, mtu, p->f.daddr, p->f.dport) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	if (bpf_redirect(cfg->uplink_ifindex, 0) != TC_ACT_REDIRECT)
		return drop(skb, p, SHUNT_REASON_REDIRECT_FAILED);
	done_len(skb, p, FLOW_DROPPED, SHUNT_REASON_FRAG_NEEDED, len);
	return TC_ACT_REDIRECT;
}

/* dsr_encap puts the outer header in front of the (translated) packet:
 * from cfg's underlay address to node (the backend's node's underlay
 * address), the option naming svc_addr:svc_port. Returns 0, or -1 when a
 * helper failed. */
static __always_inline int dsr_encap(struct __sk_buff *skb, const volatile struct shunt_config *cfg, __u32 node,
				     __u32 svc_addr, __u16 svc_port)
{
	struct iphdr inner;
	struct dsr_outer o = {};
	__s64 sum;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &inner, sizeof(inner)) < 0)
		return -1;
	o.ip.version = 4;
	o.ip.ihl = DSR_OUTER_LEN / 4;
	o.ip.tos = inner.tos;
	o.ip.tot_len = bpf_htons(bpf_ntohs(inner.tot_len) + DSR_OUTER_LEN);
	o.ip.frag_off = bpf_htons(IP_DF);
	o.ip.ttl = DSR_OUTER_TTL;
	o.ip.protocol = IPPROTO_IPIP;
	o.ip.saddr = cfg->nodeport_dsr_ip4;
	o.ip.daddr = node;
	o.opt.type = DSR_OPT_TYPE;
	o.opt.len = sizeof(o.opt);
	o.opt.port = svc_port;
	o.opt.addr = svc_addr;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&o, sizeof(o), 0);
	if (sum < 0)
		return -1;
	o.ip.check = csum_fold(sum);
	if (bpf_skb_adjust_room(skb, DSR_OUTER_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN, &o, sizeof(o), 0) < 0 ? -1 : 0;
}

/* dsr_send sends an encapsulated packet to its outer destination out of
 * cfg's uplink (a route lookup as for a packet the node sends). Returns
 * the verdict, counted as dsr-encap. */
static __always_inline int dsr_send(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg, __u32 node)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET, .l4_protocol = IPPROTO_IPIP, .ifindex = cfg->uplink_ifindex,
		.ipv4_src = cfg->nodeport_dsr_ip4, .ipv4_dst = node,
	};
	long ret = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT);

	/* Out of the uplink only: with the overlay too the other node's
	 * underlay address is reached there, never through the VXLAN device
	 * (which would carry IPIP in VXLAN, 78 bytes more). */
	if ((ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH) || fib.ifindex != cfg->uplink_ifindex)
		return drop(skb, p, SHUNT_REASON_FIB_LOOKUP_FAILED);
	return fib_send(skb, p, &fib, ret, SHUNT_REASON_DSR_ENCAP);
}

/* dsr_decap takes a DSR packet arriving for cfg's underlay address: the
 * outer header is checked and removed, *svc_addr and *svc_port set from
 * its option. Returns 1 when decapsulated, 0 when the packet is no DSR
 * packet for this node (left as it is), -1 when the removal failed,
 * DSR_DECAP_GSO_UNSUPPORTED for a GSO packet on a kernel before 6.3,
 * DSR_DECAP_UNKNOWN_NODE (the packet left as it is, *outer_src set) when
 * its outer source is no node of the cluster. */
static __always_inline int dsr_decap(struct __sk_buff *skb, const volatile struct shunt_config *cfg, __u32 *svc_addr,
				     __u16 *svc_port, __u32 *outer_src)
{
	struct dsr_outer o;
	struct dsr_node_key node = {};

	if (!cfg->nodeport_dsr_ip4 || skb->protocol != bpf_htons(ETH_P_IP) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, &o, sizeof(o)) < 0)
		return 0;
	if (o.ip.protocol != IPPROTO_IPIP || o.ip.daddr != cfg->nodeport_dsr_ip4 || o.ip.ihl != DSR_OUTER_LEN / 4 ||
	    o.opt.type != DSR_OPT_TYPE || o.opt.len != sizeof(o.opt) || (o.ip.frag_off & bpf_htons(IP_MF | IP_OFFSET)))
		return 0;
	node.addr = o.ip.saddr;
	if (!bpf_map_lookup_elem(&shunt_dsr_nodes, &node)) {
		*outer_src = o.ip.saddr;
		return DSR_DECAP_UNKNOWN_NODE;
	}
	*svc_addr = o.opt.addr;
	*svc_port = o.opt.port;
	if (!DSR_NO_GSO_DECAP)
		return bpf_skb_adjust_room(skb, -(__s32)DSR_OUTER_LEN, BPF_ADJ_ROOM_MAC, DSR_ADJ_ROOM_DECAP_L3_IPV4) < 0 ? -1 : 1;
	/* Before Linux 6.3 the flag is refused: a packet that is not GSO
	 * needs none. */
	if (skb->gso_size)
		return DSR_DECAP_GSO_UNSUPPORTED;
	return bpf_skb_adjust_room(skb, -(__s32)DSR_OUTER_LEN, BPF_ADJ_ROOM_MAC, 0) < 0 ? -1 : 1;
}

#endif
