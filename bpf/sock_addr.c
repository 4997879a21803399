// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Service load balancing at the socket layer: the cgroup sock_addr programs
 * (connect4/6, sendmsg4/6, recvmsg4/6, getpeername4/6). A connect() (or an
 * unconnected UDP sendmsg()) to a service VIP is rewritten to a backend
 * before the kernel routes it, so packets carry the backend address from the
 * first one and no per-packet NAT is left; a TCP connect an L7 rule names
 * goes to the node proxy instead. recvmsg() and getpeername() translate the
 * backend back to the VIP, so applications (and resolvers checking reply
 * sources) see the address they used. Every decision is counted in
 * shunt_metrics, the tc programs' counters, with the hook as its direction.
 */
#include "lib/common.h"
#include "lib/lru.h"
#include "lib/services.h"
#include "lib/metrics.h"
#include "lib/flow_events.h"
#include "lib/proxy.h"
#include "lib/accel_config.h"
#include "lib/sock_svc.h"
#include "lib/sock_proxied.h"
#include "lib/set_retval.h"
#include "lib/source_ranges.h"

char __license[] SEC("license") = "Dual BSD/GPL";

volatile const struct shunt_config CONFIG = {};

/* Never read: it puts the enum into the object's BTF (see pod_tc.c). */
const volatile enum affinity_client_kind _btf_affinity_client_kind = 0;

/* Verdicts of cgroup sock_addr programs. */
#define SOCK_ALLOW 1
#define SOCK_REJECT 0

/* Where a socket hook sends a connection or datagram. */
struct dest {
	__u32 ip;   /* network byte order */
	__u16 port; /* network byte order */
};

/* sock_flow reports a socket hook's decision about a service destination:
 * the caller is named by its cgroup, as no packet (or source address)
 * exists yet. */
static __always_inline void sock_flow(struct dest *svc, __u32 be_ip, __u16 be_port, __u8 proto, __u8 verdict,
				      __u32 reason)
{
	if (!flow_wanted(flow_mode(), FLOW_EV_SOCK))
		return;
	struct flow_event *e = flow_reserve();
	if (!e)
		return;
	e->cgroup_id = bpf_get_current_cgroup_id(), e->daddr = be_ip, e->dport = be_port;
	e->orig_daddr = svc->ip, e->orig_dport = svc->port, e->proto = proto, e->verdict = verdict;
	e->reason = reason, e->point = FLOW_POINT_SOCK, e->event = FLOW_EV_SOCK;
	flow_submit(e);
}

/* translate picks the backend for a service destination. Returns
 * SOCK_REJECT, with the syscall's error set, for a service without backends
 * (ECONNREFUSED) and for a UDP destination whose replies could not be given
 * back the service address (ENOBUFS); both are EPERM on a kernel without
 * bpf_set_retval (set_refusal); *dst is changed only when it is
 * translated. Every outcome, and every record that could not be made, is
 * counted for the hook (SHUNT_DIR_CONNECT or SHUNT_DIR_SENDMSG). */
/* pods_own_loopback says whether ip is a loopback address (127.0.0.0/8)
 * and the socket is not the node's: a frontend there (a hostPort with
 * hostIP 127.0.0.1) is the node's loopback, and a pod's 127.0.0.1 is its
 * own, never translated. */
static __always_inline bool pods_own_loopback(struct bpf_sock_addr *ctx, __u32 ip)
{
	__u32 zero = 0;
	struct accel_config *c;

	if ((bpf_ntohl(ip) >> 24) != 127)
		return false;
	c = bpf_map_lookup_elem(&shunt_accel_config, &zero);
	return c && c->host_netns_cookie && bpf_get_netns_cookie(ctx) != c->host_netns_cookie;
}

/* The address the node's own unbound sockets are judged by at a load
 * balancer frontend with source ranges: the node's address on its uplink,
 * which the route to an outside load balancer address picks (without an
 * uplink, its address on the pod network). Network byte order, set at
 * load. */
volatile const __u32 NODE_SOURCE_IP4 = 0;

/* sock_client_ip4 is the address a socket's connection comes from, as
 * loadBalancerSourceRanges judge it (no packet, so no source address,
 * exists yet): the address the socket is bound to; else a pod's own
 * address (its network namespace); else the node's (NODE_SOURCE_IP4). */
static __always_inline __u32 sock_client_ip4(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	__u64 netns;
	__u32 *pod;

	if (sk && sk->src_ip4)
		return sk->src_ip4;
	netns = bpf_get_netns_cookie(ctx);
	pod = bpf_map_lookup_elem(&shunt_netns_pods, &netns);
	return pod ? *pod : NODE_SOURCE_IP4;
}

