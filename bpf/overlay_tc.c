// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc program on the node's collect-metadata VXLAN device: the receiving end
 * of the overlay between nodes (the sending end is shunt_from_pod, through
 * lib/encap.h).
 *
 * shunt_from_overlay runs at ingress of the VXLAN device, on every packet
 * other nodes' pods send here, already decapsulated: the skb starts at the
 * inner Ethernet header, the outer source and the VNI are in the tunnel
 * key. The VNI is the sender's identity, which policy trusts, so a packet is
 * accepted only from the node the ipcache says hosts its inner source
 * address, and only with a pod identity (or, from that node's own address,
 * the remote-node identity). A reply from a service backend on
 * the other node gets the service address back here, where the client's
 * pod sent it to the service (the tc fallback's entries are on this node).
 * A packet for a pod of this node is judged by the pod's ingress policy,
 * tracked (its replies pass back through shunt_from_pod), and handed
 * straight to the pod as from a pod of this node. Anything else goes to the
 * host stack.
 *
 * shunt_from_overlay_wire does the same for a packet still on the wire:
 * the uplink program hands it the overlay's VXLAN packets at its first
 * look (a tail call, bpf/uplink_tc.c), and where the packet is plain (see
 * wire_takes) it takes the outer headers off itself and judges the inner
 * packet as above, so the node's stack never sees it: no outer IP and UDP
 * receive, no VXLAN device, no per-packet tunnel metadata, no second pass
 * through the receive path. Anything else it leaves as it is, for the
 * VXLAN device and shunt_from_overlay.
 */
#include "lib/common.h"
#include "lib/metrics.h"
#include "lib/endpoints.h"
#include "lib/flow_tuple.h"
#include "lib/ipv4.h"
#include "lib/pkt.h"
#include "lib/forward.h"
#include "lib/tc_nat.h"
#include "lib/policy.h"
#include "lib/flow_events.h"
#include "lib/encap.h"
#include "lib/proxy.h"
#include "lib/nodeport.h"

char __license[] SEC("license") = "Dual BSD/GPL";

volatile const struct shunt_config CONFIG = {};

/* tunnel_sender_ok says whether the node the packet came from (the outer
 * source, network byte order) hosts the inner source address, and the
 * identity it sent is one that address may carry: a pod identity, or the
 * remote-node identity for the node's own address (its host's traffic,
 * which a route of that node encapsulates with it). */
static __always_inline bool tunnel_sender_ok(__u32 saddr, __u32 outer_saddr, __u32 vni)
{
	/* The sending node's own underlay address, which is no pod's: its
	 * NodePort's reply to a pod of this node, as its own traffic
	 * (lib/nodeport.h). */
	if (saddr == outer_saddr)
		return vni == SHUNT_ID_REMOTE_NODE;
	struct ipcache_value *v = ipcache_lookup(saddr);

	if (!v || !v->tunnel_ip4 || v->tunnel_ip4 != outer_saddr)
		return false;
	if (pod_identity(vni))
		return true;
	return vni == SHUNT_ID_REMOTE_NODE && v->identity == SHUNT_ID_REMOTE_NODE;
}

/* from_overlay judges a packet another node sent through the overlay, once
 * decapsulated (ip: its header, parsed into p): vni is the sender's
 * identity and outer_saddr (network byte order) the sending node's
 * underlay address, from the tunnel key or the outer headers. */
static __always_inline int from_overlay(struct __sk_buff *skb, struct pkt *p, struct iphdr *ip, __u32 vni, __u32 outer_saddr)
{
	struct endpoint_info *ep;
	int verdict;

	p->src_identity = vni;
	if (!tunnel_sender_ok(p->f.saddr, outer_saddr, vni))
		return drop(skb, p, SHUNT_REASON_TUNNEL_SPOOFED);

	/* For a pod here, conntrack first, as shunt_from_pod does: a packet
	 * of a connection the service translation left alone when it began
	 * (CT_F_NO_TC_NAT) skips the translation's lookups, and policy
	 * reuses this lookup unless the translation changes the tuple. */
	struct ct_found found = {};
	bool looked = false;
	ep = lookup_endpoint(p->f.daddr);
	if (ep) {
		ct_find(&p->f, &found);
		looked = true;
	}
	if (!looked || !found.live || !(found.flags & CT_F_NO_TC_NAT)) {
		bool retargeted;

		/* A connection another node's pod (or the node) opens to a
		 * pod here that the translation left alone is recorded as
		 * such, as shunt_from_pod records its own: its packets, the
		 * pod's answers too, skip the translation's lookups, which
		 * would miss (a backend's answer gets its frontend back on the
		 * client's node, never here). */
		verdict = tc_service_nat_pkt(skb, ip, p, &retargeted);
		if (verdict >= 0)
			return verdict;
		if (retargeted) {
			ep = lookup_endpoint(p->f.daddr);
			looked = false;
		}
	}
	if (!ep) {
		/* A backend's reply to a client outside that reached a Service
		 * of this node (lib/nodeport.h). */
		verdict = nodeport_reply(skb, p, &CONFIG);
		if (verdict >= 0)
			return verdict;
		/* The node itself, or nothing of ours: the stack decides. The
		 * inner destination MAC is the sending pod's gateway on its
		 * node, not this device's, so the device took the frame as for
		 * another host, which the stack would drop unrouted: it is for
		 * this node. */
		p->dst_identity = identity_of(p->f.daddr);
		if (bpf_skb_change_type(skb, PACKET_HOST) < 0)
			return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
		done(skb, p, FLOW_FORWARDED, SHUNT_REASON_TO_STACK);
		return TC_ACT_OK;
	}
	if (!looked)
		ct_find(&p->f, &found);
	return admit_to_local_pod_found(skb, p, &CONFIG, vni, ep, &found);
}

SEC("tc")
int shunt_from_overlay(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};
	struct iphdr *ip;
	struct pkt p = { .dir = SHUNT_DIR_FROM_OVERLAY, .point = FLOW_POINT_FROM_OVERLAY };
	int verdict;

	ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) < 0)
		return drop(skb, &p, SHUNT_REASON_TUNNEL_KEY_FAILED);
	return from_overlay(skb, &p, ip, key.tunnel_id, bpf_htonl(key.remote_ipv4));
}

