/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The per-socket record of a connect-time service translation (TCP and
 * connected UDP): written by the connect hooks (bpf/sock_addr.c), read by
 * recvmsg and getpeername there and by the socket iterator that destroys
 * sockets of gone backends (bpf/sock_destroy.c, which is given the pinned
 * map when it is loaded). Freed with the socket, so nothing to
 * garbage-collect. */
#ifndef SHUNT_LIB_SOCK_SVC_H
#define SHUNT_LIB_SOCK_SVC_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_translation);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_sock_svc SEC(".maps");

#endif
