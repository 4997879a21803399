/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket acceleration maps: the sockhash of accelerated sockets, their
 * socket storage, the pods' network namespaces and the run-time switch. */
#ifndef SHUNT_LIB_ACCEL_H
#define SHUNT_LIB_ACCEL_H

#include "common.h"
#include "endpoints.h"

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

/* The network namespaces of this node's pods (cookie -> pod address):
 * loopback connections are accelerated only inside a pod's namespace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_netns_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct accel_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_accel_config SEC(".maps");

/* accel_config is the switch, or NULL when acceleration is off. */
static __always_inline const struct accel_config *accel_on(void)
{
	__u32 zero = 0;
	struct accel_config *c = bpf_map_lookup_elem(&shunt_accel_config, &zero);

	return c && c->enabled ? c : NULL;
}

static __always_inline bool is_loopback(__u32 ip)
{
	return (bpf_ntohl(ip) >> 24) == 127;
}

#endif
