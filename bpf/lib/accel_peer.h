/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Backpressure for socket acceleration (issue 31).
 *
 * sk_msg redirects a send into the peer socket's ingress queue with
 * BPF_F_INGRESS (bpf/sk_msg.c). Nothing on that path holds a writer back:
 * tcp_bpf_sendmsg (net/ipv4/tcp_bpf.c) waits only while the sender's own
 * sk_wmem_queued exceeds its sk_sndbuf, and a redirected send never adds
 * to it (sk_msg_alloc charges the sender's forward allocation, given back
 * before the redirect); bpf_tcp_ingress then charges the receiver
 * (sk_wmem_schedule, sk_mem_charge) and queues the message on its psock's
 * ingress_msg list, with no receive-buffer or window check. So a writer
 * faster than its reader fills the reader's queue without bound, until the
 * charge fails (TCP's hard memory limit, tcp_mem[2], or the receiver's
 * memory cgroup): bpf_tcp_ingress returns -ENOMEM, and tcp_bpf_sendmsg
 * gives it to the writer instead of waiting.
 *
 * So before each redirect, sk_msg reads how much the peer has not read yet
 * (its psock's msg_tot_len, kept by sk_psock_queue_msg and sk_msg_recvmsg)
 * against a limit: the peer's receive buffer, but at least
 * ACCEL_QUEUE_FLOOR. Once the queue is full, the socket's
 * sends take the TCP stack from then on (SK_PASS): there the sender's
 * buffer and the peer's window hold the writer back (it blocks, or gets
 * EAGAIN), and its bytes still arrive in order: the peer's
 * tcp_bpf_recvmsg empties ingress_msg (the older, redirected bytes) before
 * it reads sk_receive_queue, and nothing is redirected after. The socket
 * never switches back: data still in flight on the stack could be
 * overtaken, and a reader waiting inside tcp_recvmsg for more (MSG_WAITALL,
 * SO_RCVLOWAT) would not see a message put on ingress_msg.
 *
 * sk_msg programs cannot look a socket up in the sockhash (no
 * bpf_sk_release for them), so sockops files each accelerated socket's
 * address under its key (shunt_accel_sk_addrs) when it joins, and sk_msg
 * reads its peer's fields with bpf_probe_read_kernel at offsets the loader
 * relocates against the kernel's BTF (CO-RE). A TCP socket's memory is
 * SLAB_TYPESAFE_BY_RCU and a psock is freed after an RCU grace period,
 * and the sk_msg program runs under rcu_read_lock: a read that races the
 * peer's close sees a socket's fields, never faults, and at worst sends one
 * connection to the stack early.
 */
#ifndef SHUNT_LIB_ACCEL_PEER_H
#define SHUNT_LIB_ACCEL_PEER_H

#include "common.h"

/* Each accelerated socket's kernel address, by its sockhash key; the same
 * size as the sockhash, and an entry leaves with its socket's sockhash
 * entry (sockops, at close). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct sock_key);
	__type(value, __u64);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_accel_sk_addrs SEC(".maps");

/* The fields read, by name: the loader finds their offsets in the running
 * kernel's BTF (the ___shunt suffix is dropped when matching). */
struct sock___shunt {
	int sk_rcvbuf;
	void *sk_user_data;
} __attribute__((preserve_access_index));

struct sk_psock___shunt {
	__u32 msg_tot_len;
} __attribute__((preserve_access_index));

/* A redirected socket's receive buffer stays where it started (128 KiB,
 * tcp_rmem[1]): the stack's autotuning never sees its traffic. A reader
 * that is merely descheduled for a moment falls 128 KiB behind a fast
 * writer at once, and the switch to the stack is for good; so the limit is
 * at least 4 MiB, the most a writer's own send buffer holds on the stack
 * by default (tcp_wmem[2]): what a connection may queue per direction on
 * either path is of the same order. */
#define ACCEL_QUEUE_FLOOR (4u << 20)

/* sk_user_data keeps flags in its low bits (SK_USER_DATA_PTRMASK). */
#define ACCEL_SK_USER_DATA_PTRMASK (~(__u64)7)

/* accel_peer_full says whether the peer socket's unread redirected bytes
 * and this send together exceed the peer's receive buffer (or
 * ACCEL_QUEUE_FLOOR when that is larger). False when the
 * peer cannot be read (no address on file, or it is closing): the
 * redirect itself then finds no peer and the send takes the stack. */
static __always_inline bool accel_peer_full(const struct sock_key *peer, __u32 size)
{
	__u64 *addr = bpf_map_lookup_elem(&shunt_accel_sk_addrs, peer);

	if (!addr)
		return false;
	struct sock___shunt *sk = (struct sock___shunt *)(unsigned long)*addr;
	__u64 psock = 0;
	int rcvbuf = 0;
	if (bpf_probe_read_kernel(&psock, sizeof(psock), &sk->sk_user_data) < 0 ||
	    bpf_probe_read_kernel(&rcvbuf, sizeof(rcvbuf), &sk->sk_rcvbuf) < 0)
		return false;
	psock &= ACCEL_SK_USER_DATA_PTRMASK;
	if (!psock)
		return false;
	struct sk_psock___shunt *ps = (struct sk_psock___shunt *)(unsigned long)psock;
	/* A kernel whose psock does not count its queue (msg_tot_len, which
	 * 6.18 has; not checked for every kernel since 5.15) gets no
	 * backpressure: the redirect then behaves as before issue 31. The
	 * loader resolves this to a constant (CO-RE field existence). */
	if (!__builtin_preserve_field_info(ps->msg_tot_len, 2 /* BPF_FIELD_EXISTS */))
		return false;
	__u32 queued = 0;
	if (bpf_probe_read_kernel(&queued, sizeof(queued), &ps->msg_tot_len) < 0)
		return false;
	__u64 limit = rcvbuf > (int)ACCEL_QUEUE_FLOOR ? (__u64)rcvbuf : ACCEL_QUEUE_FLOOR;
	return (__u64)queued + size > limit;
}

#endif
