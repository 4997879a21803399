// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Service load balancing at the socket layer. A connect() (or an unconnected
 * UDP sendmsg()) to a service VIP is rewritten to a backend before the kernel
 * routes it, so packets carry the backend address from the first one and no
 * per-packet NAT is left. recvmsg() and getpeername() translate the backend
 * back to the VIP, so applications (and resolvers checking reply sources)
 * see the address they used. Every decision is counted in shunt_metrics,
 * the tc programs' counters, with the hook as its direction.
 */
#include "lib/common.h"
#include "lib/services.h"
#include "lib/metrics.h"
#include "lib/flow_events.h"
#include "lib/proxy.h"
#include "lib/endpoints.h"
#include "lib/policy.h"
#include "lib/accel.h"

char __license[] SEC("license") = "Dual BSD/GPL";

volatile const struct shunt_config CONFIG = {};

/* Never read: puts the sockhash key into the object's BTF (a sockhash is
 * declared by sizes), so bpf2go generates it for the agent. */
const volatile struct sock_key _btf_sock_key = {};

/* Per-socket record of a connect-time translation (TCP and connected UDP):
 * freed with the socket, so nothing to garbage-collect. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_translation);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_sock_svc SEC(".maps");

/* The original destination of a socket redirected to a proxy: freed with
 * the socket. sockops files it under the connection's tuple. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct proxy_origin);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_sock_proxied SEC(".maps");

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
	struct flow_event e = {
		.cgroup_id = bpf_get_current_cgroup_id(), .daddr = be_ip, .dport = be_port,
		.orig_daddr = svc->ip, .orig_dport = svc->port, .proto = proto, .verdict = verdict,
		.reason = reason, .point = FLOW_POINT_SOCK, .event = FLOW_EV_SOCK,
	};
	flow_emit(&e);
}

/* translate picks the backend for a service destination. Returns
 * SOCK_REJECT, with the syscall's error set, for a service without backends
 * (ECONNREFUSED) and for a UDP destination whose replies could not be given
 * back the service address (ENOBUFS); *dst is changed only when it is
 * translated. Every outcome, and every record that could not be made, is
 * counted for the hook (SHUNT_DIR_CONNECT or SHUNT_DIR_SENDMSG). */
