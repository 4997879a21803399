/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The packet headers and socket constants shunt's programs use, written
 * out from the kernel UAPI (linux/if_ether.h, ip.h, tcp.h, udp.h, icmp.h,
 * in.h, pkt_cls.h, socket.h, if_packet.h, if_arp.h, asm-generic/errno.h). These are ABI: their
 * layouts and values never change, so a fixed copy is correct on every
 * kernel. The system's versions include glibc headers (linux/if.h pulls in
 * sys/socket.h), which with -target bpf need 32-bit libc packages; this
 * file has only what the programs use and includes nothing but types.
 */
#ifndef SHUNT_NET_H
#define SHUNT_NET_H

#include <linux/types.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shunt's BPF programs are built for bpfel (little-endian hosts)"
#endif

/* linux/if_ether.h */
#define ETH_ALEN 6
#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_ARP 0x0806

struct ethhdr {
	unsigned char h_dest[ETH_ALEN];
	unsigned char h_source[ETH_ALEN];
	__be16 h_proto;
} __attribute__((packed));

/* linux/if_arp.h: struct arphdr, and the Ethernet/IPv4 body that follows
 * it (struct arp_eth_ipv4 is ours: the kernel spells it out only in
 * comments and in net/ipv4/arp.c). */
#define ARPHRD_ETHER 1

struct arphdr {
	__be16 ar_hrd;
	__be16 ar_pro;
	__u8 ar_hln;
	__u8 ar_pln;
	__be16 ar_op;
} __attribute__((packed));

struct arp_eth_ipv4 {
	struct arphdr hdr;
	__u8 sha[ETH_ALEN];
	__be32 spa;
	__u8 tha[ETH_ALEN];
	__be32 tpa;
} __attribute__((packed));

/* linux/in.h */
enum {
	IPPROTO_IP = 0,
	IPPROTO_ICMP = 1,
	IPPROTO_TCP = 6,
	IPPROTO_UDP = 17,
	IPPROTO_IPV6 = 41,
	IPPROTO_SCTP = 132,
};

/* linux/ip.h (little-endian bitfield order) */
struct iphdr {
	__u8 ihl : 4, version : 4;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
};

#define IP_DF 0x4000     /* iphdr.frag_off (host order): don't fragment */
#define IP_MF 0x2000     /* iphdr.frag_off (host order): more fragments */
#define IP_OFFSET 0x1fff /* iphdr.frag_off (host order): fragment offset */
#define IPTOS_PREC_INTERNETCONTROL 0xc0 /* the TOS Linux gives the ICMP errors it sends */
#define INET_ECN_MASK 3 /* net/inet_ecn.h: the ECN bits of the TOS */
#define INET_ECN_CE 3

/* linux/tcp.h (little-endian bitfield order) */
struct tcphdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u16 res1 : 4, doff : 4, fin : 1, syn : 1, rst : 1, psh : 1, ack : 1, urg : 1, ece : 1, cwr : 1;
	__be16 window;
	__sum16 check;
	__be16 urg_ptr;
};

/* linux/udp.h */
struct udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__sum16 check;
};

/* linux/icmp.h */
#define ICMP_ECHOREPLY 0
#define ICMP_DEST_UNREACH 3
#define ICMP_ECHO 8
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12
#define ICMP_FRAG_NEEDED 4 /* a code of ICMP_DEST_UNREACH */

struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	union {
		struct {
			__be16 id;
			__be16 sequence;
		} echo;
		__be32 gateway;
		struct {
			__be16 __unused;
			__be16 mtu;
		} frag;
		__u8 reserved[4];
	} un;
};

/* linux/pkt_cls.h: tc verdicts */
#define TC_ACT_UNSPEC (-1)
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

/* linux/if_packet.h: skb->pkt_type */
#define PACKET_HOST 0

/* linux/socket.h */
#define AF_INET 2
#define AF_INET6 10

/* linux/in.h, linux/netfilter_ipv4.h: the option a transparent proxy asks
 * for a redirected connection's original destination */
#define SOL_IP 0
#define SO_ORIGINAL_DST 80

struct in_addr {
	__be32 s_addr;
};

struct sockaddr_in {
	__u16 sin_family;
	__be16 sin_port;
	struct in_addr sin_addr;
	__u8 sin_zero[8];
};

/* asm-generic/errno.h: what socket hooks return to applications */
#define EPERM 1
#define ECONNABORTED 103
#define ENOBUFS 105
#define ECONNREFUSED 111

#endif /* SHUNT_NET_H */
