// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc programs on the host side of pod veths.
 *
 * shunt_from_pod runs at ingress of the host veth, i.e. on every packet a pod
 * sends. It checks the source is the pod's own address, translates service
 * traffic no socket hook translated, applies policy (the sender's egress and,
 * for a local destination, the receiver's ingress) to new connections, and
 * routes a packet for another local pod here, in BPF: MACs rewritten, TTL
 * decremented, handed straight to the destination's veth, so it never enters
 * the host IP stack. Anything else (node addresses, outside) goes to the
 * host stack.
 *
 * shunt_to_pod runs at egress of the host veth: on packets the host stack
 * (or bpf_redirect) delivers to the pod. It applies the pod's ingress policy
 * to connections that did not come through shunt_from_pod: from the node
 * and from outside.
 */
#include "lib/common.h"
#include "lib/metrics.h"
#include "lib/endpoints.h"
#include "lib/flow.h"
#include "lib/tc_nat.h"
#include "lib/policy.h"
#include "lib/flows.h"
#include "lib/proxy.h"

char __license[] SEC("license") = "Dual BSD/GPL";

volatile const struct shunt_config CONFIG = {};

/* Never read: they put these enums into the object's BTF, so bpf2go
 * generates their values for the agent instead of a hand-kept copy. */
const volatile enum shunt_identity _btf_identity = 0;
const volatile enum policy_verdict _btf_verdict = 0;
const volatile enum endpoint_flags _btf_endpoint_flags = 0;
const volatile enum shunt_reason _btf_reason = 0;
const volatile enum shunt_direction _btf_direction = 0;
const volatile enum shunt_metrics_layout _btf_metrics_layout = 0;
const volatile enum flow_mode _btf_flow_mode = 0;
const volatile enum flow_verdict _btf_flow_verdict = 0;
const volatile enum flow_event_type _btf_flow_event = 0;
const volatile enum flow_point _btf_flow_point = 0;
const volatile struct flow_event _btf_flow_event_struct = {};
const volatile enum ct_flags _btf_ct_flags = 0;

/* proxy_origin_of: the original destination of a SYN a socket hook sent to
 * a proxy (the node's, or a pod's own), NULL for any other packet. */
static __always_inline struct proxy_origin *proxy_origin_of(struct flow *f)
{
	if (f->proto != IPPROTO_TCP || (f->tcp_flags & (SHUNT_TCPF_SYN | SHUNT_TCPF_ACK)) != SHUNT_TCPF_SYN)
		return NULL;
	struct proxy_origin_key key = {
		.client_ip = f->saddr, .client_port = f->sport, .proxy_ip = f->daddr, .proxy_port = f->dport,
	};
	return bpf_map_lookup_elem(&shunt_proxy_origins, &key);
}

#define IP_TTL_OFF (ETH_HLEN + __builtin_offsetof(struct iphdr, ttl))

/* Decrement the TTL as a router would; the checksum is patched incrementally
 * over the 16-bit word that holds TTL and protocol. */
static __always_inline int ip_dec_ttl(struct __sk_buff *skb, struct iphdr *ip)
{
	__u16 old = bpf_htons((__u16)ip->ttl << 8 | ip->protocol);
	__u16 new = bpf_htons((__u16)(ip->ttl - 1) << 8 | ip->protocol);
	__u8 ttl = ip->ttl - 1;

	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, old, new, sizeof(__u16)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, IP_TTL_OFF, &ttl, sizeof(ttl), 0);
}

/* ipv4_header returns the IPv4 header of an Ethernet frame, or NULL with
 * *verdict set: TC_ACT_OK for what is not IPv4, TC_ACT_SHOT for malformed. */
static __always_inline struct iphdr *ipv4_header(struct __sk_buff *skb, __u32 dir, int *verdict)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;

	if ((void *)(eth + 1) > data_end) {
		count(SHUNT_REASON_INVALID_PACKET, dir, skb->len);
		*verdict = TC_ACT_SHOT;
		return NULL;
	}
	if (eth->h_proto != bpf_htons(ETH_P_IP)) {
		count(SHUNT_REASON_NOT_IPV4, dir, skb->len);
		*verdict = TC_ACT_OK;
		return NULL;
	}
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->ihl < 5) {
		count(SHUNT_REASON_INVALID_PACKET, dir, skb->len);
		*verdict = TC_ACT_SHOT;
		return NULL;
	}
	return ip;
}

/* What one packet's flow event reports, filled in along the way. */
struct pkt {
	struct flow f;
	__u32 dir;         /* enum shunt_direction, also the flow point */
	__u32 orig_daddr;  /* before the tc service translation */
	__u16 orig_dport;
	__u32 src_identity;
	__u32 dst_identity;
	__u32 rule;
	__u8 event;        /* enum flow_event_type */
	__u32 failed;      /* a record that could not be made on the way (enum shunt_reason), 0 if none */
};

/* done counts a packet's outcome and, when the sampling wants it, reports
 * it. A record that could not be made on the way (counted where it failed)
 * is news even when the packet went on: the event names it as its reason
 * and is sent whenever flows are on. */
