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
#include "pkt.h"
#include "policy.h"
#include "proxy.h"

/* steer_wanted says whether f goes to a local pod's port the node proxy
 * takes: an L7 redirect to a proxy that is not the pod's own (a pod's own
 * inbound proxy listens at the pod's address). */
static __always_inline bool steer_wanted(struct flow *f)
{
	if (f->proto != IPPROTO_TCP || !f->has_ports)
		return false;
	struct l7_redirect_key key = { .ip = f->daddr, .port = f->dport, .proto = IPPROTO_TCP };
	struct l7_redirect_value *r = bpf_map_lookup_elem(&shunt_l7_redirect, &key);

	return r && r->proxy_ip != f->daddr;
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
	bool syn = (p->f.tcp_flags & (SHUNT_TCPF_SYN | SHUNT_TCPF_ACK)) == SHUNT_TCPF_SYN;
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
