/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The tc fallback of service load balancing: per-packet DNAT for traffic
 * that did not go through a hooked socket (raw sockets, processes outside
 * the hooked cgroups, later traffic from other nodes). Kept small: the
 * socket hooks are the main path. */
#ifndef SHUNT_LIB_TC_NAT_H
#define SHUNT_LIB_TC_NAT_H

#include "common.h"
#include "services.h"
#include "metrics.h"
#include "lru.h"
#include "flow_tuple.h"
#include "ipv4.h"
#include "pkt.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct tc_nat_key);
	__type(value, struct tc_nat_value);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_tc_nat SEC(".maps");

/* rewrite_l4 replaces an address and a port of the packet, fixing the IPv4
 * header checksum and the TCP/UDP checksum (which covers the address via the
 * pseudo-header). l4off is the transport header offset; is_dst picks
 * destination or source. */
static __always_inline int rewrite_l4(struct __sk_buff *skb, __u32 l4off, __u8 proto, bool is_dst,
				      __u32 old_ip, __u32 new_ip, __u16 old_port, __u16 new_port)
{
	__u32 csum_off = l4off + (proto == IPPROTO_TCP ? __builtin_offsetof(struct tcphdr, check)
						       : __builtin_offsetof(struct udphdr, check));
	__u32 port_off = l4off + (is_dst ? 2 : 0);
	__u64 flags = BPF_F_PSEUDO_HDR | sizeof(new_ip);

	if (proto == IPPROTO_UDP)
		flags |= BPF_F_MARK_MANGLED_0; /* a zero UDP checksum means "none" */
	if (bpf_l4_csum_replace(skb, csum_off, old_ip, new_ip, flags) < 0 ||
	    bpf_l4_csum_replace(skb, csum_off, old_port, new_port,
				sizeof(new_port) | (proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0)) < 0 ||
	    bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, sizeof(new_ip)) < 0 ||
	    bpf_skb_store_bytes(skb, is_dst ? IP_DST_OFF : IP_SRC_OFF, &new_ip, sizeof(new_ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, port_off, &new_port, sizeof(new_port), 0) < 0)
		return -1;
	return 0;
}

/* tc_service_nat_said translates one packet a pod sent (from this node, or from
 * another through the overlay): towards a service VIP it picks (once per
 * flow) and writes a backend; a reply from a backend, wherever the backend
 * runs, gets the VIP back as its source on the client's node, which holds
 * the flow's entries. Counted under dir (enum shunt_direction). Returns the verdict to use, with *reason the
 * drop reason, or -1 to go on, with *reason 0 or the reason of a record
 * that could not be made on the way (counted here; the packet still goes
 * on). A translated destination is written back into f, so what follows
 * (policy, forwarding) sees the backend; a reply keeps the backend as its
 * source in f, which is what the connection was admitted with. *translated
 * says whether the packet was translated (either way). */
