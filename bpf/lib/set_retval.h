/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Whether the cgroup hooks may call bpf_set_retval (Linux 5.18+). Set from
 * Go before the object is loaded (datapath.Config.Fallbacks, fallback
 * no-set-retval): a constant in .rodata, whose value the verifier knows, so
 * it never walks the branch not taken, and a kernel that does not know the
 * helper accepts the object all the same. */
#ifndef SHUNT_LIB_SET_RETVAL_H
#define SHUNT_LIB_SET_RETVAL_H

#include "common.h"

volatile const __u32 NO_SET_RETVAL = 0;

/* set_refusal gives the error a refused syscall fails with. Without
 * bpf_set_retval the kernel hears only the hook's 0, and the caller gets
 * EPERM. */
static __always_inline void set_refusal(int err)
{
	if (!NO_SET_RETVAL)
		bpf_set_retval(err);
}

#endif
