// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The cgroup sockopt program of the L7 path, attached only to the cgroups
 * proxies run in: it answers SO_ORIGINAL_DST with the destination a client
 * dialled before the connect hook sent it to the proxy (bpf/sock_addr.c),
 * which sockops filed under the connection's tuple (bpf/sock_ops.c).
 */
#include "lib/common.h"
#include "lib/metrics.h"
#include "lib/proxy.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* getsockopt(SOL_IP, SO_ORIGINAL_DST) on a proxy's accepted socket: the
 * address the client dialled, as iptables' REDIRECT answers it. It runs
 * after the kernel's own handler (which fails without netfilter, or answers
 * with the proxy's address with it), on every getsockopt of the cgroup it
 * is attached to: only proxies' cgroups get it, and anything but this
 * option on an IPv4 TCP socket we redirected is left as the kernel said. */
SEC("cgroup/getsockopt")
int shunt_getsockopt(struct bpf_sockopt *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct proxy_origin *o;

	if (ctx->level != SOL_IP || ctx->optname != SO_ORIGINAL_DST || !sk)
		return 1;
	if (sk->family != AF_INET || sk->protocol != IPPROTO_TCP)
		return 1;
	struct proxy_origin_key key = {
		.client_ip = sk->dst_ip4, .client_port = (__u16)sk->dst_port,
		.proxy_ip = sk->src_ip4, .proxy_port = bpf_htons((__u16)sk->src_port),
	};
	o = bpf_map_lookup_elem(&shunt_proxy_origins, &key);
	if (!o)
		return 1;
	struct sockaddr_in *sin = ctx->optval;
	/* The caller's buffer: optval_end is its end, optlen must stay within. */
	if ((void *)(sin + 1) > ctx->optval_end)
		return 1;
	sin->sin_family = AF_INET;
	sin->sin_port = o->port;
	sin->sin_addr.s_addr = o->ip;
	__builtin_memset(sin->sin_zero, 0, sizeof(sin->sin_zero));
	ctx->optlen = sizeof(*sin);
	/* The kernel's own handler failed (ENOPROTOOPT without netfilter):
	 * the answer is a success. ctx->retval is writable in getsockopt
	 * since Linux 5.3, and the same as bpf_set_retval(0) (5.18) where
	 * that exists: one path for every kernel. The barrier keeps clang
	 * from merging this store with the one to optlen beside it into one
	 * 64-bit store, which the verifier refuses. */
	barrier();
	ctx->retval = 0;
	count(SHUNT_REASON_PROXY_ORIGIN_ANSWERED, SHUNT_DIR_GETSOCKOPT, 0);
	return 1;
}