/* VXLAN as it arrives (RFC 7348), after the outer Ethernet header: what
 * shunt_from_overlay_wire reads before it decides. What comes off is
 * lib/encap.h's struct vxlan_outer; the outer Ethernet header stays (it
 * is the node's frame). */
struct vxlan_wire {
	struct vxlan_outer h;
	struct iphdr inner;
	__be16 ports[2]; /* the inner packet's first four L4 bytes */
} __attribute__((packed));

/* wire_nodeport_reply says whether the inner packet of w is a backend's
 * reply that this node SNATed (lib/nodeport.h): TCP or UDP to its SNAT
 * address with a reply entry. */
static __always_inline bool wire_nodeport_reply(const struct vxlan_wire *w)
{
	if (!CONFIG.nodeport_snat_ip4 || w->inner.daddr != CONFIG.nodeport_snat_ip4 ||
	    (w->inner.protocol != IPPROTO_TCP && w->inner.protocol != IPPROTO_UDP))
		return false;
	struct tc_nat_key k = { .saddr = w->inner.saddr, .daddr = w->inner.daddr, .sport = w->ports[0], .dport = w->ports[1],
				.proto = w->inner.protocol };
	struct nodeport_nat_value *v = bpf_map_lookup_elem(&shunt_nodeport_nat, &k);

	return v && v->reply;
}

/* wire_takes says whether shunt_from_overlay_wire decapsulates the VXLAN
 * packet w (read from skb) itself, setting *vni. Only a plain one, whose
 * inner packet goes straight to a pod of this node:
 * - not GSO: a GSO packet's encapsulation (its GSO type, inner offsets)
 *   stays for the kernel to undo, which GROs the inner packets as well;
 * - the outer header as the uplink saw it, its checksum right, no
 *   fragment, no ECN congestion mark (the kernel folds it into the inner
 *   header), the lengths agreeing with the packet's. The outer UDP
 *   checksum is not checked (Linux VXLAN sends one by default, and a
 *   packet from a veth carries only its pseudo-header's): as Katran's
 *   decapsulation, what the inner packet's own checksums cover is checked
 *   by the pod's stack, and the outer addresses and VNI are judged below
 *   (tunnel_sender_ok);
 * - VXLAN with the I flag alone (no GBP or other extension) and an IPv4
 *   inner packet with no options, no fragment, a TTL left;
 * - for a pod of this node, on no port the node proxy takes (lib/steer.h:
 *   a steered packet goes to the node's stack, which should see it come
 *   in through the VXLAN device, as its routes and rp_filter expect); or
 *   a backend's TCP or UDP reply to a client outside that this node SNATed
 *   to it (its reply entry in shunt_nodeport_nat: nodeport_reply sends it
 *   back out of the uplink).
 * Everything else is left to the VXLAN device, as before. */
static __always_inline bool wire_takes(struct __sk_buff *skb, struct vxlan_wire *w, __u32 *vni)
{
	if (skb->gso_size || bpf_skb_load_bytes(skb, ETH_HLEN, w, sizeof(*w)) < 0)
		return false;
	if (w->h.ip.ihl != 5 || (w->h.ip.frag_off & bpf_htons(IP_MF | IP_OFFSET)) ||
	    (w->h.ip.tos & INET_ECN_MASK) == INET_ECN_CE ||
	    csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)(void *)w, sizeof(w->h.ip), 0)) /* outer first */ ||
	    bpf_ntohs(w->h.ip.tot_len) != skb->len - ETH_HLEN ||
	    bpf_ntohs(w->h.udp.len) != skb->len - ETH_HLEN - sizeof(struct iphdr))
		return false;
	if (w->h.flags != VXLAN_FLAGS_VNI || (w->h.vni & bpf_htonl(0xff)) || w->h.eth.h_proto != bpf_htons(ETH_P_IP) ||
	    w->inner.version != 4 || w->inner.ihl != 5 || (w->inner.frag_off & bpf_htons(IP_MF | IP_OFFSET)) ||
	    w->inner.ttl <= 1)
		return false;
	*vni = bpf_ntohl(w->h.vni) >> 8;
	if (!lookup_endpoint(w->inner.daddr))
		return wire_nodeport_reply(w);
	return w->inner.protocol != IPPROTO_TCP || !steer_port(w->inner.daddr, w->ports[1]);
}

