/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Traffic from outside the cluster to the node's Service addresses: a
 * node address and nodePort, an externalIP, a load balancer's ingress
 * address (service entries flagged SERVICE_F_EXTERNAL). The node's uplink
 * program translates the client's packets (nodeport_from_outside): a
 * backend is picked once per flow (through the service's Maglev table,
 * lib/maglev.h, so every node picks the same) and the flow's two entries recorded in
 * shunt_nodeport_nat (struct nodeport_nat_value in shunt.h).
 *
 * A backend on this node gets the packet with the client's address as it
 * is. A backend on another node (externalTrafficPolicy Cluster) gets it
 * from this node's address on the pod network and a port of its own
 * (SNAT): every node's ipcache knows that address as this node's, so the
 * packet travels as the node's own traffic (the overlay's remote-node
 * VNI, or routed), and the reply comes back here, where the client's
 * address is given back. With externalTrafficPolicy Local only this
 * node's backends are programmed, so the client's address always stays.
 *
 * The reply of either kind (nodeport_reply) leaves the node by the uplink
 * with the frontend's address as its source, sent by BPF (a route lookup
 * and a redirect): handed to the stack, a packet from one of the node's
 * own addresses arriving on an interface would be dropped as a martian.
 * It is caught where it arrives: a local backend's at its veth
 * (shunt_from_pod), a remote one's at the uplink (native routing) or the
 * overlay device. */
#ifndef SHUNT_LIB_NODEPORT_H
#define SHUNT_LIB_NODEPORT_H

#include "common.h"
#include "services.h"
#include "tc_nat.h"
#include "pkt.h"
#include "forward.h"
#include "policy.h"
#include "encap.h"
#include "native.h"
#include "nat_timeout.h"
#include "maglev.h"
#include "ct_stack.h"
#include "source_ranges.h"
#include "dsr.h"
#include "lru.h"
#include "tcp_options.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct tc_nat_key);
	__type(value, struct nodeport_nat_value);
	__uint(max_entries, 131072); /* two per flow */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_nodeport_nat SEC(".maps");

/* Source ports tried for a new SNAT flow before it is dropped as
 * masq-port-exhausted (as masquerade's, lib/masq.h). */
#define NODEPORT_PORT_TRIES 16

/* nodeport_rewrite writes the tuple v over the packet's (f), fixing every
 * checksum, and f with it. */
static __always_inline int nodeport_rewrite(struct __sk_buff *skb, __u32 l4off, struct flow *f,
					    const struct nodeport_nat_value *v)
{
	if ((v->daddr != f->daddr || v->dport != f->dport) &&
	    rewrite_l4(skb, l4off, f->proto, true, f->daddr, v->daddr, f->dport, v->dport) < 0)
		return -1;
	if ((v->saddr != f->saddr || v->sport != f->sport) &&
	    rewrite_l4(skb, l4off, f->proto, false, f->saddr, v->saddr, f->sport, v->sport) < 0)
		return -1;
	f->saddr = v->saddr, f->daddr = v->daddr, f->sport = v->sport, f->dport = v->dport;
	return 0;
}

static __always_inline struct tc_nat_key nodeport_key(const struct flow *f)
{
	struct tc_nat_key k = { .saddr = f->saddr, .daddr = f->daddr, .sport = f->sport, .dport = f->dport, .proto = f->proto };

	return k;
}

/* nodeport_partner is the key of the flow's other entry: the tuple the
 * entry writes, turned around. */
static __always_inline struct tc_nat_key nodeport_partner(const struct nodeport_nat_value *v, __u8 proto)
{
	struct tc_nat_key k = { .saddr = v->daddr, .daddr = v->saddr, .sport = v->dport, .dport = v->sport, .proto = proto };

	return k;
}

static __always_inline __u64 nodeport_idle(const struct nodeport_nat_value *v, __u64 now)
{
	__u64 seen = v->last_seen_ns;

	return now > seen ? now - seen : 0;
}

/* nodeport_reusable says whether the flow of reply entry v no longer holds
 * its SNAT port: idle past its timeout, or a TCP connection closed a
 * moment ago (as masquerade's ports, lib/masq.h). */
static __always_inline bool nodeport_reusable(const struct nodeport_nat_value *v, __u8 proto, __u64 now)
{
	if (proto == IPPROTO_TCP && nat_closed(v->flags) && nodeport_idle(v, now) > NAT_CLOSED_REUSE)
		return true;
	return nodeport_idle(v, now) > nat_timeout(v->flags, proto);
}

/* nodeport_refresh notes a packet of the flow whose entry is (k, v): the
 * TCP flags it carries and, at most once a second, the time, in both
 * entries. A partner the LRU evicted is written again, and so is one that
 * names another flow when the client's packet refreshes it: a backend
 * that sees the client's own address (on this node, or reached by DSR) has
 * one reply tuple for a client port whichever frontend it came through,
 * and a client reusing its port through another frontend (another node's
 * address) took it over. A TCP SYN always checks, so that the new
 * connection's reply finds its own frontend; one that reuses the tuple of
 * an ended connection starts its flags over (nat_reopened). */
static __always_inline void nodeport_refresh(const struct tc_nat_key *k, struct nodeport_nat_value *v, __u8 tcp_flags, __u64 now)
{
	bool syn = tcp_opens(k->proto, tcp_flags);
	bool reopened = nat_reopened(v->flags, k->proto, tcp_flags);
	__u32 flags = reopened ? 0 : v->flags;

	if (v->reply)
		flags |= MASQ_F_REPLY_SEEN;
	/* A DSR flow's replies never pass here: a client's packet other
	 * than a SYN says it got one. */
	if (v->dsr && !(tcp_flags & SHUNT_TCPF_SYN))
		flags |= MASQ_F_REPLY_SEEN;
	if (k->proto == IPPROTO_TCP) {
		if (tcp_flags & SHUNT_TCPF_FIN)
			flags |= v->reply ? MASQ_F_FIN_IN : MASQ_F_FIN_OUT;
		if (tcp_flags & SHUNT_TCPF_RST)
			flags |= MASQ_F_RST;
	}
	if (flags == v->flags && nodeport_idle(v, now) <= NSEC_PER_SEC && !syn)
		return;
	v->flags = flags;
	v->last_seen_ns = now;
	if (v->dsr)
		return; /* no partner on the ingress node: the reply entry is the backend's node's */
	struct tc_nat_key pk = nodeport_partner(v, k->proto);
	struct nodeport_nat_value *pv = bpf_map_lookup_elem(&shunt_nodeport_nat, &pk);
	struct nodeport_nat_value again = {
		.saddr = k->daddr, .sport = k->dport, .daddr = k->saddr, .dport = k->sport, .reply = !v->reply,
		.dsr_in = v->dsr_in, .last_seen_ns = now, .flags = flags,
	};
	/* Only the client's packets take a reply entry back: a late packet
	 * of an old flow's reply tuple must not take the client entry of the
	 * flow that now has its client port. */
	if (pv && (v->reply || (pv->saddr == again.saddr && pv->sport == again.sport && pv->daddr == again.daddr &&
				pv->dport == again.dport))) {
		pv->flags = reopened ? flags : pv->flags | flags;
		pv->last_seen_ns = now;
		return;
	}
	lru_insert(&shunt_nodeport_nat, &pk, &again, v->reply ? BPF_NOEXIST : BPF_ANY);
}

