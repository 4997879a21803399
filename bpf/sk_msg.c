// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The sk_msg program of socket acceleration, attached to shunt_sockhash:
 * every send of a socket sockops accelerated (bpf/sock_ops.c) goes straight
 * into its peer's receive queue, skipping the TCP/IP stack.
 */
#include "lib/common.h"
#include "lib/metrics.h"
#include "lib/flow_tuple.h"
#include "lib/accel.h"
#include "lib/accel_ct.h"
#include "lib/accel_peer.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Each send of an accelerated socket goes straight into the peer socket's
 * ingress queue when the peer is in the sockhash too and its queue has
 * room; otherwise it takes the stack (SK_PASS either way: a missing peer
 * never drops data), and once the peer's queue was full, every later send
 * of the socket does (lib/accel_peer.h: the stack holds the writer back,
 * a redirect cannot). The
 * connection's conntrack entry is kept fresh, as its packets would keep it
 * on the tc path, so a connection that falls back to it is still known. */
/* A socket on the stack for good has nothing left to decide: its SK_PASS
 * verdict holds for this many bytes of sends without running the program
 * again (bpf_msg_apply_bytes; then it runs once and says the same). */
#define ACCEL_PASS_BYTES 0xffffffffu

SEC("sk_msg")
int shunt_sk_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	struct accel_sock *a = sk ? bpf_sk_storage_get(&shunt_accel_socks, sk, 0, 0) : NULL;

	if (!a) {
		count(SHUNT_REASON_ACCEL_PASSED, SHUNT_DIR_SOCKMSG, msg->size);
		return SK_PASS;
	}
	/* On the stack for good: tc keeps its conntrack entry fresh now. */
	if (a->flags & (ACCEL_SOCK_F_CONGESTED | ACCEL_SOCK_F_UNTRACKED)) {
		bpf_msg_apply_bytes(msg, ACCEL_PASS_BYTES);
		return SK_PASS;
	}
	/* A connection whose entry is gone (`shunt map flush conntrack`, an
	 * eviction, expiry while idle) takes the stack, where tc judges its
	 * next packet as it judges any connection's whose entry was lost:
	 * admitted again (its own way or as an answer) or refused. Redirecting
	 * on would keep a connection policy now refuses out of every check. */
	if (!(a->flags & ACCEL_SOCK_F_LOOPBACK)) {
		struct flow f = {
			.saddr = a->peer.remote_ip, .daddr = a->peer.local_ip, .sport = a->peer.remote_port,
			.dport = a->peer.local_port, .proto = IPPROTO_TCP, .tcp_flags = SHUNT_TCPF_ACK, .has_ports = 1,
		};
		if (!accel_ct_lookup(&f)) {
			a->flags |= ACCEL_SOCK_F_UNTRACKED;
			count(SHUNT_REASON_ACCEL_UNTRACKED, SHUNT_DIR_SOCKMSG, msg->size);
			bpf_msg_apply_bytes(msg, ACCEL_PASS_BYTES);
			return SK_PASS;
		}
	}
	__u32 size = msg->size;
	struct sock_key peer = a->peer;
	if (accel_peer_full(&peer, size)) {
		a->flags |= ACCEL_SOCK_F_CONGESTED;
		count(SHUNT_REASON_ACCEL_CONGESTED, SHUNT_DIR_SOCKMSG, size);
		bpf_msg_apply_bytes(msg, ACCEL_PASS_BYTES);
		return SK_PASS;
	}
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
