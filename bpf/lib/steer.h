/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Steering to the node proxy in tc, for clients no socket hook of this node
 * sees: another node's pods (native routing, or the overlay without the
 * client's node proxy), clients outside reaching a local backend through a
 * NodePort. The socket hooks send a local client's connect to the proxy
 * (bpf/sock_addr.c); a packet from off the node for a local pod's port the
 * node proxy takes (shunt_l7_redirect) is instead given here, where it
 * enters the node (tc ingress of the uplink or the overlay device), to the
 * proxy's transparent listener with bpf_sk_assign, as Cilium replaced
 * TPROXY. The packet keeps its addresses, so the socket the proxy accepts
 * has the original destination (the pod's address and port) as its local
 * address and the client's as its peer; replies leave from that address
 * (a transparent socket may). The packet gets cfg->proxy_steer_mark, which
 * the node's routing rule sends to a table whose only route is
 * `local 0.0.0.0/0 dev lo`: delivered to the stack, not forwarded to the
 * pod. Later packets find the connection's socket by their tuple (the
 * request socket, then the accepted one) and are assigned to it the same
 * way.
 *
 * Fail closed: a SYN to such a port that cannot be given to the proxy (no
 * steering configured, no listener, the assign refused) is dropped
 * (proxy-steer-failed), never passed around the proxy to the pod. */
#ifndef SHUNT_LIB_STEER_H
#define SHUNT_LIB_STEER_H

#include "common.h"
#include "lru.h"
#include "pkt.h"
#include "policy.h"
#include "proxy.h"
#include "tc_nat.h"

/* steer_port says whether TCP to daddr:dport (network byte order) goes to
 * a local pod's port the node proxy takes (steer_wanted). */
static __always_inline bool steer_port(__u32 daddr, __u16 dport)
{
	struct l7_redirect_key key = { .ip = daddr, .port = dport, .proto = IPPROTO_TCP };
	struct l7_redirect_value *r = bpf_map_lookup_elem(&shunt_l7_redirect, &key);

	return r && r->proxy_ip != daddr;
}

/* steer_wanted says whether f goes to a local pod's port the node proxy
 * takes: an L7 redirect to a proxy that is not the pod's own (a pod's own
 * inbound proxy listens at the pod's address). */
static __always_inline bool steer_wanted(struct flow *f)
{
	return f->proto == IPPROTO_TCP && f->has_ports && steer_port(f->daddr, f->dport);
}

/* steer_socket finds the socket a steered packet goes to: the
 * connection's own (a request socket or the socket the proxy accepted,
 * found by the packet's tuple), or, for a SYN, the proxy's listener.
 * NULL when there is none; a socket found must be released. */
static __always_inline struct bpf_sock *steer_socket(struct __sk_buff *skb, struct flow *f,
						     const volatile struct shunt_config *cfg, bool syn)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;

	t.ipv4.saddr = f->saddr;
	t.ipv4.daddr = f->daddr;
	t.ipv4.sport = f->sport;
	t.ipv4.dport = f->dport;
	sk = bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (sk) {
		/* A node listener on the pod's port (bound to any address) or
		 * a closed connection's remains are not the proxy's. */
		if (sk->state != BPF_TCP_LISTEN && sk->state != BPF_TCP_TIME_WAIT)
			return sk;
		bpf_sk_release(sk);
	}
	if (!syn || !cfg->proxy_steer_port)
		return NULL;
	t.ipv4.daddr = cfg->proxy_steer_ip4;
	t.ipv4.dport = cfg->proxy_steer_port;
	sk = bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (sk && sk->state != BPF_TCP_LISTEN) {
		bpf_sk_release(sk);
		return NULL;
	}
	return sk;
}

/* steer_to_proxy gives a packet from off the node, admitted at L3/L4 for
 * the local pod it is addressed to, to the node proxy when the pod's port
 * has HTTP rules (steer_wanted). src_identity is the identity policy
 * judged the sender by: a connection whose identity is not its address's
 * (another node's proxy acting for its client, the VNI carrying the
 * client's identity) had its requests decided by that proxy and goes on
 * to the pod. Returns -1 to go on to the pod, else the verdict: TC_ACT_OK
 * with the socket assigned, or a drop (proxy-steer-failed) for a SYN that
 * could not be. A later packet with no socket of the proxy (a connection
 * begun before its port had HTTP rules) goes on to the pod. */
static __always_inline int steer_to_proxy(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg,
					  __u32 src_identity)
{
	if (!steer_wanted(&p->f) || identity_of(p->f.saddr) != src_identity)
		return -1;
	bool syn = tcp_opens(p->f.proto, p->f.tcp_flags);
	struct bpf_sock *sk = steer_socket(skb, &p->f, cfg, syn);

	if (!sk)
		return syn ? drop(skb, p, SHUNT_REASON_PROXY_STEER_FAILED) : -1;
	long err = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	if (err)
		return drop(skb, p, SHUNT_REASON_PROXY_STEER_FAILED);
	skb->mark = cfg->proxy_steer_mark;
	/* The overlay's inner frame is addressed to the sending pod's
	 * gateway, not to this node: the stack would not take it. */
	if (skb->pkt_type != PACKET_HOST && bpf_skb_change_type(skb, PACKET_HOST) < 0)
		return drop(skb, p, SHUNT_REASON_PROXY_STEER_FAILED);
	done(skb, p, FLOW_REDIRECTED_PROXY, SHUNT_REASON_PROXY_STEERED);
	return TC_ACT_OK;
}

