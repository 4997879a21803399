/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Includes and small helpers every shunt program uses. */
#ifndef SHUNT_LIB_COMMON_H
#define SHUNT_LIB_COMMON_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "shunt.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#endif