static __always_inline int translate(struct bpf_sock_addr *ctx, struct dest *dst, __u8 proto, __u32 hook)
{
	bool connect = hook == SHUNT_DIR_CONNECT;
	struct service_value *svc;
	struct backend_value *be;
	__u32 failed = 0; /* the last record that could not be made */

	svc = pods_own_loopback(ctx, dst->ip) ? 0 : lookup_service(dst->ip, dst->port, proto);
	if (!svc) {
		count(SHUNT_REASON_SOCK_PASSED, hook, 0);
		return SOCK_ALLOW;
	}

	/* A load balancer frontend's source ranges hold for node-local
	 * clients too, as kube-proxy's: refused at once, as a Service without
	 * endpoints is (only frontends with ranges have trie entries). */
	if ((svc->flags & SERVICE_F_EXTERNAL) && !lb_source_allowed(svc->id, sock_client_ip4(ctx))) {
		set_refusal(-ECONNREFUSED);
		count(SHUNT_REASON_LB_SOURCE_DENIED, hook, 0);
		sock_flow(dst, 0, 0, proto, FLOW_DROPPED, SHUNT_REASON_LB_SOURCE_DENIED);
		return SOCK_REJECT;
	}
	be = select_backend(svc, dst->ip, dst->port, proto, bpf_get_netns_cookie(ctx), AFFINITY_CLIENT_NETNS, &failed);
	if (!be) {
		/* Fail fast and say why: a timeout would hide the cause. */
		set_refusal(-ECONNREFUSED);
		count(SHUNT_REASON_SOCK_REFUSED, hook, 0);
		sock_flow(dst, 0, 0, proto, FLOW_DROPPED, SHUNT_REASON_SOCK_REFUSED);
		return SOCK_REJECT;
	}
	if (failed)
		count(failed, hook, 0);
	/* Unconnected UDP goes through here on every datagram: report a
	 * socket's first datagram to a backend, not each one. */
	bool report = true;
	/* The socket's own record names the service: recvmsg and getpeername
	 * need no reverse-NAT entry. */
	bool recorded = false;

	if (connect) {
		struct sock_translation *st = bpf_sk_storage_get(&shunt_sock_svc, ctx->sk, 0,
								 BPF_SK_STORAGE_GET_F_CREATE);
		if (st) {
			st->vip = dst->ip;
			st->vport = dst->port;
			st->backend_ip = be->ip;
			st->backend_port = be->port;
			recorded = true;
		} else {
			failed = SHUNT_REASON_SOCK_STORAGE_FAILED;
			count(failed, hook, 0);
		}
	}
	if (proto == IPPROTO_UDP) {
		struct revnat_key key = {
			.netns_cookie = bpf_get_netns_cookie(ctx),
			.sock_cookie = bpf_get_socket_cookie(ctx),
			.backend_ip = be->ip,
			.backend_port = be->port,
		};
		struct revnat_value rev = { .vip = dst->ip, .vport = dst->port };

		if (!connect && bpf_map_lookup_elem(&shunt_revnat, &key))
			report = false;
		if (lru_insert(&shunt_revnat, &key, &rev, BPF_ANY) < 0) {
			failed = SHUNT_REASON_REVNAT_INSERT_FAILED;
			count(failed, hook, 0);
			if (!recorded) {
				/* Replies would come back from the backend's
				 * address, which resolvers drop: fail now, and
				 * say why, rather than time out. */
				set_refusal(-ENOBUFS);
				sock_flow(dst, be->ip, be->port, proto, FLOW_DROPPED, failed);
				return SOCK_REJECT;
			}
		}
	}
	count(SHUNT_REASON_SOCK_XLATE, hook, 0);
	if (report || failed)
		sock_flow(dst, be->ip, be->port, proto, FLOW_TRANSLATED, failed ? failed : SHUNT_REASON_SOCK_XLATE);
	dst->ip = be->ip;
	dst->port = be->port;
	return SOCK_ALLOW;
}

/* redirect_l7 sends a TCP connect to the proxy shunt_l7_redirect names for
 * its destination, unless the socket is a proxy's own (its mark). Returns
 * 1 when *dst now is the proxy, 0 when the destination is not redirected,
 * and SOCK_REJECT's -1 when the original destination could not be kept (the
 * proxy could not know where to go, and skipping it would skip its policy:
 * fail closed, with ENOBUFS, or EPERM without bpf_set_retval). */
