/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* L7 redirection: which destinations go to a proxy, the original
 * destinations of redirected connections, and the proxy's socket mark. */
#ifndef SHUNT_LIB_PROXY_H
#define SHUNT_LIB_PROXY_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct l7_redirect_key);
	__type(value, struct l7_redirect_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_l7_redirect SEC(".maps");

/* Filed by sockops before the SYN leaves, read by tc (is this connection
 * to the proxy one the hook sent there?) and by the proxy's getsockopt.
 * LRU: entries of closed connections age out; a full map evicts the
 * oldest, which are long established. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct proxy_origin_key);
	__type(value, struct proxy_origin);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_proxy_origins SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct identity_endpoint);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_identity_endpoints SEC(".maps");

/* proxy_marked says whether a mark is the proxy's, and the client
 * identity it carries. */
static __always_inline bool proxy_marked(const volatile struct shunt_config *cfg, __u32 mark, __u32 *identity)
{
	__u32 mask = cfg->proxy_mark_mask;

	if (!mask || (mark & mask) != cfg->proxy_mark_magic)
		return false;
	*identity = mark & ~mask;
	return true;
}

#endif