static __always_inline int translate(struct bpf_sock_addr *ctx, struct dest *dst, __u8 proto, __u32 hook)
{
	bool connect = hook == SHUNT_DIR_CONNECT;
	struct service_value *svc;
	struct backend_value *be;
	__u32 failed = 0; /* the last record that could not be made */

	svc = lookup_service(dst->ip, dst->port, proto);
	if (!svc) {
		count(SHUNT_REASON_SOCK_PASSED, hook, 0);
		return SOCK_ALLOW;
	}

	be = select_backend(svc, dst->ip, dst->port, proto, bpf_get_netns_cookie(ctx), &failed);
	if (!be) {
		/* Fail fast and say why: a timeout would hide the cause. */
		bpf_set_retval(-ECONNREFUSED);
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
		if (bpf_map_update_elem(&shunt_revnat, &key, &rev, BPF_ANY) < 0) {
			failed = SHUNT_REASON_REVNAT_INSERT_FAILED;
			count(failed, hook, 0);
			if (!recorded) {
				/* Replies would come back from the backend's
				 * address, which resolvers drop: fail now, and
				 * say why, rather than time out. */
				bpf_set_retval(-ENOBUFS);
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
 * fail closed, with ENOBUFS). */
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
		bpf_set_retval(-ENOBUFS);
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

/* L7 redirection, after the connect: sockops files a redirected socket's
 * original destination under its tuple as soon as the kernel has chosen
 * the source port (TCP_CONNECT_CB, before the SYN leaves), so tc knows the
 * connection to the proxy is one the hook made, and the proxy can ask. */
/* owner_netns finds the network namespace an address of this node lives
 * in: a pod's, or the node's own. False for any other address. */
static __always_inline bool owner_netns(const struct accel_config *c, __u32 ip, __u64 *cookie)
{
	struct endpoint_info *e = lookup_endpoint(ip);

	if (e) {
		*cookie = e->netns_cookie;
		return e->netns_cookie != 0;
	}
	if (identity_of(ip) == SHUNT_ID_HOST) {
		*cookie = c->host_netns_cookie;
		return true;
	}
	return false;
}

/* to_node_proxy says whether a connection is a client's to the node proxy
 * (sockops filed its origin under this tuple), seen from either end. */
static __always_inline bool to_node_proxy(__u32 client_ip, __u16 client_port, __u32 proxy_ip, __u16 proxy_port)
{
	struct proxy_origin_key k = {
		.client_ip = client_ip, .client_port = client_port, .proxy_ip = proxy_ip, .proxy_port = proxy_port,
	};
	return bpf_map_lookup_elem(&shunt_proxy_origins, &k) != NULL;
}

/* accel_ct_lookup: the conntrack entry of an accelerated connection's
 * packet that sockets, not tc, carry; a failed move to shunt_ct is counted
 * here, with the socket hooks. */
static __always_inline struct ct_value *accel_ct_lookup(struct flow *f)
{
	bool closing = false;
	__u32 failed = 0;
	struct ct_value *ct = ct_lookup(f, bpf_ktime_get_ns(), &closing, &failed);

	if (failed)
		count(failed, SHUNT_DIR_SOCKMSG, 0);
	return ct;
}

/* accel_peer fills in the peer socket's key, or says the connection is not
 * one to accelerate. Only sockets of this node's pods, of the node proxy
 * and (when configured) of the node's own processes take part, each in
 * the namespace its address belongs to. The connecting end decides (its
 * ESTABLISHED callback runs before it sends the handshake's last ACK); the
 * accepting end follows only when its peer is in the sockhash, so both
 * ends or neither are accelerated. A connection between two namespaces
 * must have passed tc: its conntrack entry exists (policy admitted it) and
 * is not closing. A loopback connection never passes tc, so no policy
 * applies to it, with or without acceleration. */
static __always_inline bool accel_peer(struct bpf_sock_ops *ctx, struct bpf_sock *sk, const struct accel_config *c,
				       __u64 netns, struct accel_sock *a)
{
	__u32 local = ctx->local_ip4, remote = ctx->remote_ip4;

	a->peer.local_ip = remote;
	a->peer.remote_ip = local;
	a->peer.local_port = (__u16)(ctx->remote_port >> 16);
	a->peer.remote_port = bpf_htons((__u16)ctx->local_port);
	if (is_loopback(local) && is_loopback(remote)) {
		if (netns == c->host_netns_cookie ? !c->node_processes : !bpf_map_lookup_elem(&shunt_netns_pods, &netns))
			return false;
		a->peer.netns_cookie = netns;
		a->flags |= ACCEL_SOCK_F_LOOPBACK;
		return true;
	}
	__u64 own;
	if (!owner_netns(c, local, &own) || !owner_netns(c, remote, &a->peer.netns_cookie))
		return false;
	if (own != netns) {
		count(SHUNT_REASON_ACCEL_FOREIGN_NETNS, SHUNT_DIR_SOCKMSG, 0);
		return false;
	}
	if (ctx->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
		/* Consumed: the marker is only the connecting end's word. */
		if (bpf_map_delete_elem(&shunt_accel_connecting, &a->peer) < 0)
			return false;
	} else if (!c->node_processes) {
		/* Of the node's namespace only the node proxy: its upstream
		 * connections carry its mark, clients' connections to it have
		 * their origin on file. */
		__u32 identity;
		if (netns == c->host_netns_cookie && !proxy_marked(&CONFIG, sk->mark, &identity))
			return false;
		if (a->peer.netns_cookie == c->host_netns_cookie &&
		    !to_node_proxy(local, a->peer.remote_port, remote, a->peer.local_port))
			return false;
	}
	struct flow f = {
		.saddr = local, .daddr = remote, .sport = a->peer.remote_port, .dport = a->peer.local_port,
		.proto = IPPROTO_TCP, .tcp_flags = SHUNT_TCPF_ACK, .has_ports = 1,
	};
	struct ct_value *ct = accel_ct_lookup(&f);
	return ct && !(ct->flags & (CT_F_RST | CT_F_FIN_A | CT_F_FIN_B));
}

/* accel_event reports an accelerated socket: its start (from the
 * connecting end, once per connection) and each end's close with what it
 * sent through the redirect. No cgroup: sockops often runs in softirq, for
 * whatever task is current; the addresses name the pods. */
static __always_inline void accel_event(struct bpf_sock_ops *ctx, const struct accel_sock *a, __u8 reason, __u8 event)
{
	if (!flow_wanted(flow_mode(), event))
		return;
	struct flow_event e = {
		.saddr = a->peer.remote_ip, .daddr = a->peer.local_ip, .sport = a->peer.remote_port,
		.dport = a->peer.local_port, .proto = IPPROTO_TCP, .verdict = FLOW_FORWARDED, .reason = reason,
		.point = FLOW_POINT_SOCK, .event = event, .len = (__u32)a->msgs, .bytes = a->bytes,
	};
	flow_emit(&e);
}

/* accelerate puts an established socket into the sockhash (see
 * accel_peer for which), with its peer's key in its socket storage, and
 * asks for state callbacks to report its end. */
static __always_inline void accelerate(struct bpf_sock_ops *ctx)
{
	const struct accel_config *c = accel_on();
	struct bpf_sock *sk = ctx->sk;

	/* IPv4, or a dual-stack socket talking IPv4 (v4-mapped), as Go and
	 * many servers listen on "::". */
	bool v4mapped = ctx->family == AF_INET6 && ctx->local_ip6[0] == 0 && ctx->local_ip6[1] == 0 &&
			ctx->local_ip6[2] == bpf_htonl(0x0000ffff);
	if (!c || !sk || (ctx->family != AF_INET && !v4mapped))
		return;
	__u64 netns = bpf_get_netns_cookie(ctx);
	struct accel_sock a = {};
	if (!accel_peer(ctx, sk, c, netns, &a))
		return;
	struct sock_key key = {
		.netns_cookie = netns, .local_ip = a.peer.remote_ip, .remote_ip = a.peer.local_ip,
		.local_port = a.peer.remote_port, .remote_port = a.peer.local_port,
	};
	a.started_ns = bpf_ktime_get_ns();
	if (ctx->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB)
		a.flags |= ACCEL_SOCK_F_ACTIVE;
	/* Storage first: sk_msg redirects only sockets that have it, so a
	 * socket in the map without its peer's key never exists. */
	if (!bpf_sk_storage_get(&shunt_accel_socks, sk, &a, BPF_SK_STORAGE_GET_F_CREATE) ||
	    bpf_sock_hash_update(ctx, &shunt_sockhash, &key, BPF_NOEXIST) < 0) {
		bpf_sk_storage_delete(&shunt_accel_socks, sk);
		count(SHUNT_REASON_ACCEL_INSERT_FAILED, SHUNT_DIR_SOCKMSG, 0);
		return;
	}
	bpf_sock_ops_cb_flags_set(ctx, ctx->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	count(SHUNT_REASON_ACCEL_ADDED, SHUNT_DIR_SOCKMSG, 0);
	if (a.flags & ACCEL_SOCK_F_ACTIVE) {
		__u8 yes = 1;
		/* Loopback ends decide alike on their own: no marker. */
		if (!(a.flags & ACCEL_SOCK_F_LOOPBACK))
			bpf_map_update_elem(&shunt_accel_connecting, &key, &yes, BPF_ANY);
		accel_event(ctx, &a, SHUNT_REASON_ACCEL_ADDED, FLOW_EV_SOCK);
	}
}

/* accel_closed reports an accelerated socket's end; the kernel has taken
 * it out of the sockhash (and frees its storage with it). */
static __always_inline void accel_closed(struct bpf_sock_ops *ctx)
{
	struct bpf_sock *sk = ctx->sk;

	if (!sk || ctx->args[1] != BPF_TCP_CLOSE)
		return;
	struct accel_sock *a = bpf_sk_storage_get(&shunt_accel_socks, sk, 0, 0);
	if (!a)
		return;
	count(SHUNT_REASON_ACCEL_ENDED, SHUNT_DIR_SOCKMSG, 0);
	accel_event(ctx, a, SHUNT_REASON_ACCEL_ENDED, FLOW_EV_CONN_END);
}

SEC("sockops")
int shunt_sockops(struct bpf_sock_ops *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct proxy_origin *o;

	if (ctx->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB || ctx->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
		accelerate(ctx);
		return 1;
	}
	if (ctx->op == BPF_SOCK_OPS_STATE_CB) {
		accel_closed(ctx);
		return 1;
	}
	if (ctx->op != BPF_SOCK_OPS_TCP_CONNECT_CB || !sk)
		return 1;
	o = bpf_sk_storage_get(&shunt_sock_proxied, sk, 0, 0);
	if (!o)
		return 1;
	struct proxy_origin_key key = {
		.client_ip = sk->src_ip4, .client_port = bpf_htons((__u16)sk->src_port),
		.proxy_ip = sk->dst_ip4, .proxy_port = (__u16)sk->dst_port,
	};
	if (bpf_map_update_elem(&shunt_proxy_origins, &key, o, BPF_ANY) < 0)
		count(SHUNT_REASON_PROXY_ORIGIN_FAILED, SHUNT_DIR_CONNECT, 0);
	return 1;
}

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
	/* Not ctx->retval = 0: clang merges the two adjacent 32-bit stores
	 * into one 64-bit store, which the verifier refuses. */
	bpf_set_retval(0);
	count(SHUNT_REASON_PROXY_ORIGIN_ANSWERED, SHUNT_DIR_GETSOCKOPT, 0);
	return 1;
}

/* Each send of an accelerated socket goes straight into the peer socket's
 * ingress queue when the peer is in the sockhash too; otherwise it takes
 * the stack (SK_PASS either way: a missing peer never drops data). The
 * connection's conntrack entry is kept fresh, as its packets would keep it
 * on the tc path, so a connection that falls back to it is still known. */
SEC("sk_msg")
int shunt_sk_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	struct accel_sock *a = sk ? bpf_sk_storage_get(&shunt_accel_socks, sk, 0, 0) : NULL;

	if (!a) {
		count(SHUNT_REASON_ACCEL_PASSED, SHUNT_DIR_SOCKMSG, msg->size);
		return SK_PASS;
	}
	if (!(a->flags & ACCEL_SOCK_F_LOOPBACK)) {
		struct flow f = {
			.saddr = a->peer.remote_ip, .daddr = a->peer.local_ip, .sport = a->peer.remote_port,
			.dport = a->peer.local_port, .proto = IPPROTO_TCP, .tcp_flags = SHUNT_TCPF_ACK, .has_ports = 1,
		};
		accel_ct_lookup(&f);
	}
	__u32 size = msg->size;
	struct sock_key peer = a->peer;
	if (bpf_msg_redirect_hash(msg, &shunt_sockhash, &peer, BPF_F_INGRESS) != SK_PASS) {
		count(SHUNT_REASON_ACCEL_PASSED, SHUNT_DIR_SOCKMSG, size);
		return SK_PASS;
	}
	/* Sends of one socket run under its lock: plain adds are exact. */
	a->bytes += size;
	a->msgs++;
	count(SHUNT_REASON_ACCEL_REDIRECTED, SHUNT_DIR_SOCKMSG, size);
	return SK_PASS;
}
