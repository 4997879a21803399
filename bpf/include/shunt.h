/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map key/value struct, the load-time configuration and the drop/verdict
 * reasons shared between the BPF programs and the Go agent. This header is the
 * single definition: bpf2go generates the Go types from it (-type flags in
 * internal/datapath/generate.go), so never hand-copy a layout into Go.
 */
#ifndef SHUNT_H
#define SHUNT_H

#include <linux/types.h>

/* Forwarding modes chosen when the lab node is created. "bridge" and
 * "routed" attach no BPF program at all; they exist as baselines. */
enum shunt_fwd_mode {
	SHUNT_FWD_REDIRECT_PEER = 0, /* bpf_redirect_peer: straight into the peer netns */
	SHUNT_FWD_REDIRECT = 1,      /* bpf_redirect: out of the host veth, via the peer's backlog */
};

/* Load-time configuration, set from Go with spec.Variables before loading so
 * the verifier prunes the branches a mode does not use. */
struct shunt_config {
	enum shunt_fwd_mode fwd_mode;
	__u32 pad;
};

/* A local pod endpoint, keyed by its IPv4 address (network byte order). */
struct endpoint_key {
	__u32 ip4;
};

struct endpoint_info {
	__u32 ifindex;     /* host-side veth of the pod */
	__u32 flags;       /* reserved */
	__u8 pod_mac[6];   /* MAC of the pod's eth0 */
	__u8 node_mac[6];  /* MAC of the host-side veth (the pod's gateway) */
};

/* Why a packet took the path it did. Counted per (reason, direction) and
 * printed by name by the CLI (internal/datapath/reasons.go mirrors the names). */
enum shunt_reason {
	SHUNT_REASON_FORWARDED = 0,       /* redirected to a local pod */
	SHUNT_REASON_TO_STACK = 1,        /* handed to the host stack (not a local pod) */
	SHUNT_REASON_NOT_IPV4 = 2,        /* passed: ARP, IPv6, ... */
	SHUNT_REASON_INVALID_PACKET = 3,  /* dropped: truncated or malformed header */
	SHUNT_REASON_TTL_EXCEEDED = 4,    /* passed to the stack so it can answer ICMP */
	SHUNT_REASON_REDIRECT_FAILED = 5, /* dropped: redirect helper returned an error */
	SHUNT_REASON_MAX,
};

enum shunt_direction {
	SHUNT_DIR_FROM_POD = 0,
	SHUNT_DIR_TO_POD = 1,
	SHUNT_DIR_MAX,
};

/* shunt_metrics is a per-CPU array indexed by reason * SHUNT_DIR_MAX + direction. */
struct metrics_value {
	__u64 packets;
	__u64 bytes;
};

#endif /* SHUNT_H */
