// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Destroys connected UDP sockets whose service backend went away. connect()
 * to a service VIP is translated once (bpf/sock_addr.c), so a connected UDP
 * socket keeps sending to the backend it got, and blackholes once that
 * backend is deleted (a DNS pod restarted). The agent fills
 * shunt_gone_backends and runs this iterator over the UDP sockets of each
 * network namespace; every socket that the connect hook steered to a gone
 * backend is destroyed with bpf_sock_destroy (Linux 6.5+): the
 * application's next receive fails with ECONNABORTED and a resolver opens a
 * new socket, which is translated to a live backend.
 */
#include "lib/common.h"
#include "sock_destroy.h"
#include "lib/sock_svc.h" /* the connect hooks' record, given as the pinned map */

char __license[] SEC("license") = "Dual BSD/GPL";

/* Backends gone since the last run, filled by the agent for one run. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct gone_backend);
	__type(value, __u8);
} shunt_gone_backends SEC(".maps");

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/* v4mapped says whether a v6 address is ::ffff:a.b.c.d. */
static __always_inline bool v4mapped(struct sock_common *skc)
{
	return skc->skc_v6_daddr.in6_u.u6_addr32[0] == 0 && skc->skc_v6_daddr.in6_u.u6_addr32[1] == 0 &&
	       skc->skc_v6_daddr.in6_u.u6_addr32[2] == bpf_htonl(0x0000ffff);
}

/* report writes one destroy_result to the iterator's output. Kept out of
 * line so that its signature anchors struct destroy_result in the object's
 * BTF, where bpf2go finds it (a local variable's type is not emitted). */
static __attribute__((noinline)) long report(struct seq_file *seq, struct destroy_result *res)
{
	return bpf_seq_write(seq, res, sizeof(*res));
}

SEC("iter/udp")
int shunt_destroy_udp(struct bpf_iter__udp *ctx)
{
	struct udp_sock *udp = ctx->udp_sk;
	struct sock_translation *st;

	if (!udp)
		return 0;
	struct sock_common *skc = &udp->inet.sk.__sk_common;

	/* Only connected sockets keep a destination; an unconnected one
	 * chooses its backend per datagram (sendmsg hook), so nothing stale
	 * is left in it, and destroying it would take its local port away. */
	if (skc->skc_state != BPF_TCP_ESTABLISHED)
		return 0;
	/* A v6 socket talks to an IPv4 backend only through a v4-mapped
	 * address; then, and only then, skc_daddr holds that IPv4 address. */
	if (skc->skc_family == AF_INET6) {
		if (!v4mapped(skc))
			return 0;
	} else if (skc->skc_family != AF_INET) {
		return 0;
	}

	__u32 daddr = skc->skc_daddr;
	__u16 dport = skc->skc_dport;
	struct gone_backend key = { .ip = daddr, .port = dport, .proto = IPPROTO_UDP };

	if (!bpf_map_lookup_elem(&shunt_gone_backends, &key))
		return 0;
	/* Only sockets that the connect hook steered, and only while they still point
	 * where it steered them: a socket connected to the backend address
	 * directly (or reconnected since) is the application's own choice. */
	st = bpf_sk_storage_get(&shunt_sock_svc, udp, 0, 0);
	if (!st || st->backend_ip != daddr || st->backend_port != dport)
		return 0;

	struct destroy_result res = {
		.cookie = bpf_get_socket_cookie(udp),
		.err = bpf_sock_destroy((struct sock_common *)udp),
	};
	report(ctx->meta->seq, &res);
	return 0;
}
