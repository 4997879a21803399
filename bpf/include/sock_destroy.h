/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The few kernel socket types bpf/sock_destroy.c reads (its map and output
 * types are in shunt.h with every other). They are
 * declared with only the fields used and preserve_access_index, so their
 * offsets are relocated against the running kernel's BTF at load time
 * (CO-RE) instead of being taken from a generated vmlinux.h.
 */
#ifndef SHUNT_SOCK_DESTROY_H
#define SHUNT_SOCK_DESTROY_H

#include <linux/types.h>

#include "shunt.h"

/* Kernel types (CO-RE). */

struct in6_addr___shunt {
	union {
		__u32 u6_addr32[4];
	} in6_u;
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr___shunt skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct inet_sock {
	struct sock sk;
} __attribute__((preserve_access_index));

struct udp_sock {
	struct inet_sock inet;
} __attribute__((preserve_access_index));

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

/* The context of iter/udp programs: the kernel's bpf_iter_udp() arguments. */
struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

#endif /* SHUNT_SOCK_DESTROY_H */