/* rewrite_tcp_port replaces the destination (is_dst) or source port of a
 * TCP packet whose address on that side is addr, checksum included. */
static __always_inline int rewrite_tcp_port(struct __sk_buff *skb, __u32 addr, bool is_dst, __u16 old_port, __u16 new_port)
{
	__u8 ihl;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ihl, 1) < 0)
		return -1;
	return rewrite_l4(skb, ETH_HLEN + (ihl & 0xf) * 4, IPPROTO_TCP, is_dst, addr, addr, old_port, new_port);
}

/* pod_proxy_in sends a packet from off the node for a local pod's port
 * that the pod's own proxy takes (shunt.io/inbound-redirect: its
 * shunt_l7_redirect entry names the pod's own address) to that proxy, as
 * the connect hook does for the node's clients and iptables REDIRECT for a
 * sidecar: the destination port becomes the proxy's. A SYN files the
 * original destination under the connection's tuple as the proxy's socket
 * sees it (shunt_proxy_origins, PROXY_ORIGIN_F_TC), which the proxy's
 * SO_ORIGINAL_DST answers (bpf/sockopt.c) and pod_proxy_out reads to give
 * the pod's answers the dialled port back. A later packet of a connection
 * with no such record (begun before the redirect) goes on unchanged.
 * Policy judged the port dialled, before this. Returns 0, or the drop
 * reason. */
static __always_inline __u32 pod_proxy_in(struct __sk_buff *skb, struct pkt *p)
{
	struct flow *f = &p->f;

	if (f->proto != IPPROTO_TCP || !f->has_ports)
		return 0;
	struct l7_redirect_key rk = { .ip = f->daddr, .port = f->dport, .proto = IPPROTO_TCP };
	struct l7_redirect_value *r = bpf_map_lookup_elem(&shunt_l7_redirect, &rk);
	if (!r || r->proxy_ip != f->daddr)
		return 0;
	__u16 proxy_port = r->proxy_port;
	struct proxy_origin_key k = {
		.client_ip = f->saddr, .client_port = f->sport, .proxy_ip = f->daddr, .proxy_port = proxy_port,
	};
	if (tcp_opens(f->proto, f->tcp_flags)) {
		struct proxy_origin o = { .ip = f->daddr, .port = f->dport, .flags = PROXY_ORIGIN_F_TC };

		if (lru_insert(&shunt_proxy_origins, &k, &o, BPF_ANY) < 0)
			return SHUNT_REASON_PROXY_ORIGIN_FAILED;
	} else {
		struct proxy_origin *o = bpf_map_lookup_elem(&shunt_proxy_origins, &k);

		if (!o || !(o->flags & PROXY_ORIGIN_F_TC) || o->port != f->dport)
			return 0;
	}
	if (rewrite_tcp_port(skb, f->daddr, true, f->dport, proxy_port) < 0)
		return SHUNT_REASON_INVALID_PACKET;
	f->dport = proxy_port;
	return 0;
}

/* pod_proxy_out gives a packet a pod with its own proxy sends back the port
 * its client dialled, as its source, where pod_proxy_in sent the client's
 * connection to the proxy's port. Returns 0, or the drop reason. */
static __always_inline __u32 pod_proxy_out(struct __sk_buff *skb, struct pkt *p)
{
	struct flow *f = &p->f;

	if (f->proto != IPPROTO_TCP || !f->has_ports)
		return 0;
	struct proxy_origin_key k = {
		.client_ip = f->daddr, .client_port = f->dport, .proxy_ip = f->saddr, .proxy_port = f->sport,
	};
	struct proxy_origin *o = bpf_map_lookup_elem(&shunt_proxy_origins, &k);
	if (!o || !(o->flags & PROXY_ORIGIN_F_TC) || o->ip != f->saddr)
		return 0;
	__u16 port = o->port;
	if (rewrite_tcp_port(skb, f->saddr, false, f->sport, port) < 0)
		return SHUNT_REASON_INVALID_PACKET;
	f->sport = port;
	return 0;
}

/* steer_proxy_reply gives a local pod's packet on a connection the node
 * proxy made to it from its client's address (original source, for a
 * client steered here: CT_F_PROXY_UPSTREAM, set at the pod's veth by
 * shunt_to_pod) to the proxy's socket, found by the packet's tuple, with
 * bpf_sk_assign and cfg->proxy_steer_mark, whose routing rule delivers it
 * locally: addressed to the client, it would otherwise be routed to the
 * client itself. A packet whose socket is gone (the proxy closed it and
 * forgot it) is dropped: the client has no such connection. */
static __always_inline int steer_proxy_reply(struct __sk_buff *skb, struct pkt *p, const volatile struct shunt_config *cfg)
{
	struct bpf_sock_tuple t = {};

	t.ipv4.saddr = p->f.saddr;
	t.ipv4.daddr = p->f.daddr;
	t.ipv4.sport = p->f.sport;
	t.ipv4.dport = p->f.dport;
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return drop(skb, p, SHUNT_REASON_PROXY_STEER_FAILED);
	if (sk->state == BPF_TCP_LISTEN) {
		bpf_sk_release(sk);
		return drop(skb, p, SHUNT_REASON_PROXY_STEER_FAILED);
	}
	long err = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	if (err)
		return drop(skb, p, SHUNT_REASON_PROXY_STEER_FAILED);
	skb->mark = cfg->proxy_steer_mark;
	done(skb, p, FLOW_FORWARDED, SHUNT_REASON_PROXY_UPSTREAM_REPLY);
	return TC_ACT_OK;
}

#endif