static __always_inline int redirect_l7(struct bpf_sock_addr *ctx, struct dest *dst)
{
	struct l7_redirect_key key = { .ip = dst->ip, .port = dst->port, .proto = IPPROTO_TCP };
	struct l7_redirect_value *r;
	struct bpf_sock *sk = ctx->sk;
	__u32 identity;

	if (!sk || proxy_marked(&CONFIG, sk->mark, &identity))
		return 0;
	r = bpf_map_lookup_elem(&shunt_l7_redirect, &key);
	if (!r)
		return 0;
	struct proxy_origin *o = bpf_sk_storage_get(&shunt_sock_proxied, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!o) {
		set_refusal(-ENOBUFS);
		count(SHUNT_REASON_PROXY_ORIGIN_FAILED, SHUNT_DIR_CONNECT, 0);
		sock_flow(dst, 0, 0, IPPROTO_TCP, FLOW_DROPPED, SHUNT_REASON_PROXY_ORIGIN_FAILED);
		return -1;
	}
	o->ip = dst->ip;
	o->port = dst->port;
	/* getpeername keeps showing what the application dialled. */
	struct sock_translation *st = bpf_sk_storage_get(&shunt_sock_svc, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st) {
		st->vip = dst->ip;
		st->vport = dst->port;
		st->backend_ip = r->proxy_ip;
		st->backend_port = r->proxy_port;
	}
	count(SHUNT_REASON_SOCK_TO_PROXY, SHUNT_DIR_CONNECT, 0);
	sock_flow(dst, r->proxy_ip, r->proxy_port, IPPROTO_TCP, FLOW_REDIRECTED_PROXY, SHUNT_REASON_SOCK_TO_PROXY);
	dst->ip = r->proxy_ip;
	dst->port = r->proxy_port;
	return 1;
}

/* connect_dest decides where a connect goes: a proxy, a service backend,
 * or where it was going. */
static __always_inline int connect_dest(struct bpf_sock_addr *ctx, struct dest *dst)
{
	if (ctx->protocol == IPPROTO_TCP) {
		int r = redirect_l7(ctx, dst);

		if (r < 0)
			return SOCK_REJECT;
		if (r > 0)
			return SOCK_ALLOW;
	}
	return translate(ctx, dst, ctx->protocol, SHUNT_DIR_CONNECT);
}

/* reverse turns a backend the kernel reports back into the service the
 * socket used: from the socket's own record for connected sockets, else
 * from the UDP reverse map. Returns false when src is no backend of ours.
 * Counted for the hook (SHUNT_DIR_RECVMSG or SHUNT_DIR_GETPEERNAME). */
static __always_inline bool reverse(struct bpf_sock_addr *ctx, struct dest *src, __u32 hook)
{
	struct sock_translation *st;
	struct revnat_value *rev;

	st = bpf_sk_storage_get(&shunt_sock_svc, ctx->sk, 0, 0);
	if (st && st->backend_ip == src->ip && st->backend_port == src->port) {
		src->ip = st->vip;
		src->port = st->vport;
		count(SHUNT_REASON_SOCK_RESTORED, hook, 0);
		return true;
	}
	/* Only UDP has reverse entries (translate writes them for
	 * unconnected sends). A TCP socket without a record was never
	 * translated: its getpeername (Go's dial asks it after every
	 * connect, and accept returning the peer's address runs this hook
	 * too) need not pay the lookup, a miss in a large table whose
	 * bucket is seldom in the cache. */
	if (ctx->protocol != IPPROTO_UDP) {
		count(SHUNT_REASON_SOCK_PASSED, hook, 0);
		return false;
	}
	struct revnat_key key = {
		.netns_cookie = bpf_get_netns_cookie(ctx),
		.sock_cookie = bpf_get_socket_cookie(ctx),
		.backend_ip = src->ip,
		.backend_port = src->port,
	};
	rev = bpf_map_lookup_elem(&shunt_revnat, &key);
	if (!rev) {
		count(SHUNT_REASON_SOCK_PASSED, hook, 0);
		return false;
	}
	src->ip = rev->vip;
	src->port = rev->vport;
	count(SHUNT_REASON_SOCK_RESTORED, hook, 0);
	return true;
}

/* IPv4 sockets. */

static __always_inline int xlate4(struct bpf_sock_addr *ctx, __u8 proto, __u32 hook)
{
	struct dest d = { .ip = ctx->user_ip4, .port = (__u16)ctx->user_port };
	int ret = hook == SHUNT_DIR_CONNECT ? connect_dest(ctx, &d) : translate(ctx, &d, proto, hook);

	ctx->user_ip4 = d.ip;
	ctx->user_port = d.port;
	return ret;
}

static __always_inline void reverse4(struct bpf_sock_addr *ctx, __u32 hook)
{
	struct dest d = { .ip = ctx->user_ip4, .port = (__u16)ctx->user_port };

	if (reverse(ctx, &d, hook)) {
		ctx->user_ip4 = d.ip;
		ctx->user_port = d.port;
	}
}

