/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared between bpf/sock_destroy.c and the Go agent (bpf2go
 * generates sockdestroyGoneBackend and sockdestroyDestroyResult from them),
 * and the few kernel socket types the iterator reads. The kernel types are
 * declared with only the fields used and preserve_access_index, so their
 * offsets are relocated against the running kernel's BTF at load time
 * (CO-RE) instead of being taken from a generated vmlinux.h.
 */
#ifndef SHUNT_SOCK_DESTROY_H
#define SHUNT_SOCK_DESTROY_H

#include <linux/types.h>

/* A backend that went away: sockets connected to it through a service are
 * destroyed. Key of shunt_gone_backends. */
struct gone_backend {
	__u32 ip;   /* network byte order */
	__u16 port; /* network byte order */
	__u8 proto; /* IPPROTO_UDP (the only iterator so far) */
	__u8 pad;
};

/* One record per socket the iterator tried to destroy, written to the
 * iterator's output (bpf_seq_write): the agent counts them per call and per
 * network namespace, with no shared counter to reset or race on. */
struct destroy_result {
	__u64 cookie; /* socket cookie (SO_COOKIE) */
	__s32 err;    /* bpf_sock_destroy's return: 0, or a negative errno */
	__u32 pad;
};

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
