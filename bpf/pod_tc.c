// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc programs on the host side of pod veths.
 *
 * shunt_from_pod runs at ingress of the host veth, i.e. on every packet a pod
 * sends. It checks the source is the pod's own address (of ARP frames too,
 * lib/arp.h), translates service
 * traffic no socket hook translated, applies policy (the sender's egress and,
 * for a local destination, the receiver's ingress) to new connections, and
 * routes a packet for another local pod here, in BPF: MACs rewritten, TTL
 * decremented, handed straight to the destination's veth, so it never enters
 * the host IP stack. A packet for a pod of another node is encapsulated to
 * that node (lib/encap.h) when the node has an overlay, or routed out of
 * the underlay as it is (lib/native.h) with native routing; its ingress
 * policy is judged there (bpf/overlay_tc.c, bpf/uplink_tc.c). Anything
 * else (node addresses, outside) goes to the host stack.
 *
 * shunt_to_pod runs at egress of the host veth: on packets the host stack
 * (or bpf_redirect) delivers to the pod. It applies the pod's ingress policy
 * to connections that did not come through shunt_from_pod: from the node
 * and from outside.
 */
/* shunt_from_pod has no stack to spare: policy's judgement of a new
 * connection gets a frame of its own (lib/policy.h, policy_admit_new). */
#define POLICY_JUDGE_OWN_FRAME
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
#include "lib/proxy.h"
#include "lib/encap.h"
#include "lib/native.h"
#include "lib/arp.h"
#include "lib/nodeport.h"

char __license[] SEC("license") = "Dual BSD/GPL";

volatile const struct shunt_config CONFIG = {};

/* Never read: they put these enums into the object's BTF, so bpf2go
 * generates their values for the agent instead of a hand-kept copy. */
const volatile enum shunt_identity _btf_identity = 0;
const volatile enum policy_verdict _btf_verdict = 0;
const volatile enum endpoint_flags _btf_endpoint_flags = 0;
const volatile enum shunt_reason _btf_reason = 0;
const volatile enum shunt_direction _btf_direction = 0;
const volatile enum flow_icmp_error _btf_flow_icmp_error = 0;
const volatile enum shunt_metrics_layout _btf_metrics_layout = 0;
const volatile enum flow_mode _btf_flow_mode = 0;
const volatile enum flow_verdict _btf_flow_verdict = 0;
const volatile enum flow_event_type _btf_flow_event = 0;
const volatile enum flow_point _btf_flow_point = 0;
const volatile struct flow_event _btf_flow_event_struct = {};
const volatile enum ct_flags _btf_ct_flags = 0;
const volatile enum proxy_origin_flags _btf_proxy_origin_flags = 0;
const volatile enum shunt_tcp_option _btf_tcp_option = 0;

/* proxy_origin_of: the original destination of a SYN a socket hook sent to
 * a proxy (the node's, or a pod's own), NULL for any other packet. */
static __always_inline struct proxy_origin *proxy_origin_of(struct flow *f)
{
	if (!tcp_opens(f->proto, f->tcp_flags))
		return NULL;
	struct proxy_origin_key key = {
		.client_ip = f->saddr, .client_port = f->sport, .proxy_ip = f->daddr, .proxy_port = f->dport,
	};
	return bpf_map_lookup_elem(&shunt_proxy_origins, &key);
}

/* Backends of a service a SYN to the node proxy is judged against, at most:
 * a bounded loop the verifier walks through once per backend. */
#define PROXY_L4_MAX_BACKENDS 16

/* service_l4_refusal: the L3/L4 verdict the client src (a pod of this
 * node; p its SYN) would meet dialling the service port vip:vport (network
 * order) without the proxy. The proxy picks the backend itself, so the client is refused only
 * when every backend refuses it (its egress toward the backend, and the
 * backend's ingress where the backend is a pod of this node: another
 * node's pods judge the proxy's upstream connection, as this client,
 * themselves). Returns 0 to admit, else the last backend's drop reason,
 * its rule and identity in p's rule and dst_identity (any refusing
 * backend's explains the drop; the last one's needs no copy of them: a
 * frame no larger than Linux < 6.9 takes after shunt_from_pod's, see
 * TestStackFitsOlderVerifiers). A service that cannot be read, or has more
 * backends than are judged here, is admitted: the proxy's upstream
 * connection is judged as the client. A global function, verified once on
 * its own: inlined, its loop would multiply the states of shunt_from_pod
 * past the verifier's limit. */
__noinline int service_l4_refusal(struct policy_side *src, struct pkt *p, __u32 vip, __u32 vport)
{
	if (!src || !p)
		return 0;
	struct flow *f = &p->f;
	struct service_key key = { .vip = vip, .port = (__u16)vport, .proto = IPPROTO_TCP };
	int refused = 0;

	struct service_value *svc = bpf_map_lookup_elem(&shunt_services, &key);
	if (!svc || svc->backend_count == 0 || svc->backend_count > PROXY_L4_MAX_BACKENDS)
		return 0;
	__u16 count = svc->backend_count;
	for (__u16 i = 1; i <= PROXY_L4_MAX_BACKENDS; i++) {
		if (i > count)
			break;
		key.slot = i;
		struct service_value *slot = bpf_map_lookup_elem(&shunt_services, &key);
		if (!slot)
			return 0;
		struct backend_value *be = bpf_map_lookup_elem(&shunt_backends, &slot->id);
		if (!be)
			return 0;
		struct policy_side dst = { .addr = be->ip };
		struct endpoint_info *ep = lookup_endpoint(be->ip);
		if (ep) {
			dst.identity = ep->identity;
			dst.flags = ep->flags;
			dst.local = true;
		} else {
			dst.identity = identity_of(be->ip);
		}
		__u32 reason = policy_judge(f, src, &dst, be->port, &p->rule);
		if (!reason)
			return 0;
		refused = reason;
		p->dst_identity = dst.identity;
	}
	return refused;
}

/* ct_track is ct_find (the packet's conntrack lookup) as a global
 * function, verified once on its own: inlined at its call sites, its
 * branches would multiply the states of shunt_from_pod. Returns whether
 * the packet belongs to a live connection. */
__noinline int ct_track(struct flow *f, struct ct_found *found)
{
	if (!f || !found)
		return 0;
	ct_find(f, found);
	return found->live;
}

/* to_tunnel sends a packet to the node hosting its destination: one hop,
 * then encapsulated with the sender's identity as the VNI; a packet too
 * big for the tunnel that must not be fragmented is answered with ICMP
 * fragmentation needed instead, so its sender learns the path's MTU. */
static __always_inline int to_tunnel(struct __sk_buff *skb, struct pkt *p, __u32 tunnel_ip4)
{
	__u32 mtu;
	int size = encap_too_big(skb, &CONFIG, &mtu);

	if (size == ENCAP_SIZE_TOO_BIG)
		return encap_answer_too_big(skb, p, &CONFIG, mtu);
	int verdict = forward_hop(skb, p);
	if (verdict >= 0)
		return verdict;
	if (!pod_identity(p->src_identity))
		return drop(skb, p, SHUNT_REASON_TUNNEL_KEY_FAILED);
	/* The hop leaves the length as it was: a packet found to fit still
	 * fits, and encap_in_bpf need not check it again. */
	__u32 reason = encap_to_node(skb, &CONFIG, tunnel_ip4, p->src_identity, size == ENCAP_SIZE_FITS);
	if (reason)
		return drop(skb, p, reason);
	done(skb, p, FLOW_FORWARDED, SHUNT_REASON_TO_TUNNEL);
	return TC_ACT_REDIRECT;
}

SEC("tc")
int shunt_from_pod(struct __sk_buff *skb)
{
	struct endpoint_info *ep;
	struct iphdr *ip;
	struct pkt p = { .dir = SHUNT_DIR_FROM_POD, .point = FLOW_POINT_FROM_POD };
	int verdict;

	verdict = arp_from_pod(skb, &p);
	if (verdict >= 0)
		return verdict;
	ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;

	/* A pod may only send from its own address: policy trusts the
	 * source identity, so a forged one must not get through. */
	ep = lookup_endpoint(p.f.saddr);
	if (!ep || ep->ifindex != skb->ifindex)
		return drop(skb, &p, SHUNT_REASON_SPOOFED);
	struct policy_side src = {
		.addr = p.f.saddr, .identity = ep->identity, .flags = ep->flags, .local = true,
	};
	p.src_identity = ep->identity;

	__u32 reason;
	/* A pod's own proxy answering a client from off the node: the port
	 * the client dialled back, before anything looks at the tuple. */
	if (ep->flags & ENDPOINT_F_OWN_PROXY) {
		reason = pod_proxy_out(skb, &p);
		if (reason)
			return drop(skb, &p, reason);
		/* A rewrite moves the packet: read the header again. */
		void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
		ip = data + ETH_HLEN;
		if ((void *)(ip + 1) > data_end)
			return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	}
	/* Conntrack first: a packet of a connection the service translation
	 * left alone when it began (CT_F_NO_TC_NAT) skips its lookups, and
	 * policy reuses this lookup unless the translation changes the
	 * tuple (then the connection is the translated one's). A pod's
	 * packets are mostly of such connections: the socket hooks
	 * translated the service's. */
	struct ct_found found = {};
	ct_track(&p.f, &found);
	if (!found.live || !(found.flags & CT_F_NO_TC_NAT)) {
		bool retargeted;

		/* A reply is translated too, its tuple kept (the backend's
		 * source): not a connection to mark either. */
		verdict = tc_service_nat_pkt(skb, ip, &p, &retargeted);
		if (verdict >= 0)
			return verdict;
		if (retargeted)
			ct_track(&p.f, &found);
	}

	struct policy_side dst = { .addr = p.f.daddr };
	struct proxy_origin *origin = proxy_origin_of(&p.f);
	bool via_proxy = false;
	__u32 tunnel_ip4 = 0;
	ep = lookup_endpoint(p.f.daddr);
	if (ep) {
		dst.identity = ep->identity;
		dst.flags = ep->flags;
		dst.local = true;
		/* A pod's own proxy (inbound redirect): policy judges the port
		 * the client dialled, not the proxy's. */
		if (origin && origin->ip == p.f.daddr)
			dst.judged_dport = origin->port;
	} else {
		struct ipcache_value *remote = ipcache_lookup(p.f.daddr);

		dst.identity = remote ? remote->identity : SHUNT_ID_WORLD;
		tunnel_ip4 = remote ? remote->tunnel_ip4 : 0;
		via_proxy = origin != NULL;
		struct endpoint_info *oep = origin ? lookup_endpoint(origin->ip) : NULL;
		if (oep) {
			/* The node proxy will act for the client toward a pod of
			 * this node: admit the connection to the proxy only if
			 * the client could connect to that pod and port itself,
			 * so a denied client is dropped here, as without the proxy. */
			dst.addr = origin->ip;
			dst.identity = oep->identity;
			dst.flags = oep->flags;
			dst.local = true;
			dst.judged_dport = origin->port;
		} else if (origin) {
			/* A service: the proxy picks the backend, and its upstream
			 * connection is judged as the client (the mark). A client
			 * every backend refuses at L4 is dropped here, at its SYN,
			 * as it would be without the proxy: no handshake with the
			 * proxy, and the flow names the service it dialled. */
			dst.proxy = true;
			reason = service_l4_refusal(&src, &p, origin->ip, origin->port);
			if (reason) {
				p.event = FLOW_EV_CONN_NEW;
				p.orig_daddr = origin->ip;
				p.orig_dport = origin->port;
				return drop(skb, &p, reason);
			}
		}
	}
	p.dst_identity = dst.identity;
	reason = policy_admit_found(skb, &p, &CONFIG, &src, &dst, &found);
	if (reason)
		return drop(skb, &p, reason);
	/* On the node proxy's connection from a client's address: to the
	 * proxy, wherever that address routes. */
	if (p.ct_flags & CT_F_PROXY_UPSTREAM)
		return steer_proxy_reply(skb, &p, &CONFIG);

	if (!ep) {
		if (via_proxy && p.event == FLOW_EV_CONN_NEW) {
			done(skb, &p, FLOW_REDIRECTED_PROXY, SHUNT_REASON_PROXY_ADMITTED);
			return TC_ACT_OK;
		}
		/* A pod of another node: the sender's egress is judged (above),
		 * the receiver's ingress on the receiving node. A local
		 * backend's reply to such a pod that reached a NodePort of this
		 * node (no socket of its node translated its packets) leaves
		 * with the frontend as its source (lib/nodeport.h). */
		if (tunnel_ip4) {
			verdict = nodeport_reply(skb, &p, &CONFIG);
			if (verdict >= 0)
				return verdict;
		}
		if (tunnel_ip4 && CONFIG.tunnel_ifindex)
			return to_tunnel(skb, &p, tunnel_ip4);
		if (tunnel_ip4 && CONFIG.native_ifindex)
			return to_node_routed(skb, &p, &CONFIG);
		/* A reply to a client outside that reached a Service of this
		 * node from there (lib/nodeport.h). */
		verdict = nodeport_reply(skb, &p, &CONFIG);
		if (verdict >= 0)
			return verdict;
		done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_TO_STACK);
		return TC_ACT_OK;
	}
	return to_local_pod(skb, &p, ep, CONFIG.fwd_mode);
}