/* nodeport_claim makes the reply tuple rk (one candidate SNAT port) the
 * new flow's, with the value rev. Returns 0 when claimed, 1 when a live
 * flow holds it, -1 when the insert failed. A flow that no longer holds
 * its port (nodeport_reusable) gives it up here, its client entry with
 * it. */
static __always_inline int nodeport_claim(const struct tc_nat_key *rk, const struct nodeport_nat_value *rev, __u64 now)
{
	if (lru_insert(&shunt_nodeport_nat, rk, rev, BPF_NOEXIST) == 0)
		return 0;
	struct nodeport_nat_value *cur = bpf_map_lookup_elem(&shunt_nodeport_nat, rk);
	if (!cur)
		return lru_insert(&shunt_nodeport_nat, rk, rev, BPF_NOEXIST) == 0 ? 0 : -1;
	if (!nodeport_reusable(cur, rk->proto, now))
		return 1;
	struct tc_nat_key pk = nodeport_partner(cur, rk->proto);
	struct nodeport_nat_value *pv = bpf_map_lookup_elem(&shunt_nodeport_nat, &pk);
	if (pv && pv->saddr == rk->daddr && pv->sport == rk->dport && pv->daddr == rk->saddr && pv->dport == rk->sport)
		map_delete(&shunt_nodeport_nat, &pk);
	return lru_insert(&shunt_nodeport_nat, rk, rev, BPF_ANY) == 0 ? 0 : -1;
}

/* nodeport_keep makes sure a new flow's reply entry (rk -> rev) outlived
 * the write of its client entry, which may have evicted it (lib/lru.h):
 * a reply without it would leave untranslated, and the client would
 * reset it. Written again when gone (counted as nat-entry-lost). Returns
 * 0, else the drop reason. */
static __always_inline __u32 nodeport_keep(const struct tc_nat_key *rk, const struct nodeport_nat_value *rev)
{
	return lru_restore(&shunt_nodeport_nat, rk, rev, SHUNT_DIR_FROM_UPLINK, 0) < 0 ? SHUNT_REASON_NAT_INSERT_FAILED : 0;
}

/* nodeport_send_out sends a reply to the client out of cfg's uplink: the
 * route lookup of the node's namespace as for a packet the node sends
 * (its MACs, or bpf_redirect_neigh when the next hop's is not known yet),
 * one hop, counted and reported as reason. Returns the verdict. */
static __always_inline int nodeport_send_out(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
					     __u32 reason)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET, .l4_protocol = p->f.proto, .sport = p->f.sport, .dport = p->f.dport,
		.ifindex = cfg->uplink_ifindex, .ipv4_src = p->f.saddr, .ipv4_dst = p->f.daddr,
	};
	long ret = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT);

	if (ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH)
		return drop(skb, p, SHUNT_REASON_FIB_LOOKUP_FAILED);
	return fib_redirect(skb, p, &fib, ret, reason);
}

/* pkt_read reads size (1 or 2) bytes at off of skb's linear data, without
 * the stack bpf_skb_load_bytes needs (nodeport_icmp_error has none to
 * spare); -1 when they are not there. */
static __always_inline int pkt_read(struct __sk_buff *skb, __u32 off, __u32 size)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;

	if (off > 0xfff)
		return -1;
	__u8 *b = data + off;
	if ((void *)(b + 2) > end)
		return -1;
	return size == 1 ? *b : *(__u16 *)b;
}

/* dsr_clamp_mss lowers the MSS option of a backend's SYN-ACK to a flow
 * that arrived by DSR (l4off: its TCP header) to what fits the room DSR
 * leaves (dsr_room: the uplink's MTU less DSR's outer header, and with the
 * overlay no more than the tunnel device's MTU, the pods'): the client's
 * segments reach this node in IPIP with an IP option, 28 bytes more than
 * the client sent. mss_off is the MSS option's offset (tcp_option), 0 when
 * the SYN-ACK has none. Clamping,
 * as routers do for tunnels, saves each connection the first full-sized
 * segment lost and the ICMP fragmentation needed the ingress node
 * answers it with (dsr_too_big), and works where the client's path drops
 * ICMP. Returns 0 (clamped, or nothing to clamp), -1 when a rewrite
 * failed. A function of its own: few values live, a small frame. */
__noinline int dsr_clamp_mss(struct __sk_buff *skb, __u64 l4off, __u32 mss_off, __u32 uplink_ifindex, __u32 tunnel_ifindex)
{
	/* A global function, verified once on its own (inlined in each
	 * program's paths it took the pod program past the verifier's million
	 * instructions): l4off is any number here, a TCP header's offset in
	 * no packet past this bound. */
	if (l4off > 0xff)
		return 0;
	__u32 mtu = dsr_room(skb, uplink_ifindex, tunnel_ifindex);

	if (mtu <= sizeof(struct iphdr) + sizeof(struct tcphdr))
		return 0;
	__u16 max = mtu - sizeof(struct iphdr) - sizeof(struct tcphdr);
	__u16 old;

	if (!mss_off || bpf_skb_load_bytes(skb, mss_off + 2, &old, sizeof(old)) < 0 || bpf_ntohs(old) <= max)
		return 0;
	__u16 clamped = bpf_htons(max);
	if (bpf_l4_csum_replace(skb, l4off + __builtin_offsetof(struct tcphdr, check), old, clamped, sizeof(clamped)) < 0 ||
	    bpf_skb_store_bytes(skb, mss_off + 2, &clamped, sizeof(clamped), 0) < 0)
		return -1;
	return 0;
}

/* Where things are in an ICMP error a router of the underlay sends the
 * ingress node about one of its DSR packets (lib/dsr.h), as
 * dsr_path_error takes it: the error's IPv4 header (no options), its ICMP
 * header, the quoted outer header (with DSR's option), the quoted
 * client's packet (IPv4 without options) and the first 8 bytes of its
 * transport header, which hold the ports. */
