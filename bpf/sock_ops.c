// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The sockops program, on the cgroup root with the socket address hooks:
 *  - socket acceleration: an established TCP socket between two local
 *    ends that policy admitted goes into shunt_sockhash (the connecting end
 *    decides, the accepting end follows), with its peer's key in its socket
 *    storage for the sk_msg program (bpf/sk_msg.c); its close is reported;
 *  - L7 redirection, after the connect: a socket the connect hook sent to a
 *    proxy (bpf/sock_addr.c) has its original destination filed under its
 *    tuple as soon as the kernel has chosen the source port
 *    (TCP_CONNECT_CB, before the SYN leaves), so tc knows the connection to
 *    the proxy is one the hook made, and the proxy can ask (bpf/sockopt.c);
 *  - with native routing, the node proxy's SYN to another node's pod
 *    carries its client's identity in a TCP option (lib/carried_identity.h).
 */
#include "lib/common.h"
#include "lib/lru.h"
#include "lib/metrics.h"
#include "lib/flow_events.h"
#include "lib/proxy.h"
#include "lib/endpoints.h"
#include "lib/policy.h"
#include "lib/accel.h"
#include "lib/accel_ct.h"
#include "lib/accel_peer.h"
#include "lib/sock_proxied.h"

char __license[] SEC("license") = "Dual BSD/GPL";

