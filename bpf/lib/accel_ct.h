/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The conntrack entry of an accelerated connection, whose packets sockets
 * carry instead of tc: sockops accelerates only a connection tc admitted
 * (bpf/sock_ops.c), sk_msg keeps its entry fresh on every send
 * (bpf/sk_msg.c), so a connection that falls back to the stack is still
 * known. */
#ifndef SHUNT_LIB_ACCEL_CT_H
#define SHUNT_LIB_ACCEL_CT_H

#include "common.h"
#include "metrics.h"
#include "flow_tuple.h"
#include "conntrack.h"

/* accel_ct_lookup: the conntrack entry of an accelerated connection's
 * packet that sockets, not tc, carry; a failed move to shunt_ct is counted
 * here, with the socket hooks. */
static __always_inline struct ct_value *accel_ct_lookup(struct flow *f)
{
	bool closing = false;
	__u32 failed = 0;
	struct ct_value *ct = ct_lookup(f, ct_now(), &closing, &failed);

	if (failed)
		count(failed, SHUNT_DIR_SOCKMSG, 0);
	return ct;
}

#endif
