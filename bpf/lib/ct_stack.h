/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Whether the kernel's own connection tracking (netfilter) holds a flow:
 * a connection another translator (kube-proxy's NAT rules) started before
 * shunt took the node over stays that translator's, so that migrating a
 * node from kube-proxy keeps its established connections. */
#ifndef SHUNT_LIB_CT_STACK_H
#define SHUNT_LIB_CT_STACK_H

#include "common.h"
#include "flow_tuple.h"

/* Opaque here: only passed back to bpf_ct_release. Defined (not declared)
 * because the loader compares it with the kernel's struct by kind and
 * name; ___local keeps the name the kernel's. */
struct nf_conn___local {
	int opaque;
};

/* The kfunc's options as Linux 5.18-6.7 define them (12 bytes; later
 * kernels accept this size too). ___local: the kernel's struct
 * bpf_ct_opts by name, this layout by size. */
struct bpf_ct_opts___local {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};

#define SHUNT_CT_OPTS_SIZE 12
#define SHUNT_CT_CURRENT_NETNS (-1)

/* Weak: a kernel without them (before 5.18, or nf_conntrack not loaded
 * where it is a module) still loads the program, and the lookup answers
 * "not tracked", shunt's behaviour before this check. */
extern struct nf_conn___local *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple_size,
					 struct bpf_ct_opts___local *opts, __u32 opts_size) __ksym __weak;
extern void bpf_ct_release(struct nf_conn___local *ct) __ksym __weak;

/* stack_tracks_tcp says whether netfilter's conntrack holds TCP flow f
 * (either direction's tuple). */
static __always_inline bool stack_tracks_tcp(struct __sk_buff *skb, const struct flow *f)
{
	if (!bpf_skb_ct_lookup || !bpf_ct_release)
		return false;
	struct bpf_sock_tuple t = {};
	t.ipv4.saddr = f->saddr;
	t.ipv4.daddr = f->daddr;
	t.ipv4.sport = f->sport;
	t.ipv4.dport = f->dport;
	struct bpf_ct_opts___local opts = { .netns_id = SHUNT_CT_CURRENT_NETNS, .l4proto = IPPROTO_TCP };
	struct nf_conn___local *ct = bpf_skb_ct_lookup(skb, &t, sizeof(t.ipv4), &opts, SHUNT_CT_OPTS_SIZE);

	if (!ct)
		return false;
	bpf_ct_release(ct);
	return true;
}

#endif
