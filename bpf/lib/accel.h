/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket acceleration maps: the sockhash of accelerated sockets, their
 * socket storage and the connecting ends' markers; the run-time switch and
 * the pods' network namespaces are in accel_config.h. */
#ifndef SHUNT_LIB_ACCEL_H
#define SHUNT_LIB_ACCEL_H

#include "common.h"
#include "accel_config.h"

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(key_size, sizeof(struct sock_key));
	__uint(value_size, sizeof(__u64));
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_sockhash SEC(".maps");

/* Connecting ends just accelerated, by their key: the accepting end, whose
 * ESTABLISHED callback comes next, joins only when its peer did (sockops
 * cannot look sockets up in the sockhash). LRU: a marker whose accepting
 * end never came ages out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_accel_connecting SEC(".maps");

/* Freed with the socket, like its sockhash entry. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct accel_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_accel_socks SEC(".maps");

static __always_inline bool is_loopback(__u32 ip)
{
	return (bpf_ntohl(ip) >> 24) == 127;
}

#endif
