// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc programs on the node's uplink (the interface holding the node's
 * address): masquerade, without iptables.
 *
 * shunt_to_uplink runs at egress: a packet a local pod sent to a
 * destination outside the cluster (no pod, node or service address, nothing
 * the agent excluded) leaves from the node's address and a port allocated
 * for the flow (lib/masq.h); TCP, UDP and ICMP echo (the identifier is the
 * port). An ICMP error a pod sends about such a flow is translated too.
 * A reply of a connection opened to the pod (its tracking says the other
 * end opened it) is not such a flow and keeps the pod's address.
 * Everything else (the node's own traffic, the overlay's encapsulated
 * packets, pods' traffic inside the cluster) leaves as it is, uncounted:
 * it is not masquerade's.
 *
 * shunt_from_uplink runs at ingress: a reply to a masqueraded flow, or an
 * ICMP error quoting one (port unreachable, fragmentation needed), gets the
 * pod's address and port back, quote and checksums included, is judged by
 * the pod's connection tracking and policy as any packet from outside, and
 * is handed straight to the pod as the overlay program does. With native
 * routing (no encapsulation, lib/native.h) it is also where other nodes'
 * pods' packets for pods of this node arrive: judged by the pod's ingress
 * policy with the sender's identity from the ipcache, tracked, and handed
 * straight to the pod, as the overlay program does with the VNI's. Anything
 * else is the node's and goes to its stack, uncounted.
 *
 * It is also where traffic from outside reaches the node's NodePorts,
 * externalIPs and load balancer addresses (lib/nodeport.h), and where
 * replies of such flows from backends on other nodes come back (native
 * routing). With DSR (lib/dsr.h) it is also where another node's IPIP
 * carrying such a flow arrives for a backend of this node.
 *
 * The uplink programs are one per hook: masquerade, native routing and
 * NodePort share them, each part off when its configuration is (MASQ.addr,
 * CONFIG.native_ifindex, CONFIG.uplink_ifindex). The overlay's own
 * packets (VXLAN to the node) go to the overlay program at the first look
 * (overlay_arrival, shunt_overlay_wire).
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
#include "lib/masq.h"
#include "lib/nodeport.h"
#include "lib/carried_identity.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Slot 0: the overlay program that takes VXLAN off the wire
 * (bpf/overlay_tc.c, shunt_from_overlay_wire), which the agent puts here
 * when it loads both. A tail call rather than code of this program: it
 * runs with a stack of its own (both programs' frames together would pass
 * the 512 bytes older verifiers count in 32-byte frames). Empty (no
 * overlay), the call returns and the packet goes to the stack as before. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} shunt_overlay_wire SEC(".maps");

volatile const struct shunt_config CONFIG = {};
volatile const struct masq_config MASQ = {};

/* Never read: they put these enums into the object's BTF (see pod_tc.c). */
const volatile enum masq_dir _btf_masq_dir = 0;
const volatile enum masq_flags _btf_masq_flags = 0;
const volatile enum service_flags _btf_service_flags = 0;
const volatile enum nodeport_mode _btf_nodeport_mode = 0;

/* uplink_addrs reads the addresses of an IPv4 packet ([0] source, [1]
 * destination); false for anything else. */
static __always_inline bool uplink_addrs(struct __sk_buff *skb, __u32 addrs[2])
{
	return skb->protocol == bpf_htons(ETH_P_IP) && bpf_skb_load_bytes(skb, IP_SRC_OFF, addrs, 8) == 0;
}

static __always_inline int icmp_type(struct __sk_buff *skb, __u32 l4off)
{
	__u8 type;

	if (bpf_skb_load_bytes(skb, l4off, &type, sizeof(type)) < 0)
		return -1;
	return type;
}

/* error_out translates an ICMP error a pod sends about a masqueraded flow
 * (a reply that found its socket closed): it leaves from the node's
 * address, quoting what the outside sent to the node. An error about
 * anything else leaves as it is. */
static __always_inline int error_out(struct __sk_buff *skb, struct pkt *p, __u32 l4off, __u64 now)
{
	struct masq_key k = {
		.saddr = p->f.inner.daddr, .daddr = p->f.inner.saddr, .sport = p->f.inner.dport,
		.dport = p->f.inner.sport, .proto = p->f.inner.proto, .dir = MASQ_OUT,
	};
	struct masq_value *v = masq_lookup(&k, now);
	if (!v)
		return TC_ACT_OK;
	p->event = FLOW_EV_ICMP_ERROR;
	if (masq_icmp_error(skb, l4off, false, p->f.saddr, v->addr, p->f.inner.dport, v->port) < 0)
		return drop(skb, p, SHUNT_REASON_INVALID_PACKET);
	done(skb, p, FLOW_FORWARDED, SHUNT_REASON_MASQUERADED);
	return TC_ACT_OK;
}