volatile const struct shunt_config CONFIG = {};

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
		if (map_delete(&shunt_accel_connecting, &a->peer) < 0)
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
	struct flow_event *e = flow_reserve();
	if (!e)
		return;
	e->saddr = a->peer.remote_ip, e->daddr = a->peer.local_ip, e->sport = a->peer.remote_port;
	e->dport = a->peer.local_port, e->proto = IPPROTO_TCP, e->verdict = FLOW_FORWARDED, e->reason = reason;
	e->point = FLOW_POINT_SOCK, e->event = event, e->len = (__u32)a->msgs, e->bytes = a->bytes;
	flow_submit(e);
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
	/* Storage and address first: sk_msg redirects only sockets that have
	 * storage, so a socket in the map without its peer's key never exists,
	 * and its peer's sends read its queue at the address (lib/accel_peer.h;
	 * storing a kernel address in a map takes CAP_PERFMON, as the agent
	 * has). */
	__u64 addr = (__u64)(unsigned long)sk;
	if (!bpf_sk_storage_get(&shunt_accel_socks, sk, &a, BPF_SK_STORAGE_GET_F_CREATE) ||
	    map_update(&shunt_accel_sk_addrs, &key, &addr, BPF_ANY) < 0 ||
	    bpf_sock_hash_update(ctx, &shunt_sockhash, &key, BPF_NOEXIST) < 0) {
		bpf_sk_storage_delete(&shunt_accel_socks, sk);
		map_delete(&shunt_accel_sk_addrs, &key);
		count(SHUNT_REASON_ACCEL_INSERT_FAILED, SHUNT_DIR_SOCKMSG, 0);
		return;
	}
	bpf_sock_ops_cb_flags_set(ctx, ctx->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	count(SHUNT_REASON_ACCEL_ADDED, SHUNT_DIR_SOCKMSG, 0);
	if (a.flags & ACCEL_SOCK_F_ACTIVE) {
		__u8 yes = 1;
		/* Loopback ends decide alike on their own: no marker. */
		if (!(a.flags & ACCEL_SOCK_F_LOOPBACK))
			lru_insert(&shunt_accel_connecting, &key, &yes, BPF_ANY);
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
	struct sock_key key = {
		.netns_cookie = bpf_get_netns_cookie(ctx), .local_ip = a->peer.remote_ip, .remote_ip = a->peer.local_ip,
		.local_port = a->peer.remote_port, .remote_port = a->peer.local_port,
	};
	map_delete(&shunt_accel_sk_addrs, &key);
	count(SHUNT_REASON_ACCEL_ENDED, SHUNT_DIR_SOCKMSG, 0);
	accel_event(ctx, a, SHUNT_REASON_ACCEL_ENDED, FLOW_EV_CONN_END);
}

/* identity_to_carry is the client identity the node proxy's socket sk
 * connects for, when its SYN must carry it (lib/carried_identity.h): with
 * native routing, to another node's pod, for a pod. 0 otherwise. */
static __always_inline __u32 identity_to_carry(struct bpf_sock_ops *ctx, struct bpf_sock *sk)
{
	__u32 identity;

	if (!CONFIG.native_ifindex || ctx->family != AF_INET || !proxy_marked(&CONFIG, sk->mark, &identity) ||
	    !pod_identity(identity) || lookup_endpoint(sk->dst_ip4))
		return 0;
	struct ipcache_value *v = ipcache_lookup(sk->dst_ip4);
	return v && v->tunnel_ip4 ? identity : 0;
}

/* carry_identity writes the option in the SYN of a socket connect_started
 * asked room for: the kernel calls back for the room (HDR_OPT_LEN_CB, also
 * when it computes the MSS, with no packet: nothing then, as only SYNs
 * carry it) and for the writing (WRITE_HDR_OPT_CB), for the SYN and its
 * retransmissions. */
static __always_inline void carry_identity(struct bpf_sock_ops *ctx)
{
	struct bpf_sock *sk = ctx->sk;

	if ((ctx->skb_tcp_flags & (SHUNT_TCPF_SYN | SHUNT_TCPF_ACK)) != SHUNT_TCPF_SYN || !sk)
		return;
	if (ctx->op == BPF_SOCK_OPS_HDR_OPT_LEN_CB) {
		bpf_reserve_hdr_opt(ctx, SHUNT_TCPOPT_IDENTITY_LEN, 0);
		return;
	}
	__u32 identity = identity_to_carry(ctx, sk);
	if (!identity)
		return;
	struct identity_tcp_option o = {
		.kind = SHUNT_TCPOPT_IDENTITY_KIND, .len = SHUNT_TCPOPT_IDENTITY_LEN,
		.exid = bpf_htons(SHUNT_TCPOPT_IDENTITY_EXID), .identity = bpf_htonl(identity),
	};
	/* A retransmitted SYN is written again; -EEXIST (another program of
	 * the cgroup tree wrote it first) is fine. */
	if (bpf_store_hdr_opt(ctx, &o, sizeof(o), 0) == 0)
		count(SHUNT_REASON_IDENTITY_CARRIED, SHUNT_DIR_CONNECT, 0);
}

/* carry_identity_flag sets (connecting) or clears (established) the
 * callbacks carry_identity runs in, for a socket whose SYN carries its
 * client's identity: only the SYN needs them, and each costs a call per
 * packet sent. */
static __always_inline void carry_identity_flag(struct bpf_sock_ops *ctx, bool on)
{
	__u32 flags = ctx->bpf_sock_ops_cb_flags;

	if (on)
		bpf_sock_ops_cb_flags_set(ctx, flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
	else if (flags & BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG)
		bpf_sock_ops_cb_flags_set(ctx, flags & ~BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
}

SEC("sockops")
int shunt_sockops(struct bpf_sock_ops *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct proxy_origin *o;

	if (ctx->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB || ctx->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
		if (ctx->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB)
			carry_identity_flag(ctx, false);
		accelerate(ctx);
		return 1;
	}
	if (ctx->op == BPF_SOCK_OPS_STATE_CB) {
		accel_closed(ctx);
		return 1;
	}
	if (ctx->op == BPF_SOCK_OPS_HDR_OPT_LEN_CB || ctx->op == BPF_SOCK_OPS_WRITE_HDR_OPT_CB) {
		carry_identity(ctx);
		return 1;
	}
	if (ctx->op != BPF_SOCK_OPS_TCP_CONNECT_CB || !sk)
		return 1;
	if (identity_to_carry(ctx, sk))
		carry_identity_flag(ctx, true);
	o = bpf_sk_storage_get(&shunt_sock_proxied, sk, 0, 0);
	if (!o)
		return 1;
	struct proxy_origin_key key = {
		.client_ip = sk->src_ip4, .client_port = bpf_htons((__u16)sk->src_port),
		.proxy_ip = sk->dst_ip4, .proxy_port = (__u16)sk->dst_port,
	};
	if (lru_insert(&shunt_proxy_origins, &key, o, BPF_ANY) < 0)
		count(SHUNT_REASON_PROXY_ORIGIN_FAILED, SHUNT_DIR_CONNECT, 0);
	return 1;
}
