/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service maps and backend selection, shared by the socket hooks (and the tc
 * fallback later). Selection logic lives in inline helpers so it can be
 * exercised by a test-runnable program: the kernel cannot test-run
 * cgroup/connect programs. */
#ifndef SHUNT_LIB_SERVICES_H
#define SHUNT_LIB_SERVICES_H

#include "common.h"
#include "lru.h"

#define SHUNT_MAX_SERVICE_ENTRIES 262144

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct service_key);
	__type(value, struct service_value);
	__uint(max_entries, SHUNT_MAX_SERVICE_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct backend_value);
	__uint(max_entries, SHUNT_MAX_SERVICE_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct affinity_key);
	__type(value, struct affinity_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct revnat_key);
	__type(value, struct revnat_value);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shunt_revnat SEC(".maps");

static __always_inline struct service_value *
lookup_service(__u32 vip, __u16 port, __u8 proto)
{
	struct service_key key = { .vip = vip, .port = port, .proto = proto };

	return bpf_map_lookup_elem(&shunt_services, &key);
}

/* select_backend picks the backend for a new connection (or datagram):
 * the affinity entry while it is fresh and its backend still active, else a
 * random active slot. Returns NULL when the service has no backends. When
 * the affinity entry of a new choice cannot be recorded, the backend is
 * still returned and *failed says why (the caller counts it); it is left
 * alone otherwise. */
static __always_inline struct backend_value *
select_backend(struct service_value *svc, __u32 vip, __u16 port, __u8 proto,
	       __u64 client_cookie, __u32 client_kind, __u32 *failed)
{
	struct service_key key = { .vip = vip, .port = port, .proto = proto };
	struct affinity_key akey = {};
	struct affinity_value *aff = 0;
	struct service_value *slot;
	struct backend_value *be;
	__u64 now = 0;
	__u32 id;

	if (svc->backend_count == 0)
		return 0;

	if (svc->flags & SERVICE_F_AFFINITY) {
		akey.client_cookie = client_cookie;
		akey.client_kind = client_kind;
		akey.service_id = svc->id;
		now = bpf_ktime_get_ns();
		aff = bpf_map_lookup_elem(&shunt_affinity, &akey);
		if (aff && now - aff->last_used_ns <= (__u64)svc->affinity_timeout * 1000000000ULL) {
			be = bpf_map_lookup_elem(&shunt_backends, &aff->backend_id);
			if (be) {
				aff->last_used_ns = now;
				return be;
			}
		}
	}

	key.slot = (bpf_get_prandom_u32() % svc->backend_count) + 1;
	slot = bpf_map_lookup_elem(&shunt_services, &key);
	if (!slot)
		return 0;
	id = slot->id;
	be = bpf_map_lookup_elem(&shunt_backends, &id);
	if (!be)
		return 0;

	if (svc->flags & SERVICE_F_AFFINITY) {
		struct affinity_value val = { .last_used_ns = now, .backend_id = id };

		if (lru_insert(&shunt_affinity, &akey, &val, BPF_ANY) < 0)
			*failed = SHUNT_REASON_AFFINITY_INSERT_FAILED;
	}
	return be;
}

#endif