/* shunt_from_overlay_wire: the overlay's packets for this node's tunnel
 * endpoint, from the uplink program (a tail call, bpf/uplink_tc.c), still
 * encapsulated. A plain one (wire_takes) loses its outer headers here and
 * is judged as shunt_from_overlay judges it, the VNI and the outer source
 * read from the headers instead of a tunnel key; anything else goes on to
 * the stack and the VXLAN device untouched. */
SEC("tc")
int shunt_from_overlay_wire(struct __sk_buff *skb)
{
	__u32 vni, outer_saddr;
	int verdict;

	/* w in a block of its own and p declared after it: their lifetimes do
	 * not overlap, so the compiler can give them the same stack slots
	 * (this program, tail-called from the uplink's, has a stack of its
	 * own, but 6.1's verifier counts it in 32-byte frames). */
	{
		struct vxlan_wire w;

		if (!wire_takes(skb, &w, &vni))
			return TC_ACT_OK;
		outer_saddr = w.h.ip.saddr;
	}
	if (bpf_skb_adjust_room(skb, -(__s32)VXLAN_OUTER_LEN, BPF_ADJ_ROOM_MAC, 0) < 0) {
		count(SHUNT_REASON_INVALID_PACKET, SHUNT_DIR_FROM_OVERLAY, skb->len);
		return TC_ACT_SHOT;
	}
	/* The outer flow's hash, which the inner packet must not keep (the
	 * kernel clears it when it decapsulates). */
	bpf_set_hash_invalid(skb);
	struct pkt p = { .dir = SHUNT_DIR_FROM_OVERLAY, .point = FLOW_POINT_FROM_OVERLAY };
	struct iphdr *ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	return from_overlay(skb, &p, ip, vni, outer_saddr);
}

/* steered_reply_identity: the identity of a packet the node's stack sends
 * from a local pod's address (not one a pod sent: those arrive redirected
 * from its veth, with an ingress interface): the node proxy's socket
 * answering a connection tc steered to it (lib/steer.h), which speaks as
 * that pod. 0 for anything else. */
static __always_inline __u32 steered_reply_identity(struct __sk_buff *skb)
{
	__u32 saddr;

	if (!CONFIG.proxy_steer_port || skb->ingress_ifindex ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), &saddr, sizeof(saddr)) < 0)
		return 0;
	struct endpoint_info *ep = lookup_endpoint(saddr);
	return ep ? ep->identity : 0;
}

/* shunt_to_overlay runs at egress of the VXLAN device, on what the node's
 * own stack sends to other nodes' pods: the routes that bring it here put
 * the remote-node identity in the tunnel key. The node proxy's connections
 * (its socket mark) act for a client pod, whose identity the mark carries:
 * that identity goes in the VNI instead, so the receiving node judges the
 * client's connection by the client's identity, as if the client had
 * connected itself (this node's proxy has already decided its requests).
 * The proxy's answers on connections steered to it speak as the local pod
 * whose address they leave from: that pod's identity, which the receiving
 * node expects of the address (tunnel_sender_ok). */
SEC("tc")
int shunt_to_overlay(struct __sk_buff *skb)
{
	struct ipcache_value *v;
	__u32 identity, daddr;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	if (!proxy_marked(&CONFIG, skb->mark, &identity))
		identity = steered_reply_identity(skb);
	if (!identity || !pod_identity(identity))
		return TC_ACT_OK;
	/* The node the route sends it to is the one the ipcache says hosts
	 * the destination (the key the route set cannot be read back as it
	 * was written: for a key being sent, the helper reports its
	 * destination as the local address). */
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, daddr), &daddr, sizeof(daddr)) < 0)
		return TC_ACT_OK;
	v = ipcache_lookup(daddr);
	if (!v || !v->tunnel_ip4)
		return TC_ACT_OK;
	struct bpf_tunnel_key key = {
		.tunnel_id = identity,
		.remote_ipv4 = bpf_ntohl(v->tunnel_ip4),
		.tunnel_ttl = TUNNEL_TTL,
	};
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), 0) < 0) {
		count(SHUNT_REASON_TUNNEL_KEY_FAILED, SHUNT_DIR_TO_OVERLAY, skb->len);
		return TC_ACT_SHOT;
	}
	count(SHUNT_REASON_PROXY_IDENTITY, SHUNT_DIR_TO_OVERLAY, skb->len);
	return TC_ACT_OK;
}