/* proxy_nodeport_reply translates what the node proxy answers a client
 * outside that reached a local backend through a NodePort, steered to the
 * proxy (lib/steer.h): the proxy's socket sends from the backend's address
 * and port, which leave as the frontend's, as nodeport_reply does for the
 * backend's own replies at its veth. Returns -1 for anything else. */
static __always_inline int proxy_nodeport_reply(struct __sk_buff *skb)
{
	struct pkt p = { .dir = SHUNT_DIR_TO_UPLINK, .point = FLOW_POINT_TO_UPLINK };
	int verdict;

	struct iphdr *ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	if (p.f.proto != IPPROTO_TCP || !p.f.has_ports)
		return -1;
	struct tc_nat_key k = nodeport_key(&p.f);
	struct nodeport_nat_value *found = bpf_map_lookup_elem(&shunt_nodeport_nat, &k);
	if (!found || !found->reply)
		return -1;
	nodeport_refresh(&k, found, p.f.tcp_flags, nat_now());
	struct nodeport_nat_value v = *found;
	if (nodeport_rewrite(skb, ETH_HLEN + ip->ihl * 4, &p.f, &v) < 0)
		return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_NODEPORT_REPLY);
	return TC_ACT_OK;
}

SEC("tc")
int shunt_to_uplink(struct __sk_buff *skb)
{
	struct pkt p = { .dir = SHUNT_DIR_TO_UPLINK, .point = FLOW_POINT_TO_UPLINK };
	struct endpoint_info *ep;
	__u32 addrs[2];
	int verdict;

	if (!uplink_addrs(skb, addrs))
		return TC_ACT_OK;
	ep = lookup_endpoint(addrs[0]);
	/* From a local pod's address, out of the node's stack: the node
	 * proxy's socket answering a steered client (a pod's own packets
	 * leave through its veth's program). */
	if (ep && CONFIG.uplink_ifindex && CONFIG.proxy_steer_port) {
		verdict = proxy_nodeport_reply(skb);
		if (verdict >= 0)
			return verdict;
	}
	if (!MASQ.addr)
		return TC_ACT_OK;
	if (!ep || masq_excluded(addrs[1]))
		return TC_ACT_OK;
	p.src_identity = ep->identity;
	p.dst_identity = SHUNT_ID_WORLD;

	struct iphdr *ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	__u32 l4off = ETH_HLEN + ip->ihl * 4;
	__u64 now = nat_now();
	bool echo = false;

	if (p.f.icmp_error)
		return error_out(skb, &p, l4off, now);
	if (p.f.proto == IPPROTO_ICMP) {
		if (icmp_type(skb, l4off) != ICMP_ECHO)
			return TC_ACT_OK;
		echo = true;
	} else if (p.f.proto == IPPROTO_TCP || p.f.proto == IPPROTO_UDP) {
		/* A fragment after the first has no ports to translate by;
		 * sent as it is it would leave with the pod's address. */
		if (!p.f.has_ports)
			return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	} else {
		return TC_ACT_OK; /* no ports to share the node's address by */
	}

	struct masq_key k = {
		.saddr = p.f.saddr, .daddr = p.f.daddr, .sport = p.f.sport, .dport = p.f.dport, .proto = p.f.proto,
		.dir = MASQ_OUT,
	};
	struct masq_value *v = masq_lookup(&k, now);
	__u16 port;
	if (v) {
		port = v->port;
		masq_refresh(&k, v, p.f.tcp_flags, now);
	} else {
		/* A reply of a connection opened to the pod (from outside the
		 * cluster, to its address routed natively): the client knows
		 * the pod's address, not the node's, and would reset a reply
		 * from the node's. As MASQUERADE on conntrack's original
		 * direction only: replies keep their source. */
		if (ct_is_reply(&p.f))
			return TC_ACT_OK;
		__u32 reason = masq_new(&MASQ, &k, now, &port);
		if (reason)
			return drop(skb, &p, reason);
		p.event = FLOW_EV_CONN_NEW;
	}
	int err = echo ? rewrite_icmp_echo(skb, l4off, false, p.f.saddr, MASQ.addr, p.f.sport, port)
		       : rewrite_l4(skb, l4off, p.f.proto, false, p.f.saddr, MASQ.addr, p.f.sport, port);
	if (err < 0)
		return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_MASQUERADED);
	return TC_ACT_OK;
}