#define DSR_PE_ICMP (ETH_HLEN + sizeof(struct iphdr))
#define DSR_PE_OUTER (DSR_PE_ICMP + sizeof(struct icmphdr))
#define DSR_PE_OPT (DSR_PE_OUTER + sizeof(struct iphdr))
#define DSR_PE_INNER (DSR_PE_OUTER + DSR_OUTER_LEN)
#define DSR_PE_L4 (DSR_PE_INNER + sizeof(struct iphdr))
#define DSR_PE_END (DSR_PE_L4 + ICMP_QUOTE_L4)
#define DSR_PE_MIN_MTU 68 /* RFC 791: every IPv4 link carries 68 bytes */

/* dsr_path_error turns ICMP fragmentation needed about one of this
 * node's DSR packets (sent from self, its underlay address, to a
 * backend's node; a router between the nodes could not carry it) into
 * the error the client needs: the client's packet did not fit, so the
 * client must send packets 28 bytes (DSR's outer header) smaller than
 * the MTU the router names. Only for a flow this node sends by DSR (its
 * client entry, naming the backend the quote is to). In place: the new
 * IPv4 header (from the service address the client dialled, the
 * option's, to the client), the ICMP header (MTU less 28) where the
 * quoted option was, the quote turned back into the client's packet as it
 * sent it (to the service address and port, its TTL before the hop), cut
 * after its 8 bytes of transport header; the quoted outer header is then
 * removed. Every checksum computed. Returns 1 when rewritten, 0 when the
 * packet is no such error (left as it was: a router that names no MTU,
 * RFC 792's, or quotes only 8 bytes of the outer payload, leaves nothing
 * to translate), -1 when a helper failed (drop it). A global function
 * with a frame of its own: the uplink program's leaves 32 bytes for a
 * callee, so the packet is read and written in place. */
__noinline int dsr_path_error(struct __sk_buff *skb, __u32 self)
{
	struct iphdr *hdr = skb_linear_data(skb) + ETH_HLEN;

	/* Every packet to the node's address that is no DSR packet comes
	 * here: the protocol first, read in place (no room on the stack: the
	 * caller's frame leaves 32 bytes), which costs nothing like a pull.
	 * A header not in the linear part goes on to the pull. */
	if ((void *)(hdr + 1) <= skb_linear_end(skb) && hdr->protocol != IPPROTO_ICMP)
		return 0;
	if (bpf_skb_pull_data(skb, DSR_PE_END) < 0)
		return 0;
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	if (data + DSR_PE_END > end)
		return 0;
	struct iphdr *ip = data + ETH_HLEN, *outer = data + DSR_PE_OUTER, *inner = data + DSR_PE_INNER;
	struct icmphdr *icmp = data + DSR_PE_ICMP;
	struct dsr_opt *opt = data + DSR_PE_OPT;
	__u16 *ports = data + DSR_PE_L4;

	if (*(__u8 *)ip != 0x45 || ip->protocol != IPPROTO_ICMP || ip->daddr != self || icmp->type != ICMP_DEST_UNREACH ||
	    icmp->code != ICMP_FRAG_NEEDED || *(__u8 *)outer != 0x40 + DSR_OUTER_LEN / 4 || outer->protocol != IPPROTO_IPIP ||
	    outer->saddr != self || opt->type != DSR_OPT_TYPE || opt->len != sizeof(*opt) || *(__u8 *)inner != 0x45 ||
	    (inner->protocol != IPPROTO_TCP && inner->protocol != IPPROTO_UDP))
		return 0;
	__u32 mtu = bpf_ntohs(icmp->un.frag.mtu);
	if (mtu < DSR_OUTER_LEN + DSR_PE_MIN_MTU)
		return 0;
	struct tc_nat_key ck = { .saddr = inner->saddr, .daddr = opt->addr, .sport = ports[0], .dport = opt->port,
				 .proto = inner->protocol };
	struct nodeport_nat_value *fwd = bpf_map_lookup_elem(&shunt_nodeport_nat, &ck);
	if (!fwd || fwd->reply || !fwd->dsr || fwd->daddr != inner->daddr || fwd->dport != ports[1])
		return 0;

	/* The quote: the client's packet as it left the client. */
	inner->daddr = opt->addr;
	inner->ttl++;
	inner->check = 0;
	ports[1] = opt->port;
	__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)inner, sizeof(*inner), 0);
	if (sum < 0)
		return -1;
	inner->check = csum_fold(sum);
	/* The error's header: from the service to the client. */
	ip->tos = IPTOS_PREC_INTERNETCONTROL;
	ip->tot_len = bpf_htons(sizeof(struct iphdr) + sizeof(struct icmphdr) + sizeof(struct iphdr) + ICMP_QUOTE_L4);
	ip->id = 0;
	ip->frag_off = bpf_htons(IP_DF);
	ip->ttl = ICMP_ERROR_TTL;
	ip->saddr = opt->addr;
	ip->daddr = inner->saddr;
	ip->check = 0;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0);
	if (sum < 0)
		return -1;
	ip->check = csum_fold(sum);
	/* The ICMP header where the option was, right before the quote. */
	icmp = (struct icmphdr *)opt;
	icmp->type = ICMP_DEST_UNREACH;
	icmp->code = ICMP_FRAG_NEEDED;
	icmp->checksum = 0;
	icmp->un.gateway = 0;
	icmp->un.frag.mtu = bpf_htons(mtu - DSR_OUTER_LEN);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)icmp, sizeof(*icmp) + sizeof(struct iphdr) + ICMP_QUOTE_L4, 0);
	if (sum < 0)
		return -1;
	icmp->checksum = csum_fold(sum);
	/* Cut after the quote, then the 28 bytes from the router's ICMP
	 * header to the option (right after the IPv4 header) go. */
	if (bpf_skb_change_tail(skb, DSR_PE_END, 0) < 0 ||
	    bpf_skb_adjust_room(skb, -(__s32)DSR_OUTER_LEN, BPF_ADJ_ROOM_NET, 0) < 0)
		return -1;
	return 1;
}

/* The rewrite in three steps, each a function of its own with few values
 * live across its helper calls: the uplink program's frame leaves room
 * for a callee of 32 bytes at most (the verifier's 512 for both frames),
 * and one function doing everything spilled 80. qip is the quoted IPv4
 * header's offset; the ICMP checksum is 6 bytes before it. */
