/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The original destination of a socket the connect hook redirected to a
 * proxy (bpf/sock_addr.c); sockops files it under the connection's tuple in
 * shunt_proxy_origins once the source port is chosen (bpf/sock_ops.c).
 * Freed with the socket. */
#ifndef SHUNT_LIB_SOCK_PROXIED_H
#define SHUNT_LIB_SOCK_PROXIED_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct proxy_origin);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_sock_proxied SEC(".maps");

#endif