/* from_node_routed takes a packet another node routed here (native
 * routing) for a pod of this node, from a pod of that node or the node
 * itself: the ipcache's entry of its source says which, and that identity
 * is what policy judges. Nothing in the packet proves it: with no tunnel
 * there is no VNI to carry the identity and no outer header to check, so,
 * as in Cilium's native routing without encryption, the underlay must be
 * trusted not to deliver packets with forged pod addresses (a host that
 * can send on it can claim any pod's address; the L2 sender is no better
 * proof, any host of the link can forge it too). A reply from a service
 * backend on the other node gets the service address back, as in the
 * overlay program. */
static __always_inline int from_node_routed(struct __sk_buff *skb, struct endpoint_info *ep, __u32 src_identity)
{
	struct pkt p = { .dir = SHUNT_DIR_FROM_UPLINK, .point = FLOW_POINT_FROM_UPLINK, .src_identity = src_identity };
	int verdict;
	bool retargeted;

	struct iphdr *ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	__u32 l4off = ETH_HLEN + ip->ihl * 4;
	/* As the overlay program records such a connection (CT_F_NO_TC_NAT):
	 * the pod's answers skip the translation's lookups. */
	verdict = tc_service_nat_pkt(skb, ip, &p, &retargeted);
	if (verdict >= 0)
		return verdict;
	/* Another node's proxy connecting for its client from the node's
	 * address: its SYN may carry the client's identity. Then the
	 * client's node decided its requests, and this one does not steer it
	 * to its own proxy (steer_to_proxy). */
	if (src_identity == SHUNT_ID_REMOTE_NODE && tcp_opens(p.f.proto, p.f.tcp_flags)) {
		__u32 carried = carried_identity(skb, l4off);

		if (carried) {
			src_identity = p.src_identity = carried;
			count(SHUNT_REASON_IDENTITY_CARRIED, p.dir, 0);
		}
	}
	return admit_to_local_pod(skb, &p, &CONFIG, src_identity, ep);
}

/* nodeport_at_uplink takes what arrives for the node's external Service
 * addresses (lib/nodeport.h): a client's packet, translated to its
 * backend, or a backend's reply (routed back from another node), sent to
 * the client. Returns -1 for anything else. */
static __always_inline int nodeport_at_uplink(struct __sk_buff *skb)
{
	struct pkt p = { .dir = SHUNT_DIR_FROM_UPLINK, .point = FLOW_POINT_FROM_UPLINK, .src_identity = SHUNT_ID_WORLD };
	int verdict;

	struct iphdr *ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	/* A reply, or an ICMP error about a packet on its way to a backend. */
	struct nodeport_nat_value *own = NULL;
	verdict = nodeport_reply_own(skb, &p, &CONFIG, &own);
	if (verdict >= 0)
		return verdict;
	return nodeport_from_outside(skb, &p, ip, &CONFIG, own);
}

/* overlay_arrival says whether the packet is the overlay's: VXLAN to
 * this node's tunnel endpoint (CONFIG.tunnel_local_ip4 and tunnel_port),
 * which the overlay program takes off the wire (shunt_overlay_wire) or the
 * node's VXLAN device decapsulates for it. No part of this program is for it, and on a node of the
 * overlay it is most of what arrives: the DSR, NodePort and masquerade
 * parts would each parse it and miss in their tables, a cold bucket of a
 * large hash each, which made up most of this program's cost per packet
 * in the NodePort benchmark. A header with options is left to them (no
 * VXLAN sender adds options), as is a fragment after the first (it
 * carries no ports; the stack reassembles it for the device). Read in
 * place, not copied: a copy would cost stack, and a
 * header not in the linear part (never seen at an uplink) is simply left
 * to the parts that follow. */
static __always_inline bool overlay_arrival(struct __sk_buff *skb, __u32 daddr)
{
	void *end = skb_linear_end(skb);
	struct iphdr *ip = skb_linear_data(skb) + ETH_HLEN;
	__u16 *ports = (void *)(ip + 1);

	if (!CONFIG.tunnel_port || daddr != CONFIG.tunnel_local_ip4 || (void *)(ports + 2) > end)
		return false;
	return ip->ihl == 5 && ip->protocol == IPPROTO_UDP && !(ip->frag_off & bpf_htons(IP_OFFSET)) &&
	       ports[1] == CONFIG.tunnel_port;
}