/* managed_netns says whether a socket lives where this node's services
 * apply: the node's own network namespace or one of its pods'. The socket
 * hooks sit on the cgroup root and so see every process of the machine,
 * also those of namespaces another shunt node, another container runtime
 * or a test made; translating their connects would hand them services that
 * are not theirs. Before the agent wrote the node's namespace (cookie 0)
 * every namespace counts. */
static __always_inline bool managed_netns(struct bpf_sock_addr *ctx)
{
	__u32 zero = 0;
	struct accel_config *c = bpf_map_lookup_elem(&shunt_accel_config, &zero);
	__u64 netns;

	if (!c || !c->host_netns_cookie)
		return true;
	netns = bpf_get_netns_cookie(ctx);
	if (netns == c->host_netns_cookie || bpf_map_lookup_elem(&shunt_netns_pods, &netns))
		return true;
	count(SHUNT_REASON_SOCK_FOREIGN_NETNS, SHUNT_DIR_CONNECT, 0);
	return false;
}

/* connect of a protocol services do not have (ICMP, raw, SCTP) */
static __always_inline int pass_connect(void)
{
	count(SHUNT_REASON_SOCK_PASSED, SHUNT_DIR_CONNECT, 0);
	return SOCK_ALLOW;
}

SEC("cgroup/connect4")
int shunt_connect4(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return pass_connect();
	if (!managed_netns(ctx))
		return SOCK_ALLOW;
	return xlate4(ctx, ctx->protocol, SHUNT_DIR_CONNECT);
}

SEC("cgroup/sendmsg4")
int shunt_sendmsg4(struct bpf_sock_addr *ctx)
{
	if (!managed_netns(ctx))
		return SOCK_ALLOW;
	return xlate4(ctx, IPPROTO_UDP, SHUNT_DIR_SENDMSG);
}

SEC("cgroup/recvmsg4")
int shunt_recvmsg4(struct bpf_sock_addr *ctx)
{
	reverse4(ctx, SHUNT_DIR_RECVMSG);
	return SOCK_ALLOW;
}

SEC("cgroup/getpeername4")
int shunt_getpeername4(struct bpf_sock_addr *ctx)
{
	reverse4(ctx, SHUNT_DIR_GETPEERNAME);
	return SOCK_ALLOW;
}

/* Dual-stack IPv6 sockets talking to IPv4 services through v4-mapped
 * addresses (::ffff:a.b.c.d): what Go's net.ListenUDP("udp", nil) and many
 * servers use. Services themselves are IPv4 only for now. */

static __always_inline bool v4mapped(struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 &&
	       ctx->user_ip6[2] == bpf_htonl(0x0000ffff);
}

static __always_inline int xlate6(struct bpf_sock_addr *ctx, __u8 proto, __u32 hook)
{
	if (!v4mapped(ctx)) {
		count(SHUNT_REASON_SOCK_PASSED, hook, 0);
		return SOCK_ALLOW;
	}
	struct dest d = { .ip = ctx->user_ip6[3], .port = (__u16)ctx->user_port };
	int ret = hook == SHUNT_DIR_CONNECT ? connect_dest(ctx, &d) : translate(ctx, &d, proto, hook);

	ctx->user_ip6[3] = d.ip;
	ctx->user_port = d.port;
	return ret;
}

static __always_inline void reverse6(struct bpf_sock_addr *ctx, __u32 hook)
{
	if (!v4mapped(ctx)) {
		count(SHUNT_REASON_SOCK_PASSED, hook, 0);
		return;
	}
	struct dest d = { .ip = ctx->user_ip6[3], .port = (__u16)ctx->user_port };

	if (reverse(ctx, &d, hook)) {
		ctx->user_ip6[3] = d.ip;
		ctx->user_port = d.port;
	}
}

SEC("cgroup/connect6")
int shunt_connect6(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return pass_connect();
	if (!managed_netns(ctx))
		return SOCK_ALLOW;
	return xlate6(ctx, ctx->protocol, SHUNT_DIR_CONNECT);
}

SEC("cgroup/sendmsg6")
int shunt_sendmsg6(struct bpf_sock_addr *ctx)
{
	if (!managed_netns(ctx))
		return SOCK_ALLOW;
	return xlate6(ctx, IPPROTO_UDP, SHUNT_DIR_SENDMSG);
}

SEC("cgroup/recvmsg6")
int shunt_recvmsg6(struct bpf_sock_addr *ctx)
{
	reverse6(ctx, SHUNT_DIR_RECVMSG);
	return SOCK_ALLOW;
}

SEC("cgroup/getpeername6")
int shunt_getpeername6(struct bpf_sock_addr *ctx)
{
	reverse6(ctx, SHUNT_DIR_GETPEERNAME);
	return SOCK_ALLOW;
}