#define ICMP_CSUM_OF_QUOTE(qip) ((qip) - sizeof(struct icmphdr) + __builtin_offsetof(struct icmphdr, checksum))

/* icmp_quote_ip rewrites the quoted IPv4 header's checksum for its new
 * addresses, and the ICMP checksum for that change. */
static __noinline int icmp_quote_ip(struct __sk_buff *skb, const struct flow *f, const struct nodeport_nat_value *v, __u32 qip)
{
	__u32 at = qip + __builtin_offsetof(struct iphdr, check);
	int old = pkt_read(skb, at, 2);

	if (old < 0 || bpf_l3_csum_replace(skb, at, f->inner.saddr, v->daddr, sizeof(__u32)) < 0 ||
	    bpf_l3_csum_replace(skb, at, f->inner.daddr, v->saddr, sizeof(__u32)) < 0)
		return -1;
	int now = pkt_read(skb, at, 2);
	if (now < 0 || bpf_l4_csum_replace(skb, ICMP_CSUM_OF_QUOTE(qip), old, now, sizeof(__u16)) < 0)
		return -1;
	return 0;
}

/* icmp_quote_l4 rewrites the quoted transport checksum, when the quote
 * holds it (RFC 792 quotes 8 bytes of the transport header: a TCP
 * checksum is beyond them, a UDP one within; 0: the datagram had none),
 * and returns its new value (the caller adjusts the ICMP checksum for
 * it), or -1. ql4 is the quoted transport header's offset. */
static __noinline int icmp_quote_l4(struct __sk_buff *skb, const struct flow *f, const struct nodeport_nat_value *v, __u32 ql4)
{
	__u32 at = ql4 + (f->inner.proto == IPPROTO_TCP ? __builtin_offsetof(struct tcphdr, check)
							  : __builtin_offsetof(struct udphdr, check));
	int old = pkt_read(skb, at, 2);

	if (old < 0)
		return 0;
	__u64 m = f->inner.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	if (bpf_l4_csum_replace(skb, at, f->inner.saddr, v->daddr, sizeof(__u32) | m) < 0 ||
	    bpf_l4_csum_replace(skb, at, f->inner.daddr, v->saddr, sizeof(__u32) | m) < 0 ||
	    bpf_l4_csum_replace(skb, at, f->inner.sport, v->dport, sizeof(__u16) | m) < 0 ||
	    bpf_l4_csum_replace(skb, at, f->inner.dport, v->sport, sizeof(__u16) | m) < 0)
		return -1;
	return pkt_read(skb, at, 2); /* the new checksum, for the ICMP one */
}

/* icmp_quote_rewrite writes the quote's new addresses and ports and the
 * ICMP checksum's terms for them (no pseudo-header: every changed byte of
 * the quote is a term of it), then the outer header. */
static __noinline int icmp_quote_rewrite(struct __sk_buff *skb, const struct flow *f, const struct nodeport_nat_value *v, __u32 qip)
{
	__u32 csum = ICMP_CSUM_OF_QUOTE(qip);

	if (bpf_l4_csum_replace(skb, csum, f->inner.saddr, v->daddr, sizeof(__u32)) < 0 ||
	    bpf_l4_csum_replace(skb, csum, f->inner.daddr, v->saddr, sizeof(__u32)) < 0 ||
	    bpf_l4_csum_replace(skb, csum, f->inner.sport, v->dport, sizeof(__u16)) < 0 ||
	    bpf_l4_csum_replace(skb, csum, f->inner.dport, v->sport, sizeof(__u16)) < 0)
		return -1;
	int vihl = pkt_read(skb, qip, 1);
	if (vihl < 0)
		return -1;
	__u32 ql4 = qip + (vihl & 0xf) * 4;
	if (bpf_skb_store_bytes(skb, qip + __builtin_offsetof(struct iphdr, saddr), &v->daddr, sizeof(__u32), 0) < 0 ||
	    bpf_skb_store_bytes(skb, qip + __builtin_offsetof(struct iphdr, daddr), &v->saddr, sizeof(__u32), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ql4, &v->dport, sizeof(__u16), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ql4 + 2, &v->sport, sizeof(__u16), 0) < 0)
		return -1;
	/* The outer header: the error's addressee is the quote's source. */
	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, f->daddr, v->daddr, sizeof(__u32)) < 0 ||
	    bpf_skb_store_bytes(skb, IP_DST_OFF, &v->daddr, sizeof(__u32), 0) < 0)
		return -1;
	if (f->saddr == f->inner.daddr &&
	    (bpf_l3_csum_replace(skb, IP_CSUM_OFF, f->saddr, v->saddr, sizeof(__u32)) < 0 ||
	     bpf_skb_store_bytes(skb, IP_SRC_OFF, &v->saddr, sizeof(__u32), 0) < 0))
		return -1;
	return 0;
}

/* nodeport_icmp_error translates an ICMP error about a packet of a flow
 * from outside on its way to the backend (sent by the backend, or by a
 * router between: fragmentation needed, port unreachable, ...), whose
 * reply entry v (frontend -> client) was found, to reach the client about
 * the address it used: the quote's source (the node's SNAT address and
 * port, or the client's own) becomes the client's, as does the outer
 * destination; the quote's destination (the backend) becomes the
 * frontend, and so does the outer source when the backend sent the error
 * (a router's address stays, as Linux's NAT leaves it). Every checksum is
 * fixed: the quoted IPv4 header's, the quoted TCP/UDP checksum when the
 * quote holds it, the ICMP checksum (no pseudo-header: every changed
 * byte of the quote is a term of it) and the outer header's. f is not
 * changed. Returns -1 when a rewrite failed.
 *
 * Its rewrites are functions of their own (icmp_quote_ip, icmp_quote_l4,
 * icmp_quote_rewrite), with the new values read from v and the old ones
 * from f rather than copied: the uplink and pod programs' stacks have
 * room for few more bytes. */
static __always_inline int nodeport_icmp_error(struct __sk_buff *skb, const struct flow *f, __u32 l4off,
					       const struct nodeport_nat_value *v)
{
	__u32 qip = l4off + sizeof(struct icmphdr);

	/* An ICMP error is small: its quote in the linear data, where
	 * pkt_read finds it. */
	if (bpf_skb_pull_data(skb, 0) < 0)
		return -1;
	int vihl = pkt_read(skb, qip, 1);
	if (vihl < 0 || (vihl & 0xf) < 5)
		return -1;
	if (icmp_quote_ip(skb, f, v, qip) < 0)
		return -1;
	__u32 ql4 = qip + (vihl & 0xf) * 4;
	int old = pkt_read(skb, ql4 + (f->inner.proto == IPPROTO_TCP ? __builtin_offsetof(struct tcphdr, check)
								      : __builtin_offsetof(struct udphdr, check)), 2);
	if (old >= 0) {
		int now = icmp_quote_l4(skb, f, v, ql4);
		if (now < 0 || bpf_l4_csum_replace(skb, ICMP_CSUM_OF_QUOTE(qip), old, now, sizeof(__u16)) < 0)
			return -1;
	}
	return icmp_quote_rewrite(skb, f, v, qip);
}