SEC("tc")
int shunt_from_uplink(struct __sk_buff *skb)
{
	__u32 addrs[2];
	int verdict;

	if (!uplink_addrs(skb, addrs))
		return TC_ACT_OK;
	if (overlay_arrival(skb, addrs[1])) {
		bpf_tail_call(skb, &shunt_overlay_wire, 0);
		return TC_ACT_OK;
	}
	if (CONFIG.nodeport_dsr_ip4 && addrs[1] == CONFIG.nodeport_dsr_ip4) {
		verdict = nodeport_from_dsr(skb, &CONFIG);
		if (verdict >= 0)
			return verdict;
	}
	if (CONFIG.native_ifindex) {
		struct endpoint_info *ep = lookup_endpoint(addrs[1]);
		struct ipcache_value *from = ep ? ipcache_lookup(addrs[0]) : NULL;

		/* From anything but another node's pod or the node itself
		 * (outside, this node's own peers): the stack delivers it, and
		 * the pod's to-pod program judges it. */
		if (from && from->tunnel_ip4)
			return from_node_routed(skb, ep, from->identity);
	}
	if (CONFIG.uplink_ifindex) {
		verdict = nodeport_at_uplink(skb);
		if (verdict >= 0)
			return verdict;
	}
	if (!MASQ.addr || addrs[1] != MASQ.addr)
		return TC_ACT_OK;
	/* Declared here, not at the top: its lifetime then starts after the
	 * NodePort part, and the compiler can give the two the same stack
	 * slots (the program sits near the 512 bytes older verifiers allow). */
	struct pkt p = { .dir = SHUNT_DIR_FROM_UPLINK, .point = FLOW_POINT_FROM_UPLINK };
	struct iphdr *ip = pkt_begin(skb, &p, &verdict);
	if (!ip)
		return verdict;
	__u32 l4off = ETH_HLEN + ip->ihl * 4;
	__u64 now = nat_now();
	bool error = p.f.icmp_error, echo = false;

	/* The entry of the reply tuple: for an error, the quoted packet (the
	 * node's) turned around. */
	struct masq_key k = {
		.saddr = p.f.saddr, .daddr = p.f.daddr, .sport = p.f.sport, .dport = p.f.dport, .proto = p.f.proto,
		.dir = MASQ_IN,
	};
	if (error) {
		k.saddr = p.f.inner.daddr, k.daddr = p.f.inner.saddr, k.sport = p.f.inner.dport;
		k.dport = p.f.inner.sport, k.proto = p.f.inner.proto;
	} else if (p.f.proto == IPPROTO_ICMP) {
		if (icmp_type(skb, l4off) != ICMP_ECHOREPLY)
			return TC_ACT_OK;
		echo = true;
	} else if ((p.f.proto != IPPROTO_TCP && p.f.proto != IPPROTO_UDP) || !p.f.has_ports) {
		return TC_ACT_OK;
	}
	struct masq_value *v = masq_lookup(&k, now);
	if (!v)
		return TC_ACT_OK; /* the node's own */
	__u32 pod = v->addr;
	__u16 pod_port = v->port;
	/* An error is no sign of life of the flow. */
	if (!error)
		masq_refresh(&k, v, p.f.tcp_flags, now);

	int err;
	if (error) {
		p.event = FLOW_EV_ICMP_ERROR;
		err = masq_icmp_error(skb, l4off, true, MASQ.addr, pod, k.dport, pod_port);
		p.f.inner.saddr = pod;
		p.f.inner.sport = pod_port;
		if (k.proto == IPPROTO_ICMP)
			p.f.inner.dport = pod_port;
	} else if (echo) {
		err = rewrite_icmp_echo(skb, l4off, true, MASQ.addr, pod, k.dport, pod_port);
		p.f.sport = pod_port;
		p.f.dport = pod_port;
	} else {
		err = rewrite_l4(skb, l4off, p.f.proto, true, MASQ.addr, pod, k.dport, pod_port);
		p.f.dport = pod_port;
	}
	p.f.daddr = pod;
	if (err < 0)
		return drop(skb, &p, SHUNT_REASON_INVALID_PACKET);
	count(SHUNT_REASON_UNMASQUERADED, p.dir, skb->len);

	p.src_identity = identity_of(p.f.saddr);
	struct endpoint_info *ep = lookup_endpoint(pod);
	if (!ep) {
		/* The pod is gone: the stack answers as for any address. */
		done(skb, &p, FLOW_FORWARDED, SHUNT_REASON_TO_STACK);
		return TC_ACT_OK;
	}
	return admit_to_local_pod(skb, &p, &CONFIG, p.src_identity, ep);
}