SEC("tc")
int shunt_to_pod(struct __sk_buff *skb)
{
	struct endpoint_info *ep;
	struct iphdr *ip;
	struct pkt p = { .dir = SHUNT_DIR_TO_POD, .point = FLOW_POINT_TO_POD };
	int verdict;

	ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	ep = lookup_endpoint(p.f.daddr);
	if (!ep) {
		/* Not addressed to the pod (broadcast, a stale route): the
		 * pod's stack decides, policy has nothing to protect. */
		done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_TO_STACK);
		return TC_ACT_OK;
	}
	struct policy_side dst = {
		.addr = p.f.daddr, .identity = ep->identity, .flags = ep->flags, .local = true,
	};
	struct policy_side src = { .addr = p.f.saddr };
	__u32 client;
	bool marked = proxy_marked(&CONFIG, skb->mark, &client);
	/* Conntrack first: a packet of a known connection needs none of the
	 * sender's lookups below (they serve policy, which judged its
	 * connection when it began), only its identity when its flow is
	 * reported. A connection recorded here is one the tc service
	 * translation leaves alone (CT_F_NO_TC_NAT: the pod's answers skip
	 * it): a connection that translation made was recorded by the
	 * program that translated it, before its packets reach this one... */
	struct ct_found found = {};
	ct_track(&p.f, &found);
	/* ...but a backend's reply that the tc translation gave a service
	 * frontend as its source (with bpf_redirect, its way to the client
	 * pod crosses this program) opens no record of its own there: the
	 * client's next packets to the frontend must be translated. */
	if (!found.live && !(p.f.has_ports && lookup_service(p.f.saddr, p.f.sport, p.f.proto)))
		p.ct_new_flags = CT_F_NO_TC_NAT;
	if (marked) {
		/* The node proxy connecting for a client: policy judges the
		 * connection as that client, its egress included (a local
		 * endpoint of the same identity has the same rules). */
		src.identity = client;
		if (!found.live && identity_of(p.f.saddr) != SHUNT_ID_HOST) {
			/* A connection from the client's own address, not the
			 * node's (original source: a client from off the node
			 * that tc steered to the proxy, whose own node judged
			 * its egress): judged by that address (its CIDR
			 * identity) and identity as without the proxy; the pod's
			 * answers go back to the proxy's socket. Asked of every
			 * packet without a record, not only SYNs: a connection
			 * whose record was evicted is recorded again by its next
			 * packet, and must be again the proxy's. */
			p.ct_new_flags |= CT_F_PROXY_UPSTREAM;
		} else if (!found.live) {
			struct identity_endpoint *ie = bpf_map_lookup_elem(&shunt_identity_endpoints, &client);

			if (ie) {
				src.addr = ie->ip;
				src.flags = ie->flags;
				src.local = true;
			}
		}
	} else if (!found.live) {
		src.identity = identity_of(p.f.saddr);
	}
	p.src_identity = src.identity;
	p.dst_identity = dst.identity;
	__u32 reason = policy_admit_found(skb, &p, &CONFIG, &src, &dst, &found);
	if (reason)
		return drop(skb, &p, reason);
	if (!marked && found.live && pkt_reported(&p, FLOW_FORWARDED))
		p.src_identity = identity_of(p.f.saddr);
	done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_FORWARDED);
	return TC_ACT_OK;
}