static __always_inline int tc_service_nat_said(struct __sk_buff *skb, struct iphdr *ip, struct flow *f, __u32 dir,
					       __u32 *reason, bool *translated)
{
	*reason = 0;
	*translated = false;
	__u32 l4off = ETH_HLEN + ip->ihl * 4;
	__u8 proto = f->proto;
	struct tc_nat_value *nat;

	if ((proto != IPPROTO_TCP && proto != IPPROTO_UDP) || !f->has_ports)
		return -1;

	struct tc_nat_key key = {
		.saddr = f->saddr, .daddr = f->daddr, .sport = f->sport, .dport = f->dport, .proto = proto,
	};
	__u32 saddr = f->saddr, vip = f->daddr;

	nat = bpf_map_lookup_elem(&shunt_tc_nat, &key);
	if (nat) {
		/* Known flow: forward entries rewrite the destination, reply
		 * entries the source. */
		struct tc_nat_value v = *nat;
		bool is_dst = !v.reply;

		if (rewrite_l4(skb, l4off, proto, is_dst, is_dst ? vip : saddr, v.addr,
			       is_dst ? f->dport : f->sport, v.port) < 0) {
			*reason = SHUNT_REASON_INVALID_PACKET;
			return TC_ACT_SHOT;
		}
		if (is_dst) {
			f->daddr = v.addr;
			f->dport = v.port;
		}
		*translated = true;
		count(SHUNT_REASON_SERVICE_XLATE, dir, skb->len);
		return -1;
	}

	struct service_value *svc = lookup_service(vip, f->dport, proto);
	if (!svc)
		return -1;
	struct backend_value *be = select_backend(svc, vip, f->dport, proto, saddr, AFFINITY_CLIENT_ADDR, reason);
	if (!be) {
		*reason = SHUNT_REASON_SERVICE_NO_BACKEND;
		return TC_ACT_SHOT;
	}
	if (*reason)
		count(*reason, dir, skb->len);
	struct tc_nat_value fwd = { .addr = be->ip, .port = be->port };
	struct tc_nat_key rkey = {
		.saddr = be->ip, .daddr = saddr, .sport = be->port, .dport = f->sport, .proto = proto,
	};
	struct tc_nat_value rev = { .addr = vip, .port = f->dport, .reply = 1 };
	__u32 be_ip = be->ip;
	__u16 be_port = be->port;

	/* A flow whose translation cannot be recorded is dropped: its next
	 * packets would pick another backend, its replies keep the backend's
	 * address. Half a record is removed, so no packet uses it. */
	if (lru_insert(&shunt_tc_nat, &key, &fwd, BPF_ANY) < 0) {
		*reason = SHUNT_REASON_NAT_INSERT_FAILED;
		return TC_ACT_SHOT;
	}
	if (lru_insert(&shunt_tc_nat, &rkey, &rev, BPF_ANY) < 0) {
		map_delete(&shunt_tc_nat, &key);
		*reason = SHUNT_REASON_NAT_INSERT_FAILED;
		return TC_ACT_SHOT;
	}
	/* The first entry, which the second's write may have evicted
	 * (lib/lru.h). */
	if (lru_restore(&shunt_tc_nat, &key, &fwd, dir, skb->len) < 0) {
		*reason = SHUNT_REASON_NAT_INSERT_FAILED;
		return TC_ACT_SHOT;
	}
	if (rewrite_l4(skb, l4off, proto, true, vip, be_ip, f->dport, be_port) < 0) {
		*reason = SHUNT_REASON_INVALID_PACKET;
		return TC_ACT_SHOT;
	}
	f->daddr = be_ip;
	f->dport = be_port;
	*translated = true;
	count(SHUNT_REASON_SERVICE_XLATE, dir, skb->len);
	return -1;
}

/* tc_service_nat_pkt is tc_service_nat_said for a packet p on its way to
 * be judged and tracked: one the translation cannot take is dropped (its
 * verdict returned), a record it could not make is p->failed, and a
 * connection the translation left alone is recorded as such when it opens
 * (CT_F_NO_TC_NAT: its packets, either way, skip these lookups). Returns
 * -1 to go on, *retargeted saying whether the destination changed (a
 * frontend translated to its backend: another connection than the one
 * the packet's tuple named; a reply keeps its tuple, only its source was
 * given back). */
static __always_inline int tc_service_nat_pkt(struct __sk_buff *skb, struct iphdr *ip, struct pkt *p, bool *retargeted)
{
	__u32 reason;
	bool translated;
	int verdict = tc_service_nat_said(skb, ip, &p->f, p->dir, &reason, &translated);

	if (verdict >= 0)
		return drop(skb, p, reason);
	p->failed = reason;
	if (!translated)
		p->ct_new_flags = CT_F_NO_TC_NAT;
	*retargeted = translated && (p->f.daddr != p->orig_daddr || p->f.dport != p->orig_dport);
	return -1;
}

/* tc_service_nat is tc_service_nat_said for a caller that need not know
 * whether the packet was translated. */
static __always_inline int tc_service_nat(struct __sk_buff *skb, struct iphdr *ip, struct flow *f, __u32 dir,
					  __u32 *reason)
{
	bool translated;

	return tc_service_nat_said(skb, ip, f, dir, reason, &translated);
}

#endif