static __always_inline void done(struct __sk_buff *skb, struct pkt *p, __u8 verdict, __u32 reason)
{
	count(reason, p->dir, skb->len);
	__u8 event = verdict == FLOW_DROPPED ? FLOW_EV_DROP : p->event;
	__u32 mode = flow_mode();
	if (!flow_wanted(mode, event) && !(p->failed && mode != FLOW_MODE_OFF))
		return;
	if (verdict != FLOW_DROPPED && p->failed)
		reason = p->failed;
	struct flow_event e = {
		.saddr = p->f.saddr, .daddr = p->f.daddr, .sport = p->f.sport, .dport = p->f.dport,
		.proto = p->f.proto, .tcp_flags = p->f.tcp_flags, .verdict = verdict, .reason = reason,
		.point = p->dir, .event = event, .ifindex = skb->ifindex, .src_identity = p->src_identity,
		.dst_identity = p->dst_identity, .rule_id = p->rule, .len = skb->len,
	};
	if (p->orig_daddr != p->f.daddr || p->orig_dport != p->f.dport) {
		e.orig_daddr = p->orig_daddr;
		e.orig_dport = p->orig_dport;
	}
	flow_emit(&e);
}

static __always_inline int drop(struct __sk_buff *skb, struct pkt *p, __u32 reason)
{
	done(skb, p, FLOW_DROPPED, reason);
	return TC_ACT_SHOT;
}

SEC("tc")
int shunt_from_pod(struct __sk_buff *skb)
{
	struct endpoint_info *ep;
	struct iphdr *ip;
	struct pkt p = { .dir = SHUNT_DIR_FROM_POD };
	int verdict;
	long ret;

	ip = ipv4_header(skb, SHUNT_DIR_FROM_POD, &verdict);
	if (!ip)
		return verdict;
	if (parse_flow(skb, ip, &p.f) < 0)
		return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	p.orig_daddr = p.f.daddr;
	p.orig_dport = p.f.dport;

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
	verdict = tc_service_nat(skb, ip, &p.f, &reason);
	if (verdict >= 0)
		return drop(skb, &p, reason);
	p.failed = reason;

	struct policy_side dst = { .addr = p.f.daddr };
	struct proxy_origin *origin = proxy_origin_of(&p.f);
	bool via_proxy = false;
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
		dst.identity = identity_of(p.f.daddr);
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
			 * connection is judged as the client (the mark). */
			dst.proxy = true;
		}
	}
	p.dst_identity = dst.identity;
	reason = policy_admit(&p.f, &src, &dst, &p.rule, &p.event);
	if (reason)
		return drop(skb, &p, reason);

	if (!ep) {
		if (via_proxy && p.event == FLOW_EV_CONN_NEW) {
			done(skb, &p, FLOW_REDIRECTED_PROXY, SHUNT_REASON_PROXY_ADMITTED);
			return TC_ACT_OK;
		}
		done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_TO_STACK);
		return TC_ACT_OK;
	}
	/* Copy what we need before helpers invalidate packet pointers. */
	__u32 ifindex = ep->ifindex;
	__u8 macs[12];
	__builtin_memcpy(macs, ep->pod_mac, 6);
	__builtin_memcpy(macs + 6, ep->node_mac, 6);

	/* Helpers may have moved the packet: reload the header. */
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > data_end)
		return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	/* Let the stack generate ICMP time exceeded. */
	if (ip->ttl <= 1) {
		done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_TTL_EXCEEDED);
		return TC_ACT_OK;
	}
	if (ip_dec_ttl(skb, ip) < 0 || bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) < 0)
		return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);

	if (CONFIG.fwd_mode == SHUNT_FWD_REDIRECT_PEER)
		ret = bpf_redirect_peer(ifindex, 0);
	else
		ret = bpf_redirect(ifindex, 0);
	if (ret != TC_ACT_REDIRECT)
		return drop(skb, &p, SHUNT_REASON_REDIRECT_FAILED);
	done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_FORWARDED);
	return TC_ACT_REDIRECT;
}

SEC("tc")
int shunt_to_pod(struct __sk_buff *skb)
{
	struct endpoint_info *ep;
	struct iphdr *ip;
	struct pkt p = { .dir = SHUNT_DIR_TO_POD };
	int verdict;

	ip = ipv4_header(skb, SHUNT_DIR_TO_POD, &verdict);
	if (!ip)
		return verdict;
	if (parse_flow(skb, ip, &p.f) < 0)
		return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	p.orig_daddr = p.f.daddr;
	p.orig_dport = p.f.dport;
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
	if (proxy_marked(&CONFIG, skb->mark, &client)) {
		/* The node proxy connecting for a client: policy judges the
		 * connection as that client, its egress included (a local
		 * endpoint of the same identity has the same rules). */
		struct identity_endpoint *ie = bpf_map_lookup_elem(&shunt_identity_endpoints, &client);

		src.identity = client;
		if (ie) {
			src.addr = ie->ip;
			src.flags = ie->flags;
			src.local = true;
		}
	} else {
		src.identity = identity_of(p.f.saddr);
	}
	p.src_identity = src.identity;
	p.dst_identity = dst.identity;
	__u32 reason = policy_admit(&p.f, &src, &dst, &p.rule, &p.event);
	if (reason)
		return drop(skb, &p, reason);
	done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_FORWARDED);
	return TC_ACT_OK;
}