/* nodeport_error_xlate rewrites an ICMP error about a packet of a flow
 * with the flow's entry v found by the quote turned around
 * (nodeport_icmp_error) and updates f to the error as it now reads. Either
 * direction: the reply entry (frontend -> client) for an error about the
 * way to the backend, the client's entry (frontend -> backend) for an
 * error from outside about a reply (nodeport_from_outside). Returns -1
 * when a rewrite failed. */
static __always_inline int nodeport_error_xlate(struct __sk_buff *skb, struct flow *f, __u32 l4off,
						const struct nodeport_nat_value *v)
{
	if (nodeport_icmp_error(skb, f, l4off, v) < 0)
		return -1;
	if (f->saddr == f->inner.daddr)
		f->saddr = v->saddr;
	f->daddr = v->daddr;
	f->inner.saddr = v->daddr, f->inner.sport = v->dport;
	f->inner.daddr = v->saddr, f->inner.dport = v->sport;
	return 0;
}

/* nodeport_to_node sends a packet to the node whose underlay address is
 * tunnel_ip4 as this node's own traffic: through the overlay with the
 * remote-node VNI, or routed. Returns the verdict. */
static __always_inline int nodeport_to_node(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
					    __u32 tunnel_ip4)
{
	if (cfg->tunnel_ifindex) {
		int verdict = forward_hop(skb, p);

		if (verdict >= 0)
			return verdict;
		__u32 reason = encap_to_node(skb, cfg, tunnel_ip4, SHUNT_ID_REMOTE_NODE, false /* not checked yet */);
		if (reason)
			return drop(skb, p, reason);
		done(skb, p, FLOW_FORWARDED, SHUNT_REASON_TO_TUNNEL);
		return TC_ACT_REDIRECT;
	}
	if (cfg->native_ifindex)
		return to_node_routed(skb, p, cfg);
	return drop(skb, p, SHUNT_REASON_FIB_LOOKUP_FAILED);
}

/* nodeport_unnat gives a backend's reply to a flow from outside the
 * frontend's address and port back as its source (and the client's
 * address as destination), or translates an ICMP error about the flow's
 * way to the backend (nodeport_icmp_error). Returns -1 when the packet is no such reply (it
 * goes on as before), 0 when it is translated, else the drop verdict.
 * *own is the entry of the packet's own tuple when it is a TCP or UDP
 * packet with ports (NULL: none), looked up here for nodeport_reply's
 * caller: a client's packet of a known flow is found by that lookup. */
static __always_inline int nodeport_unnat(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
					  struct nodeport_nat_value **own)
{
	struct flow *f = &p->f;
	bool error = f->icmp_error;

	if (!cfg->uplink_ifindex)
		return -1;
	struct tc_nat_key k = nodeport_key(f);
	if (error) {
		if ((f->inner.proto != IPPROTO_TCP && f->inner.proto != IPPROTO_UDP) || f->daddr != f->inner.saddr)
			return -1;
		/* The quoted packet went to the backend: turned around, it is
		 * the flow's reply tuple. */
		k.saddr = f->inner.daddr, k.daddr = f->inner.saddr, k.sport = f->inner.dport;
		k.dport = f->inner.sport, k.proto = f->inner.proto;
	} else if ((f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP) || !f->has_ports) {
		return -1;
	}
	struct nodeport_nat_value *found = bpf_map_lookup_elem(&shunt_nodeport_nat, &k);
	if (!error)
		*own = found;
	if (!found || !found->reply)
		return -1;
	__u8 ihl;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ihl, 1) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	__u32 l4off = ETH_HLEN + (ihl & 0xf) * 4;
	int err;
	if (error) {
		/* An error is no sign of life of the flow. */
		p->event = FLOW_EV_ICMP_ERROR;
		err = nodeport_error_xlate(skb, f, l4off, found);
	} else {
		nodeport_refresh(&k, found, f->tcp_flags, nat_now());
		struct nodeport_nat_value v = *found;

		err = nodeport_rewrite(skb, l4off, f, &v);
		if (err == 0 && v.dsr_in && f->proto == IPPROTO_TCP && (f->tcp_flags & SHUNT_TCPF_SYN))
			/* Found here, not in dsr_clamp_mss: each function's stack adds
			 * to its callers', and the pod program has room for one more
			 * frame, not two. */
			err = dsr_clamp_mss(skb, l4off, tcp_option(skb, l4off, TCP_OPTION(TCPOPT_MSS, TCPOLEN_MSS, 0)),
					    cfg->uplink_ifindex, cfg->tunnel_ifindex);
	}
	if (err < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	return 0;
}

/* nodeport_reply_own translates a backend's reply to a flow from outside
 * and sends it to the client. Returns -1 when the packet is no such reply
 * (it goes on as before), else the verdict. *own: see nodeport_unnat. */
static __always_inline int nodeport_reply_own(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
					      struct nodeport_nat_value **own)
{
	int verdict = nodeport_unnat(skb, p, cfg, own);

	if (verdict != 0)
		return verdict;
	/* A client that is a pod of another node reached this node's
	 * address from there (no socket of its node translated it): the
	 * reply goes back to its node as this node's own traffic, not out of
	 * the uplink, which has no route to pods. */
	struct ipcache_value *client = ipcache_lookup(p->f.daddr);
	if (client && client->tunnel_ip4) {
		p->dst_identity = client->identity;
		p->src_identity = SHUNT_ID_HOST;
		return nodeport_to_node(skb, p, cfg, client->tunnel_ip4);
	}
	return nodeport_send_out(skb, p, cfg, SHUNT_REASON_NODEPORT_REPLY);
}

/* nodeport_reply is nodeport_reply_own for a caller that has no use for
 * the packet's own entry. */
static __always_inline int nodeport_reply(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg)
{
	struct nodeport_nat_value *own = NULL;

	return nodeport_reply_own(skb, p, cfg, &own);
}

