/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP errors a tc program answers itself, as the host stack routing the
 * packet would: the packet that caused one is rewritten, in place, into the
 * error for its sender. */
#ifndef SHUNT_LIB_ICMP_H
#define SHUNT_LIB_ICMP_H

#include "common.h"
#include "flow_tuple.h"

#define ICMP_ERROR_TTL 64
/* An ICMP error quotes the packet it is about (RFC 792): its IPv4 header,
 * options included (at most 60 bytes), and the 8 bytes after it, which hold
 * the ports, so the sender finds the socket the error is for. */
#define ICMP_QUOTE_IP_MAX 60
#define ICMP_QUOTE_L4 8

/* csum_fold folds a 32-bit one's complement sum (bpf_csum_diff's) into the
 * 16-bit checksum to store, in the byte order the sum was taken in. */
static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* quote_len gives ip_len (already checked: a header's 20 to
 * ICMP_QUOTE_IP_MAX bytes) as the size of the helpers that read and write
 * the quote, one its verifier can prove in range. Older verifiers (Linux
 * 6.1's) keep no link between a register and its copy spilled to the stack
 * before a check: the copy reloaded for a call has the bounds it had
 * before the check, 0 among them, and the program is refused ("invalid
 * zero-sized read"). Checked again here, after the compiler forgot what it
 * knew of the value, so the check cannot be left out. Called at each of
 * the three helpers, not once for all: a size clamped once and kept for
 * them was refused by 6.1 the same way. */
static __always_inline __u64 quote_len(__u32 ip_len)
{
	/* 64 bits: a 32-bit value is compared on a zero-extended copy of
	 * its register, which those verifiers do not link to it either. */
	__u64 len = ip_len;

	asm volatile("" : "+r"(len));
	if (len < sizeof(struct iphdr))
		len = sizeof(struct iphdr);
	if (len > ICMP_QUOTE_IP_MAX)
		len = ICMP_QUOTE_IP_MAX;
	return len;
}

/* icmp4_frag_needed turns the IPv4 packet of an Ethernet frame into ICMP
 * "fragmentation needed" (type 3, code 4, RFC 1191: next-hop MTU mtu) for
 * its sender, from the address from (network byte order): the frame's MACs
 * swapped, a new IPv4 header (DF, TTL 64, Linux's TOS for ICMP errors), the
 * ICMP header, then the quote: the packet's IPv4 header and the 8 bytes
 * after it, as the sender sent them: sent_daddr and sent_dport (network
 * byte order) give back the destination a translation here replaced (the
 * quoted header's checksum patched with it; equal to the packet's when
 * none did). Both checksums are computed; the packet is cut to the error's
 * length. Returns 0, or -1 when a helper failed (the packet may be cut
 * already: drop it). */
static __always_inline int icmp4_frag_needed(struct __sk_buff *skb, __u32 from, __u32 mtu, __u32 sent_daddr, __u16 sent_dport)
{
	struct ethhdr eth;
	__u8 mac[ETH_ALEN];
	struct {
		struct iphdr ip;
		struct icmphdr icmp;
	} hdr = {};
	/* Zeroed whole: the checksum reads a variable length of it. */
	__u32 quote_ip[ICMP_QUOTE_IP_MAX / 4] = {};
	__u16 quote_l4[ICMP_QUOTE_L4 / 2] = {};
	struct iphdr *orig = (struct iphdr *)quote_ip;
	__u32 ip_len;
	__s64 sum;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, orig, sizeof(*orig)) < 0)
		return -1;
	ip_len = orig->ihl * 4;
	if (ip_len < sizeof(*orig) || ip_len > sizeof(quote_ip))
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, quote_ip, quote_len(ip_len)) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + ip_len, quote_l4, sizeof(quote_l4)) < 0)
		return -1;
	if (orig->daddr != sent_daddr) {
		sum = bpf_csum_diff(&orig->daddr, sizeof(orig->daddr), &sent_daddr, sizeof(sent_daddr), (__u16)~orig->check);
		if (sum < 0)
			return -1;
		orig->check = csum_fold(sum);
		orig->daddr = sent_daddr;
	}
	if (proto_has_ports(orig->protocol))
		quote_l4[1] = sent_dport;

	hdr.ip.version = 4;
	hdr.ip.ihl = sizeof(hdr.ip) / 4;
	hdr.ip.tos = IPTOS_PREC_INTERNETCONTROL;
	hdr.ip.tot_len = bpf_htons(sizeof(hdr) + ip_len + sizeof(quote_l4));
	hdr.ip.frag_off = bpf_htons(IP_DF);
	hdr.ip.ttl = ICMP_ERROR_TTL;
	hdr.ip.protocol = IPPROTO_ICMP;
	hdr.ip.saddr = from;
	hdr.ip.daddr = orig->saddr;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&hdr.ip, sizeof(hdr.ip), 0);
	if (sum < 0)
		return -1;
	hdr.ip.check = csum_fold(sum);
	hdr.icmp.type = ICMP_DEST_UNREACH;
	hdr.icmp.code = ICMP_FRAG_NEEDED;
	hdr.icmp.un.frag.mtu = bpf_htons(mtu);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&hdr.icmp, sizeof(hdr.icmp), 0);
	if (sum >= 0)
		sum = bpf_csum_diff(NULL, 0, quote_ip, quote_len(ip_len), sum);
	if (sum >= 0)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)quote_l4, sizeof(quote_l4), sum);
	if (sum < 0)
		return -1;
	hdr.icmp.checksum = csum_fold(sum);

	__builtin_memcpy(mac, eth.h_dest, ETH_ALEN);
	__builtin_memcpy(eth.h_dest, eth.h_source, ETH_ALEN);
	__builtin_memcpy(eth.h_source, mac, ETH_ALEN);
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(hdr) + ip_len + sizeof(quote_l4), 0) < 0 ||
	    bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &hdr, sizeof(hdr), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(hdr), quote_ip, quote_len(ip_len), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(hdr) + ip_len, quote_l4, sizeof(quote_l4), 0) < 0)
		return -1;
	return 0;
}

#endif
