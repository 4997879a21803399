/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Includes and small helpers every shunt program uses. */
#ifndef SHUNT_LIB_COMMON_H
#define SHUNT_LIB_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "net.h"

#include "shunt.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* C's bool without <stdbool.h>: the build uses no header from outside the
 * repository (-nostdinc), not even the compiler's own. */
typedef _Bool bool;
#define true 1
#define false 0

/* map_update and map_delete are bpf_map_update_elem and
 * bpf_map_delete_elem with the result read as an int, as every kernel
 * gives it. Before Linux 6.4 ("bpf: return long from bpf_map_ops funcs")
 * the verifier turns these helpers into direct calls of the map's own
 * operations, which returned int: an error reached the program as a
 * 64-bit register holding 0x00000000ffffffxx, a positive number, and a
 * failed insert compared as a long (< 0) passed for a success. Debian 12's
 * 6.1 gave -E2BIG as 4294967289, so a full table never refused a flow
 * there (TestTCInsertFailures in scripts/kernel-vm.sh). Read as an int it
 * is negative on every kernel. Every program writes and deletes through
 * these two (TestMapWritesReadAsInt). */
static __always_inline int map_update(void *map, const void *key, const void *value, __u64 flags)
{
	return (int)bpf_map_update_elem(map, key, value, flags);
}

static __always_inline int map_delete(void *map, const void *key)
{
	return (int)bpf_map_delete_elem(map, key);
}

#endif