/* nodeport_snat records a new flow (client key ck) to a backend on
 * another node: a source port of cfg's range for the reply tuple (backend
 * -> the node's address and that port), then both entries. Returns 0 with
 * *fwd filled in, else the drop reason. */
static __always_inline __u32 nodeport_snat(const volatile struct shunt_config *cfg, const struct tc_nat_key *ck,
					   __u32 be_ip, __u16 be_port, struct nodeport_nat_value *fwd)
{
	__u16 lo = cfg->nodeport_port_min, hi = cfg->nodeport_port_max;
	__u32 span = (__u32)hi - lo + 1;
	__u64 now = nat_now();
	struct nodeport_nat_value rev = {
		.saddr = ck->daddr, .sport = ck->dport, .daddr = ck->saddr, .dport = ck->sport, .reply = 1, .last_seen_ns = now,
	};
	struct tc_nat_key rk = { .saddr = be_ip, .sport = be_port, .daddr = cfg->nodeport_snat_ip4, .proto = ck->proto };

	if (!cfg->nodeport_snat_ip4 || !span || lo > hi)
		return SHUNT_REASON_MASQ_PORT_EXHAUSTED;
	fwd->last_seen_ns = now;
	for (int i = 0; i < NODEPORT_PORT_TRIES; i++) {
		rk.dport = bpf_htons(lo + bpf_get_prandom_u32() % span);
		int r = nodeport_claim(&rk, &rev, now);
		if (r < 0)
			return SHUNT_REASON_NAT_INSERT_FAILED;
		if (r > 0)
			continue;
		fwd->saddr = cfg->nodeport_snat_ip4, fwd->sport = rk.dport, fwd->daddr = be_ip, fwd->dport = be_port;
		if (lru_insert(&shunt_nodeport_nat, ck, fwd, BPF_ANY) < 0) {
			map_delete(&shunt_nodeport_nat, &rk);
			return SHUNT_REASON_NAT_INSERT_FAILED;
		}
		return nodeport_keep(&rk, &rev);
	}
	return SHUNT_REASON_MASQ_PORT_EXHAUSTED;
}

/* nodeport_direct records a new flow (client key ck) to a backend that
 * gets the client's address as it is (this node's pod): the client's
 * entry (*fwd, set here) and the reply's, which gives the reply ck's
 * frontend as its source. Returns 0, else the drop reason. */
static __always_inline __u32 nodeport_direct(const struct tc_nat_key *ck, __u32 be_ip, __u16 be_port, struct nodeport_nat_value *fwd,
					      __u8 dsr_in)
{
	struct tc_nat_key rk = { .saddr = be_ip, .sport = be_port, .daddr = ck->saddr, .dport = ck->sport, .proto = ck->proto };
	__u64 now = nat_now();
	struct nodeport_nat_value rev = {
		.saddr = ck->daddr, .sport = ck->dport, .daddr = ck->saddr, .dport = ck->sport, .reply = 1, .last_seen_ns = now,
		.dsr_in = dsr_in,
	};
	fwd->last_seen_ns = now;
	fwd->saddr = ck->saddr, fwd->sport = ck->sport, fwd->daddr = be_ip, fwd->dport = be_port;
	fwd->dsr_in = dsr_in;
	if (lru_insert(&shunt_nodeport_nat, &rk, &rev, BPF_ANY) < 0)
		return SHUNT_REASON_NAT_INSERT_FAILED;
	if (lru_insert(&shunt_nodeport_nat, ck, fwd, BPF_ANY) < 0) {
		map_delete(&shunt_nodeport_nat, &rk);
		return SHUNT_REASON_NAT_INSERT_FAILED;
	}
	return nodeport_keep(&rk, &rev);
}

/* nodeport_new picks the backend of a new flow to external frontend svc
 * and records it. Returns 0 with *fwd set, else the drop reason. */
static __always_inline __u32 nodeport_new(const volatile struct shunt_config *cfg, struct service_value *svc,
					  const struct tc_nat_key *ck, struct nodeport_nat_value *fwd)
{
	__u32 failed = 0;
	struct backend_value *be = 0;

	/* The service's Maglev table (lib/maglev.h), so that every node picks
	 * the same backend; ClientIP affinity keeps its own choice. */
	if (!(svc->flags & SERVICE_F_AFFINITY))
		be = maglev_select(svc, ck->saddr, ck->sport, ck->dport, ck->proto);
	if (!be)
		be = select_backend(svc, ck->daddr, ck->dport, ck->proto, ck->saddr, AFFINITY_CLIENT_ADDR, &failed);

	if (!be)
		return SHUNT_REASON_SERVICE_NO_BACKEND;
	__u32 be_ip = be->ip;
	__u16 be_port = be->port;

	if (!(svc->flags & SERVICE_F_LOCAL) && !lookup_endpoint(be_ip)) {
		if (!dsr_wanted(cfg, ck->proto, svc->flags))
			return nodeport_snat(cfg, ck, be_ip, be_port, fwd);
		/* DSR (lib/dsr.h): the client's address stays, and only its
		 * entry is recorded here; the backend's node records the
		 * reply's. */
		fwd->last_seen_ns = nat_now();
		fwd->saddr = ck->saddr, fwd->sport = ck->sport, fwd->daddr = be_ip, fwd->dport = be_port, fwd->dsr = 1;
		return lru_insert(&shunt_nodeport_nat, ck, fwd, BPF_ANY) < 0 ? SHUNT_REASON_NAT_INSERT_FAILED : 0;
	}
	/* The backend is here: the client's address stays. */
	return nodeport_direct(ck, be_ip, be_port, fwd, 0);
}

/* nodeport_to_backend delivers a translated packet: to a local pod
 * through its ingress policy (the client's identity: the world's, or the
 * node's own when SNAT made it the node's), to another node's pod through
 * the overlay as the node's own traffic (the remote-node VNI) or routed.
 * client is the address the packet came from, for policy. */
static __always_inline int nodeport_to_backend(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
					       __u32 client)
{
	struct endpoint_info *ep = lookup_endpoint(p->f.daddr);

	if (ep) {
		p->src_identity = identity_of(client);
		return admit_to_local_pod(skb, p, cfg, p->src_identity, ep);
	}
	struct ipcache_value *remote = ipcache_lookup(p->f.daddr);
	__u32 tunnel_ip4 = remote ? remote->tunnel_ip4 : 0;

	p->dst_identity = remote ? remote->identity : SHUNT_ID_WORLD;
	p->src_identity = SHUNT_ID_HOST;
	if (!tunnel_ip4)
		/* Not a pod of any node (a hand-written endpoint outside): the
		 * stack routes it. */
		return drop(skb, p, SHUNT_REASON_FIB_LOOKUP_FAILED);
	return nodeport_to_node(skb, p, cfg, tunnel_ip4);
}

