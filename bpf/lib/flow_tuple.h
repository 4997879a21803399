/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The tuple of a packet, read once and shared by service translation,
 * connection tracking and policy. */
#ifndef SHUNT_LIB_FLOW_TUPLE_H
#define SHUNT_LIB_FLOW_TUPLE_H

#include "common.h"

#define SHUNT_TCPF_FIN 0x01
#define SHUNT_TCPF_SYN 0x02
#define SHUNT_TCPF_RST 0x04
#define SHUNT_TCPF_ACK 0x10

struct flow {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;     /* network byte order; ICMP echo: the identifier */
	__u16 dport;     /* network byte order; ICMP echo: the identifier */
	__u8 proto;
	__u8 tcp_flags;
	__u8 has_ports;  /* TCP, UDP or SCTP with its header present */
	__u8 icmp_error; /* an ICMP error: inner holds the tuple it is about */
	struct {
		__u32 saddr, daddr;
		__u16 sport, dport;
		__u8 proto;
	} inner;
};

/* tcp_opens says whether a packet of protocol proto with tcp_flags opens a
 * TCP connection: a SYN without ACK (a SYN-ACK answers one). Only such a
 * segment starts a connection anywhere: conntrack, the NAT tables, the
 * proxy's origins; any other may be a lost entry's connection going on. */
static __always_inline bool tcp_opens(__u8 proto, __u8 tcp_flags)
{
	return proto == IPPROTO_TCP && (tcp_flags & (SHUNT_TCPF_SYN | SHUNT_TCPF_ACK)) == SHUNT_TCPF_SYN;
}

static __always_inline bool proto_has_ports(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

static __always_inline bool icmp_is_error(__u8 type)
{
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED || type == ICMP_PARAMETERPROB;
}

/* parse_icmp_inner reads the header an ICMP error quotes: the packet that
 * caused it, sent by the other end of the connection. */
static __always_inline int parse_icmp_inner(struct __sk_buff *skb, __u32 off, struct flow *f)
{
	struct iphdr inner;
	__u16 ports[2] = {};

	if (bpf_skb_load_bytes(skb, off, &inner, sizeof(inner)) < 0 || inner.ihl < 5)
		return -1;
	off += inner.ihl * 4;
	if (proto_has_ports(inner.protocol)) {
		if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
			return -1;
	} else if (inner.protocol == IPPROTO_ICMP) {
		if (bpf_skb_load_bytes(skb, off + 4, &ports[0], sizeof(ports[0])) < 0)
			return -1;
		ports[1] = ports[0];
	}
	f->inner.saddr = inner.saddr;
	f->inner.daddr = inner.daddr;
	f->inner.sport = ports[0];
	f->inner.dport = ports[1];
	f->inner.proto = inner.protocol;
	f->icmp_error = 1;
	return 0;
}

/* parse_flow fills f from an IPv4 packet whose header starts at ETH_HLEN.
 * Returns -1 when a header the protocol needs is truncated. Non-first
 * fragments carry no transport header: their ports stay 0. */
static __always_inline int parse_flow(struct __sk_buff *skb, struct iphdr *ip, struct flow *f)
{
	__u32 l4off = ETH_HLEN + ip->ihl * 4;

	__builtin_memset(f, 0, sizeof(*f));
	f->saddr = ip->saddr;
	f->daddr = ip->daddr;
	f->proto = ip->protocol;
	if (ip->frag_off & bpf_htons(IP_OFFSET))
		return 0;
	if (proto_has_ports(f->proto)) {
		__u16 ports[2];

		if (bpf_skb_load_bytes(skb, l4off, ports, sizeof(ports)) < 0)
			return -1;
		f->sport = ports[0];
		f->dport = ports[1];
		f->has_ports = 1;
		if (f->proto == IPPROTO_TCP &&
		    bpf_skb_load_bytes(skb, l4off + 13, &f->tcp_flags, sizeof(f->tcp_flags)) < 0)
			return -1;
		return 0;
	}
	if (f->proto == IPPROTO_ICMP) {
		struct icmphdr icmp;

		if (bpf_skb_load_bytes(skb, l4off, &icmp, sizeof(icmp)) < 0)
			return -1;
		if (icmp.type == ICMP_ECHO || icmp.type == ICMP_ECHOREPLY) {
			f->sport = icmp.un.echo.id;
			f->dport = icmp.un.echo.id;
		} else if (icmp_is_error(icmp.type)) {
			/* A quote too short to read is still a valid ICMP
			 * error; it just relates to nothing. */
			parse_icmp_inner(skb, l4off + sizeof(icmp), f);
		}
	}
	return 0;
}

#endif
