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

#endif