/* nodeport_dsr_forward sends a client's packet of a DSR flow (entry fwd)
 * to its backend's node (lib/dsr.h): a packet that would not fit once
 * encapsulated is answered first, as the client sent it; then translated
 * (the client's address kept), one hop, encapsulated with the frontend it
 * was sent to, and routed out of the uplink. An ICMP error from outside
 * about one of the flow's replies (addressed to the frontend, the reply's
 * source) goes the same way untranslated, the option naming the frontend
 * its quote starts from: the backend's node translates it
 * (nodeport_from_dsr). Returns the verdict. */
static __always_inline int nodeport_dsr_forward(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
						__u32 l4off, const struct nodeport_nat_value *fwd)
{
	bool error = p->f.icmp_error;
	__u32 svc_addr = p->f.daddr, mtu = 0;
	__u16 svc_port = error ? p->f.inner.sport : p->f.dport;
	struct ipcache_value *remote = ipcache_lookup(fwd->daddr);
	__u32 node = remote ? remote->tunnel_ip4 : 0;

	p->src_identity = SHUNT_ID_WORLD;
	if (!node)
		return drop(skb, p, SHUNT_REASON_FIB_LOOKUP_FAILED); /* no pod of another node (any more) */
	p->dst_identity = remote->identity;
	if (!error) {
		/* No error about an error (RFC 1122 3.2.2). */
		if (dsr_too_big(skb, cfg, &mtu))
			return dsr_answer_too_big(skb, p, cfg, mtu);
		if (nodeport_rewrite(skb, l4off, &p->f, fwd) < 0)
			return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	}
	count(SHUNT_REASON_NODEPORT_XLATE, p->dir, skb->len);
	int verdict = forward_hop(skb, p);
	if (verdict >= 0)
		return verdict;
	if (dsr_encap(skb, cfg, node, svc_addr, svc_port) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	return dsr_send(skb, p, cfg, node);
}

/* nodeport_from_outside translates a packet from outside to one of the
 * node's external frontends, or a client's later packet of such a flow,
 * or an ICMP error from outside about one of its replies,
 * and delivers it to the backend. own is the entry of the packet's tuple
 * (nodeport_reply_own looked it up: NULL when there is none), the
 * client's entry unless the packet is an error. Returns -1 when it is none
 * of these (it goes on as before), else the verdict. */
static __always_inline int nodeport_from_outside(struct __sk_buff *skb, struct pkt *p, struct iphdr *ip,
						 const volatile struct shunt_config *cfg, struct nodeport_nat_value *own)
{
	bool error = p->f.icmp_error;

	if (!cfg->uplink_ifindex)
		return -1;
	if (error ? (p->f.inner.proto != IPPROTO_TCP && p->f.inner.proto != IPPROTO_UDP) || p->f.daddr != p->f.inner.saddr
		  : (p->f.proto != IPPROTO_TCP && p->f.proto != IPPROTO_UDP) || !p->f.has_ports)
		return -1;
	__u32 l4off = ETH_HLEN + ip->ihl * 4;
	struct tc_nat_key ck = nodeport_key(&p->f);
	if (error) {
		/* The quoted packet is a reply to the client: turned around,
		 * it is the client's tuple. */
		ck.saddr = p->f.inner.daddr, ck.daddr = p->f.inner.saddr, ck.sport = p->f.inner.dport;
		ck.dport = p->f.inner.sport, ck.proto = p->f.inner.proto;
	}
	struct nodeport_nat_value fwd = {};
	struct nodeport_nat_value *known = error ? bpf_map_lookup_elem(&shunt_nodeport_nat, &ck) : own;
	__u32 client = p->f.saddr;

	if (error) {
		/* An error from outside about a reply, for the backend: its
		 * quote becomes the reply as the backend sent it (to the
		 * node's SNAT address and port, or the client's own), the
		 * outer destination the backend. A DSR flow's replies left
		 * from the backend's node, which translates the error: it
		 * goes there as it is (nodeport_dsr_forward). An error is no
		 * sign of life of the flow. */
		if (!known || known->reply)
			return -1;
		p->event = FLOW_EV_ICMP_ERROR;
		if (known->dsr)
			fwd = *known;
		else if (nodeport_error_xlate(skb, &p->f, l4off, known) < 0)
			return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	} else if (known) {
		if (known->reply)
			return -1; /* a backend's reply: nodeport_reply's */
		nodeport_refresh(&ck, known, p->f.tcp_flags, nat_now());
		fwd = *known;
	} else {
		struct service_value *svc = lookup_service(ck.daddr, ck.dport, ck.proto);

		if (!svc || !(svc->flags & SERVICE_F_EXTERNAL))
			return -1;
		/* A TCP segment other than a first SYN, of a flow shunt does
		 * not know, that the kernel's conntrack holds: a connection
		 * kube-proxy translated before this node moved to shunt (or
		 * while its agent was beside it). The stack's NAT keeps it.
		 * One the stack does not hold either is a flow whose entry a
		 * full table evicted while it still ran: counted, the
		 * operator's sign that --conntrack-max is too small (a table's
		 * fill level cannot tell entries in use from idle ones), and
		 * taken as a new flow. */
		if (p->f.proto == IPPROTO_TCP && !tcp_opens(p->f.proto, p->f.tcp_flags)) {
			if (stack_tracks_tcp(skb, &p->f))
				return -1;
			count(SHUNT_REASON_NODEPORT_ENTRY_MISSING, p->dir, skb->len);
		}
		if (!lb_source_allowed(svc->id, ck.saddr))
			return drop(skb, p, SHUNT_REASON_LB_SOURCE_DENIED);
		__u32 reason = nodeport_new(cfg, svc, &ck, &fwd);
		if (reason)
			return drop(skb, p, reason);
		p->event = FLOW_EV_CONN_NEW;
	}
	if (fwd.dsr)
		return nodeport_dsr_forward(skb, p, cfg, l4off, &fwd);
	if (!error && nodeport_rewrite(skb, l4off, &p->f, &fwd) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	count(SHUNT_REASON_NODEPORT_XLATE, p->dir, skb->len);
	return nodeport_to_backend(skb, p, cfg, client);
}

/* nodeport_dsr_error takes an ICMP error from outside that the ingress
 * node sent on by DSR (nodeport_dsr_forward), decapsulated: about a reply
 * of a flow whose backend is here, which left with the frontend
 * (svc_addr:svc_port, the option's) as its source, the error addressed
 * to it. It is translated with the flow's client entry as the ingress
 * node would for an SNAT flow (nodeport_error_xlate: the quote and outer
 * destination become the backend's, every checksum fixed) and judged as
 * the backend's flow, so a fragmentation needed lowers the pod's path
 * MTU toward the client. An error about nothing this node holds is
 * dropped. Returns the verdict. */
static __always_inline int nodeport_dsr_error(struct __sk_buff *skb, struct pkt *p, struct iphdr *ip,
					      const volatile struct shunt_config *cfg, __u32 svc_addr, __u16 svc_port)
{
	struct flow *f = &p->f;

	if ((f->inner.proto != IPPROTO_TCP && f->inner.proto != IPPROTO_UDP) || f->daddr != svc_addr ||
	    f->inner.saddr != svc_addr || f->inner.sport != svc_port)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	/* The quote is a reply to the client: turned around, the client's
	 * tuple, whose entry names the backend. */
	struct tc_nat_key ck = { .saddr = f->inner.daddr, .daddr = svc_addr, .sport = f->inner.dport, .dport = svc_port,
				 .proto = f->inner.proto };
	struct nodeport_nat_value *known = bpf_map_lookup_elem(&shunt_nodeport_nat, &ck);
	if (!known || known->reply || !known->dsr_in)
		return drop(skb, p, SHUNT_REASON_SERVICE_NO_BACKEND);
	if (nodeport_error_xlate(skb, f, ETH_HLEN + ip->ihl * 4, known) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	struct endpoint_info *ep = lookup_endpoint(f->daddr);
	if (!ep)
		return drop(skb, p, SHUNT_REASON_SERVICE_NO_BACKEND);
	count(SHUNT_REASON_DSR_DECAP, p->dir, skb->len);
	return admit_to_local_pod(skb, p, cfg, identity_of(f->saddr), ep);
}

/* nodeport_dsr_path_error takes ICMP fragmentation needed a router
 * between the nodes sent about one of this node's DSR packets: it goes to
 * the client, from the service address, naming the MTU less DSR's 28
 * bytes (dsr_path_error), counted and seen as frag-needed. Returns -1
 * when the packet is no such error (it goes on as before), else the
 * verdict. */
static __always_inline int nodeport_dsr_path_error(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg)
{
	int verdict;
	int r = dsr_path_error(skb, cfg->nodeport_dsr_ip4);

	if (r == 0)
		return -1;
	if (r < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	if (!pkt_begin(skb, p, &verdict))
		return verdict;
	return nodeport_send_out(skb, p, cfg, SHUNT_REASON_FRAG_NEEDED);
}

/* nodeport_from_dsr takes a DSR packet another node sent for a backend
 * of this node (lib/dsr.h): decapsulated, its flow recorded as one whose
 * backend is here (so the backend's reply gets the frontend from the
 * outer header's option as its source and leaves from this node, and the
 * client's later packets are translated here too should the route to a
 * load balancer address move to this node), then judged by the pod's
 * ingress policy as the client, whose address it keeps. An ICMP error
 * about such a flow's reply is translated for the backend
 * (nodeport_dsr_error). Returns -1 when
 * the packet is no DSR packet for this node, else the verdict. Only a
 * node of the cluster sends DSR packets: another outer source is dropped
 * as dsr-unknown-node (lib/dsr.h). Only an outside client's flow comes
 * this way: an inner source that is a pod or a node of the cluster is
 * dropped as spoofed. */
static __always_inline int nodeport_from_dsr(struct __sk_buff *skb, const volatile struct shunt_config *cfg)
{
	struct pkt p = { .dir = SHUNT_DIR_FROM_UPLINK, .point = FLOW_POINT_FROM_UPLINK, .src_identity = SHUNT_ID_WORLD };
	__u32 svc_addr = 0, outer_src = 0;
	__u16 svc_port = 0;
	int verdict;
	int r = dsr_decap(skb, cfg, &svc_addr, &svc_port, &outer_src);

	if (r == 0)
		return nodeport_dsr_path_error(skb, &p, cfg);
	if (r == DSR_DECAP_UNKNOWN_NODE) {
		/* Seen as what arrived: the stranger's IPIP to this node. */
		p.f.saddr = outer_src;
		p.f.daddr = cfg->nodeport_dsr_ip4;
		p.f.proto = IPPROTO_IPIP;
		return drop(skb, &p, SHUNT_REASON_DSR_UNKNOWN_NODE);
	}
	if (r < 0)
		return drop(skb, &p, r == DSR_DECAP_GSO_UNSUPPORTED ? SHUNT_REASON_DSR_GSO_DECAP : SHUNT_REASON_INVALID_PACKET);
	struct iphdr *ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	p.orig_daddr = svc_addr;
	p.orig_dport = svc_port;
	struct ipcache_value *from = ipcache_lookup(p.f.saddr);
	if (lookup_endpoint(p.f.saddr) || (from && (from->tunnel_ip4 || from->identity == SHUNT_ID_HOST ||
						   from->identity == SHUNT_ID_REMOTE_NODE)))
		return drop(skb, &p, SHUNT_REASON_TUNNEL_SPOOFED);
	if (p.f.icmp_error)
		return nodeport_dsr_error(skb, &p, ip, cfg, svc_addr, svc_port);
	if ((p.f.proto != IPPROTO_TCP && p.f.proto != IPPROTO_UDP) || !p.f.has_ports)
		return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	struct endpoint_info *ep = lookup_endpoint(p.f.daddr);
	if (!ep)
		return drop(skb, &p, SHUNT_REASON_SERVICE_NO_BACKEND);

	struct tc_nat_key ck = { .saddr = p.f.saddr, .daddr = svc_addr, .sport = p.f.sport, .dport = svc_port, .proto = p.f.proto };
	struct nodeport_nat_value fwd = {};
	struct nodeport_nat_value *known = bpf_map_lookup_elem(&shunt_nodeport_nat, &ck);
	if (known && !known->reply && known->daddr == p.f.daddr && known->dport == p.f.dport) {
		nodeport_refresh(&ck, known, p.f.tcp_flags, nat_now());
	} else {
		__u32 reason = nodeport_direct(&ck, p.f.daddr, p.f.dport, &fwd, 1);
		if (reason)
			return drop(skb, &p, reason);
		p.event = FLOW_EV_CONN_NEW;
	}
	count(SHUNT_REASON_DSR_DECAP, p.dir, skb->len);
	return admit_to_local_pod(skb, &p, cfg, identity_of(p.f.saddr), ep);
}

#endif
